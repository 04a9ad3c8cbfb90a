//! The on-disk cubin cache: one `<key>.cubin` and `<key>.log` per compiled module, the key
//! a SHA-256 over everything that changes the output (source, prelude, options, NVRTC
//! version, arch), so a stale entry is never read and no index has to be kept. Writes go
//! to a temporary name and are renamed into place, so concurrent processes never see a
//! half-written entry.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::error::{CudaError, Result};
use super::nvrtc::Compiled;

/// A folder of compiled modules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskCache {
    dir: PathBuf,
}

/// The cache key of one compile: hex SHA-256 of the length-prefixed parts.
pub fn cache_key(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl DiskCache {
    /// A cache in `dir` (created on the first store).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `HEADROOM_CUDA_CACHE`, else `$XDG_CACHE_HOME/headroom/cuda`, else
    /// `$HOME/.cache/headroom/cuda`; `None` when none of them is set.
    pub fn default_location() -> Option<Self> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        if let Some(dir) = var("HEADROOM_CUDA_CACHE") {
            return Some(Self::new(dir));
        }
        if let Some(dir) = var("XDG_CACHE_HOME") {
            return Some(Self::new(PathBuf::from(dir).join("headroom/cuda")));
        }
        var("HOME").map(|home| Self::new(PathBuf::from(home).join(".cache/headroom/cuda")))
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry for `key`, if both of its files are there.
    pub fn get(&self, key: &str) -> Option<Compiled> {
        let cubin = std::fs::read(self.dir.join(format!("{key}.cubin"))).ok()?;
        let log = std::fs::read_to_string(self.dir.join(format!("{key}.log"))).ok()?;
        Some(Compiled { cubin, log })
    }

    /// Stores `compiled` under `key` (log first, cubin last: the cubin marks it complete).
    pub fn put(&self, key: &str, compiled: &Compiled) -> Result<()> {
        let io = |path: &Path, e: std::io::Error| CudaError::Cache {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| io(&self.dir, e))?;
        let write = |name: String, bytes: &[u8]| -> Result<()> {
            let path = self.dir.join(&name);
            let tmp = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
            std::fs::write(&tmp, bytes).map_err(|e| io(&tmp, e))?;
            std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
        };
        write(format!("{key}.log"), compiled.log.as_bytes())?;
        write(format!("{key}.cubin"), &compiled.cubin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_change_with_every_part_and_with_how_parts_split() {
        let base = cache_key(&["src", "opts", "13.0", "sm_90"]);
        assert_eq!(base, cache_key(&["src", "opts", "13.0", "sm_90"]));
        assert_ne!(base, cache_key(&["src", "opts", "13.0", "sm_80"]));
        assert_ne!(base, cache_key(&["src", "opts", "13.1", "sm_90"]));
        assert_ne!(cache_key(&["ab", "c"]), cache_key(&["a", "bc"]));
        assert_eq!(base.len(), 64);
    }

    #[test]
    fn a_stored_entry_reads_back_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cache = DiskCache::new(dir.path().join("nested"));
        assert_eq!(cache.get("k"), None);
        let entry = Compiled {
            cubin: vec![1, 2, 3],
            log: "ptxas info".into(),
        };
        cache.put("k", &entry).expect("store");
        assert_eq!(cache.get("k"), Some(entry));
    }
}
