//! The embedded `world` model: the pipeline folder under `models/world/` compiled into
//! the engine (so the command line and the Python wheel carry it alike), written once to
//! a cache folder and then loaded like any other diffusers folder (the same loader as
//! every checkpoint). The ~20 MB are linked only into programs that call [`resolve`].

use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};
use headroom_model::ModelError;

/// The built-in name of the trained world model.
pub const WORLD: &str = "world";

/// The folder's files: relative path and bytes.
const FILES: [(&str, &[u8]); 6] = [
    (
        "transformer/config.json",
        include_bytes!("../../../models/world/transformer/config.json"),
    ),
    (
        "transformer/diffusion_pytorch_model.safetensors",
        include_bytes!("../../../models/world/transformer/diffusion_pytorch_model.safetensors"),
    ),
    (
        "vae/config.json",
        include_bytes!("../../../models/world/vae/config.json"),
    ),
    (
        "vae/diffusion_pytorch_model.safetensors",
        include_bytes!("../../../models/world/vae/diffusion_pytorch_model.safetensors"),
    ),
    (
        "first_frame.png",
        include_bytes!("../../../models/world/first_frame.png"),
    ),
    (
        "tiny_decoder.safetensors",
        include_bytes!("../../../models/world/tiny_decoder.safetensors"),
    ),
];

/// `--model` as the engine takes it: `world` becomes the folder of the embedded model
/// (written on first use); anything else is passed through.
pub fn resolve(model: &str) -> Result<String> {
    if model != WORLD {
        if crate::model_source::names_nothing(model) {
            return Err(EngineError::request(
                "model",
                format!(
                    "unknown model {model:?}; built-in models are {WORLD} (the default), {}, or give a model folder",
                    crate::PRESETS.join(", ")
                ),
            ));
        }
        return Ok(model.to_string());
    }
    let dir = materialise(&cache_root())?;
    Ok(dir.to_string_lossy().into_owned())
}

/// Where extracted models live: `$HEADROOM_CACHE`, else `$XDG_CACHE_HOME/headroom`, else
/// `~/.cache/headroom`, else the temporary folder.
fn cache_root() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HEADROOM_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("headroom")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("headroom")))
        .unwrap_or_else(|| std::env::temp_dir().join("headroom"))
}

/// FNV-1a over every file's name and bytes: names the extracted folder, so a binary
/// with other weights never reads a stale copy.
fn fingerprint() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, bytes) in FILES {
        for &b in name.as_bytes().iter().chain(bytes) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Writes the folder under `root` unless a complete copy is there; returns its path.
/// The copy is written beside and renamed into place, so a reader never sees half.
fn materialise(root: &Path) -> Result<PathBuf> {
    // Hashing the ~20 MB of weights is the costly part: once per call.
    let print = fingerprint();
    let dir = root.join(format!("world-{print:016x}"));
    let complete = |d: &Path| {
        FILES.iter().all(|(name, bytes)| {
            std::fs::metadata(d.join(name)).is_ok_and(|m| m.len() == bytes.len() as u64)
        })
    };
    if complete(&dir) {
        return Ok(dir);
    }
    let tmp = root.join(format!(".world-{}-{print:016x}", std::process::id()));
    let write = || -> std::io::Result<()> {
        for (name, bytes) in FILES {
            let path = tmp.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, bytes)?;
        }
        Ok(())
    };
    write().map_err(|e| {
        EngineError::Model(ModelError::Io {
            path: tmp.display().to_string(),
            reason: format!(
                "writing the built-in world model: {e} (set HEADROOM_CACHE to a writable folder)"
            ),
        })
    })?;
    if dir.exists() {
        // An incomplete copy (an interrupted write of an older layout): replace it.
        let _ = std::fs::remove_dir_all(&dir);
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another process put a copy in place first.
        let _ = std::fs::remove_dir_all(&tmp);
        if !complete(&dir) {
            return Err(EngineError::Model(ModelError::Io {
                path: dir.display().to_string(),
                reason: "could not put the built-in world model there".to_string(),
            }));
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_world_folder_is_written_once_and_reused() {
        let root = tempfile::tempdir().unwrap();
        let a = materialise(root.path()).unwrap();
        let modified = std::fs::metadata(a.join(FILES[1].0))
            .unwrap()
            .modified()
            .unwrap();
        let b = materialise(root.path()).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            std::fs::metadata(b.join(FILES[1].0))
                .unwrap()
                .modified()
                .unwrap(),
            modified
        );
        for (name, bytes) in FILES {
            assert_eq!(std::fs::read(a.join(name)).unwrap(), bytes, "{name}");
        }
        // A truncated copy is replaced.
        std::fs::write(a.join(FILES[3].0), b"x").unwrap();
        let c = materialise(root.path()).unwrap();
        assert_eq!(std::fs::read(c.join(FILES[3].0)).unwrap(), FILES[3].1);
    }
}
