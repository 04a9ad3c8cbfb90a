//! The checkpoint files a model reads: safetensors (single or sharded by an index) and
//! torch `.pth` / `.pt`, behind one small interface, plus the table that maps our
//! (diffusers) parameter names to a tensor in one of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use headroom_tensor::io::pth::PthFile;
use headroom_tensor::io::safetensors::SafetensorsFile;
use headroom_tensor::{DType, Device, Tensor};

use crate::error::{ModelError, Result};

/// One open checkpoint file of either format.
#[derive(Debug)]
pub enum TensorFile {
    /// A `.safetensors` file.
    Safetensors(SafetensorsFile),
    /// A torch `.pth` / `.pt` zip checkpoint.
    Pth(PthFile),
}

pub(crate) fn io_err(path: &Path, reason: impl std::fmt::Display) -> ModelError {
    ModelError::Io {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

impl TensorFile {
    /// Opens `path` by its extension (`.safetensors`, `.pt`, `.pth`, `.bin` zip).
    pub fn open(path: &Path) -> Result<Self> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        match ext {
            "safetensors" => Ok(TensorFile::Safetensors(SafetensorsFile::open(path)?)),
            "pt" | "pth" | "bin" | "ckpt" => Ok(TensorFile::Pth(PthFile::open(path)?)),
            _ => Err(io_err(
                path,
                "not a checkpoint file: expected .safetensors, .pt or .pth",
            )),
        }
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        match self {
            TensorFile::Safetensors(f) => f.path(),
            TensorFile::Pth(f) => f.path(),
        }
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Result<Vec<String>> {
        Ok(match self {
            TensorFile::Safetensors(f) => f.names()?,
            TensorFile::Pth(f) => f.names(),
        })
    }

    /// Shape and stored dtype of one tensor.
    pub fn info(&self, name: &str) -> Result<(Vec<usize>, DType)> {
        Ok(match self {
            TensorFile::Safetensors(f) => f.info(name)?,
            TensorFile::Pth(f) => f.info(name)?,
        })
    }

    /// Loads one tensor, converted to `dtype`.
    pub fn load(&self, name: &str, device: &Device, dtype: DType) -> Result<Tensor> {
        let loaded = match self {
            TensorFile::Safetensors(f) => f.load(name, device, Some(dtype)),
            TensorFile::Pth(f) => f.load(name, device, Some(dtype)),
        };
        loaded.map_err(|e| {
            io_err(
                self.path(),
                format!("tensor {name:?} could not be read (truncated or corrupt file?): {e}"),
            )
        })
    }
}

/// Tensors by stored name, across the files of one checkpoint.
#[derive(Debug, Default)]
pub struct Tensors {
    /// The open files.
    pub files: Vec<TensorFile>,
    /// Stored name → index into `files`.
    pub names: BTreeMap<String, usize>,
}

impl Tensors {
    /// One file's tensors.
    pub fn single(path: &Path) -> Result<Self> {
        let file = TensorFile::open(path)?;
        let names = file.names()?.into_iter().map(|n| (n, 0)).collect();
        Ok(Self {
            files: vec![file],
            names,
        })
    }

    /// A folder's `{stem}.safetensors`, or the shards of `{stem}.safetensors.index.json`.
    pub fn stem(dir: &Path, stem: &str) -> Result<Self> {
        let single = dir.join(format!("{stem}.safetensors"));
        let index = dir.join(format!("{stem}.safetensors.index.json"));
        if single.exists() {
            return Self::single(&single);
        }
        if !index.exists() {
            return Err(io_err(
                dir,
                format!("no {stem}.safetensors or {stem}.safetensors.index.json"),
            ));
        }
        let text = std::fs::read_to_string(&index).map_err(|e| io_err(&index, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| io_err(&index, format!("not valid JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| io_err(&index, "no weight_map object"))?;
        let mut shard_ids: BTreeMap<String, usize> = BTreeMap::new();
        let mut out = Self::default();
        for (name, shard) in map {
            let shard = shard.as_str().ok_or_else(|| {
                io_err(
                    &index,
                    format!("weight_map entry {name:?} is not a file name"),
                )
            })?;
            if shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
                return Err(io_err(
                    &index,
                    format!("weight_map entry {name:?} names {shard:?}, which is not a file beside the index"),
                ));
            }
            let id = match shard_ids.get(shard) {
                Some(&id) => id,
                None => {
                    let path: PathBuf = dir.join(shard);
                    out.files
                        .push(TensorFile::Safetensors(SafetensorsFile::open(&path)?));
                    shard_ids.insert(shard.to_string(), out.files.len() - 1);
                    out.files.len() - 1
                }
            };
            out.names.insert(name.clone(), id);
        }
        Ok(out)
    }
}
