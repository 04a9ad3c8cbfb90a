//! What a snapshot was made on, and whether this engine is the same: the architecture,
//! the weights, their dtype and format, the decoder, the KV window and the mesh must
//! match for the resumed chunks to be the bytes of the uninterrupted session; the
//! thread count and CPU path are recorded for people (they change the bytes too, as
//! every run's do, but a session may move to another machine on purpose).
//!
//! The weights' fingerprint is computed once per engine, on the first snapshot or
//! resume: a built-in model's is its name and seed; a checkpoint's is a SHA-256 over
//! every file of the model folder, the `--transformer` checkpoint and the tiny decoder
//! file, by relative path and size, each file hashed whole up to [`WHOLE_FILE_BYTES`]
//! and past that its first and last MiB and [`SAMPLES`] evenly spaced 64 KiB windows
//! (a fine-tune differs in every window; a full read of a 28 GB checkpoint at every
//! start would not be paid for).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::EngineConfig;
use crate::error::{EngineError, Result, SnapshotFault};
use crate::model_source::ModelSource;

/// Files up to this size are hashed whole.
pub const WHOLE_FILE_BYTES: u64 = 64 << 20;
/// Windows sampled from a larger file.
pub const SAMPLES: u64 = 32;

/// The mesh a snapshot's rank ran in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshPlace {
    /// Tensor-parallel degree.
    pub tp: usize,
    /// Sequence-parallel degree.
    pub sp: usize,
    /// This shard's world rank.
    pub rank: usize,
}

/// What a snapshot was made on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    /// The snapshot format version.
    pub format_version: u32,
    /// `--model` as given (for people: a folder may sit at another path elsewhere).
    pub model: String,
    /// SHA-256 (16 hex digits) of the transformer's and VAE's configs.
    pub architecture: String,
    /// The weights' fingerprint (module docs).
    pub weights: String,
    /// Weight dtype.
    pub dtype: String,
    /// How the DiT's linears are held (`native`, `fp8`, `int8`).
    pub weight_format: String,
    /// The session's decoder (`full` or `tiny`).
    pub decoder: String,
    /// Video width.
    pub width: usize,
    /// Video height.
    pub height: usize,
    /// KV sink frames.
    pub sink_frames: usize,
    /// KV window frames.
    pub window_frames: usize,
    /// The mesh and this shard's rank.
    pub mesh: MeshPlace,
    /// Worker threads (recorded, not compared).
    pub threads: usize,
    /// The CPU kernel path (recorded, not compared).
    pub cpu_path: String,
}

impl Identity {
    /// What differs between a snapshot made on `self` and an engine that would resume
    /// it as `here`, one phrase per field; empty when it may resume.
    pub fn differences(&self, here: &Identity) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |name: &str, was: String, is: String| {
            if was != is {
                out.push(format!("{name}: snapshot {was}, here {is}"));
            }
        };
        cmp(
            "format version",
            self.format_version.to_string(),
            here.format_version.to_string(),
        );
        cmp(
            "model architecture",
            format!("{} ({})", self.architecture, self.model),
            format!("{} ({})", here.architecture, here.model),
        );
        cmp("weights", self.weights.clone(), here.weights.clone());
        cmp("dtype", self.dtype.clone(), here.dtype.clone());
        cmp(
            "weight format",
            self.weight_format.clone(),
            here.weight_format.clone(),
        );
        cmp("decoder", self.decoder.clone(), here.decoder.clone());
        cmp(
            "size",
            format!("{}x{}", self.width, self.height),
            format!("{}x{}", here.width, here.height),
        );
        cmp(
            "kv window",
            format!("sink {} window {}", self.sink_frames, self.window_frames),
            format!("sink {} window {}", here.sink_frames, here.window_frames),
        );
        cmp(
            "mesh",
            format!(
                "tp {} sp {} rank {}",
                self.mesh.tp, self.mesh.sp, self.mesh.rank
            ),
            format!(
                "tp {} sp {} rank {}",
                here.mesh.tp, here.mesh.sp, here.mesh.rank
            ),
        );
        out
    }

    /// Refuses to resume a snapshot made on `self` on `here`, naming what differs.
    pub fn check(&self, here: &Identity) -> Result<()> {
        let diff = self.differences(here);
        if diff.is_empty() {
            return Ok(());
        }
        Err(EngineError::snapshot(
            SnapshotFault::Mismatch,
            format!(
                "made on another setup than this engine's: {}",
                diff.join("; ")
            ),
        ))
    }
}

/// An engine's side of an [`Identity`]: fixed at load, the weights' fingerprint
/// computed on first use.
#[derive(Debug)]
pub(crate) struct EngineIdentity {
    config: EngineConfig,
    architecture: String,
    mesh: MeshPlace,
    weights: OnceLock<std::result::Result<String, String>>,
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl EngineIdentity {
    /// The identity of an engine of `config` whose networks' configs print as
    /// `architecture`, at `mesh`.
    pub(crate) fn new(config: &EngineConfig, architecture: &str, mesh: MeshPlace) -> Self {
        Self {
            config: config.clone(),
            architecture: hex(&Sha256::digest(architecture.as_bytes()))[..16].to_string(),
            mesh,
            weights: OnceLock::new(),
        }
    }

    /// The identity of a session of `width × height` decoding with `decoder`.
    pub(crate) fn of_session(
        &self,
        width: usize,
        height: usize,
        decoder: &str,
    ) -> Result<Identity> {
        let weights = self
            .weights
            .get_or_init(|| weights_fingerprint(&self.config).map_err(|e| e.to_string()))
            .clone()
            .map_err(|e| EngineError::snapshot(SnapshotFault::Io, e))?;
        let c = &self.config;
        Ok(Identity {
            format_version: super::format::FORMAT_VERSION,
            model: c.model.clone(),
            architecture: self.architecture.clone(),
            weights,
            dtype: c.weight_dtype.to_string(),
            weight_format: c.weights.to_string(),
            decoder: decoder.to_string(),
            width,
            height,
            sink_frames: c.sink_frames,
            window_frames: c.window_frames,
            mesh: self.mesh,
            threads: headroom_tensor::parallel::num_threads(),
            cpu_path: headroom_tensor::kernels::cpu::selected().to_string(),
        })
    }
}

/// Every regular file under `root` (itself, when it is a file), by path relative to it,
/// sorted.
fn files_under(root: &Path) -> Result<Vec<(String, PathBuf)>> {
    let io = |e: std::io::Error| {
        EngineError::snapshot(SnapshotFault::Io, format!("{}: {e}", root.display()))
    };
    if root.is_file() {
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        return Ok(vec![(name, root.to_path_buf())]);
    }
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.is_file() {
                let rel = path
                    .strip_prefix(root)
                    .unwrap_or(&path)
                    .to_string_lossy()
                    .to_string();
                out.push((rel, path));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Feeds `path`'s size and content (whole, or sampled past [`WHOLE_FILE_BYTES`]).
fn hash_file(h: &mut Sha256, path: &Path) -> std::io::Result<()> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    h.update(len.to_le_bytes());
    if len <= WHOLE_FILE_BYTES {
        let mut buf = Vec::with_capacity(len as usize);
        file.read_to_end(&mut buf)?;
        h.update(&buf);
        return Ok(());
    }
    let mut window = |at: u64, n: u64| -> std::io::Result<()> {
        let mut buf = vec![0u8; n as usize];
        file.seek(SeekFrom::Start(at))?;
        file.read_exact(&mut buf)?;
        h.update(&buf);
        Ok(())
    };
    const MIB: u64 = 1 << 20;
    window(0, MIB)?;
    window(len - MIB, MIB)?;
    for i in 0..SAMPLES {
        window((len - (64 << 10)) * i / (SAMPLES - 1), 64 << 10)?;
    }
    Ok(())
}

/// The weights' fingerprint of an engine of `config` (module docs).
fn weights_fingerprint(config: &EngineConfig) -> Result<String> {
    let mut h = Sha256::new();
    h.update(format!(
        "dtype {} format {} seed {}\n",
        config.weight_dtype, config.weights, config.weight_seed
    ));
    let mut roots: Vec<(&str, PathBuf)> = Vec::new();
    match ModelSource::resolve(&config.model)? {
        ModelSource::Preset(p) => h.update(format!("preset {}\n", p.name)),
        ModelSource::Pipeline(dir) | ModelSource::WanRepo(dir) => roots.push(("model", dir)),
    }
    if let Some(t) = &config.transformer {
        roots.push(("transformer", PathBuf::from(t)));
    }
    if let Some(t) = &config.transformer_config {
        roots.push(("transformer_config", t.clone()));
    }
    if let Some(t) = &config.tiny_decoder {
        roots.push(("tiny_decoder", t.clone()));
    }
    for (what, root) in roots {
        for (rel, path) in files_under(&root)? {
            h.update(format!("{what}/{rel}\n"));
            hash_file(&mut h, &path).map_err(|e| {
                EngineError::snapshot(SnapshotFault::Io, format!("{}: {e}", path.display()))
            })?;
        }
    }
    Ok(hex(&h.finalize())[..32].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_byte_anywhere_in_a_large_file_sampled_changes_the_fingerprint_only_in_a_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        let data: Vec<u8> = (0..(WHOLE_FILE_BYTES + (3 << 20)))
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let digest = |p: &Path| {
            let mut h = Sha256::new();
            hash_file(&mut h, p).unwrap();
            hex(&h.finalize())
        };
        let base = digest(&path);
        let mut changed = data.clone();
        changed[10] ^= 1; // inside the first MiB
        std::fs::write(&path, &changed).unwrap();
        assert_ne!(digest(&path), base);
        std::fs::write(&path, &data).unwrap();
        assert_eq!(digest(&path), base);
    }

    #[test]
    fn differences_name_each_field_that_differs() {
        let config = EngineConfig {
            model: "tiny".into(),
            ..EngineConfig::default()
        };
        let place = MeshPlace {
            tp: 1,
            sp: 1,
            rank: 0,
        };
        let a = EngineIdentity::new(&config, "arch", place)
            .of_session(48, 32, "full")
            .unwrap();
        let mut b = a.clone();
        assert!(a.differences(&b).is_empty());
        b.width = 64;
        b.mesh.tp = 2;
        b.threads = 99;
        let diff = a.differences(&b).join("; ");
        assert!(diff.contains("size: snapshot 48x32, here 64x32"), "{diff}");
        assert!(diff.contains("mesh"), "{diff}");
        assert!(
            !diff.contains("thread"),
            "threads are recorded, not compared"
        );
    }
}
