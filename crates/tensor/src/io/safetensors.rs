//! Safetensors files, memory-mapped: a tensor's bytes are copied once into a block of
//! the device's allocator, converted to the requested dtype on the way, and the mapped
//! pages are dropped right after (peak resident ≈ the weights, not weights + file).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::io::release_mapped;
use crate::tensor::Tensor;

/// An open, memory-mapped safetensors file.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: Mmap,
}

fn io_err(path: &Path, reason: impl std::fmt::Display) -> TensorError {
    TensorError::Io {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Our dtype of a safetensors dtype (`None` for one we do not hold).
pub fn our_dtype(dtype: StDtype) -> Option<DType> {
    match dtype {
        StDtype::F32 => Some(DType::F32),
        StDtype::BF16 => Some(DType::BF16),
        StDtype::F16 => Some(DType::F16),
        StDtype::U8 => Some(DType::U8),
        StDtype::I64 => Some(DType::I64),
        StDtype::F8_E4M3 => Some(DType::F8E4M3),
        StDtype::F8_E5M2 => Some(DType::F8E5M2),
        StDtype::I8 => Some(DType::I8),
        _ => None,
    }
}

/// The safetensors dtype of ours.
pub fn their_dtype(dtype: DType) -> StDtype {
    match dtype {
        DType::F32 => StDtype::F32,
        DType::BF16 => StDtype::BF16,
        DType::F16 => StDtype::F16,
        DType::U8 => StDtype::U8,
        DType::I64 => StDtype::I64,
        DType::F8E4M3 => StDtype::F8_E4M3,
        DType::F8E5M2 => StDtype::F8_E5M2,
        DType::I8 => StDtype::I8,
    }
}

impl SafetensorsFile {
    /// Maps `path` and checks its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
        // SAFETY: the map is read-only; a file truncated underneath us by another process
        // is the one hazard, as with every mmap-based loader.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| io_err(path, e))?;
        SafeTensors::deserialize(&mmap)
            .map_err(|e| io_err(path, format!("not a safetensors file: {e}")))?;
        Ok(Self {
            path: path.to_path_buf(),
            mmap,
        })
    }

    fn parsed(&self) -> Result<SafeTensors<'_>> {
        SafeTensors::deserialize(&self.mmap).map_err(|e| io_err(&self.path, e))
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .parsed()?
            .names()
            .into_iter()
            .map(str::to_string)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Shape and stored dtype of one tensor (F64 reads as F32).
    pub fn info(&self, name: &str) -> Result<(Vec<usize>, DType)> {
        let st = self.parsed()?;
        let view = st
            .tensor(name)
            .map_err(|_| io_err(&self.path, format!("no tensor named {name:?}")))?;
        let dtype = match view.dtype() {
            StDtype::F64 => DType::F32,
            other => our_dtype(other).ok_or_else(|| {
                io_err(
                    &self.path,
                    format!("tensor {name:?} has unsupported dtype {other:?}"),
                )
            })?,
        };
        Ok((view.shape().to_vec(), dtype))
    }

    /// Loads one tensor onto `device`, converted to `dtype` (its stored dtype if `None`).
    pub fn load(&self, name: &str, device: &Device, dtype: Option<DType>) -> Result<Tensor> {
        let st = self.parsed()?;
        let view = st
            .tensor(name)
            .map_err(|_| io_err(&self.path, format!("no tensor named {name:?}")))?;
        let shape = view.shape().to_vec();
        if view.dtype() == StDtype::F64 {
            // f64 checkpoints (reference fixtures) are narrowed to f32 on load.
            let values: Vec<f32> = view
                .data()
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
                .collect();
            let t = Tensor::from_slice(&values, &shape, device)?;
            self.release(view.data());
            return match dtype {
                Some(d) => t.to_dtype(d),
                None => Ok(t),
            };
        }
        let stored = our_dtype(view.dtype()).ok_or_else(|| {
            io_err(
                &self.path,
                format!("tensor {name:?} has unsupported dtype {:?}", view.dtype()),
            )
        })?;
        // One copy from the map into one allocator block, converting on the way; then
        // the mapped pages go, so the file and its copy are never resident together.
        let data = view.data();
        let t = Tensor::from_bytes_as(data, &shape, stored, dtype.unwrap_or(stored), device)?;
        self.release(data);
        Ok(t)
    }

    /// Drops the mapped pages under `data` (a slice of this file's map).
    fn release(&self, data: &[u8]) {
        let start = (data.as_ptr() as usize).wrapping_sub(self.mmap.as_ptr() as usize);
        if start <= self.mmap.len() {
            release_mapped(&self.mmap, start..start + data.len());
        }
    }

    /// Loads every tensor.
    pub fn load_all(
        &self,
        device: &Device,
        dtype: Option<DType>,
    ) -> Result<BTreeMap<String, Tensor>> {
        self.names()?
            .into_iter()
            .map(|name| {
                let t = self.load(&name, device, dtype)?;
                Ok((name, t))
            })
            .collect()
    }
}

/// Writes tensors to a safetensors file (little-endian, row-major).
pub fn save_safetensors(path: impl AsRef<Path>, tensors: &[(&str, &Tensor)]) -> Result<()> {
    let path = path.as_ref();
    let mut owned = Vec::new();
    for (name, t) in tensors {
        let dense = t.to_host()?.contiguous()?;
        let bytes = dense.storage_data().ok_or(TensorError::Meta {
            op: "save_safetensors",
        })?;
        let start = dense.layout().offset() * dense.dtype().size();
        let data = bytes[start..start + dense.numel() * dense.dtype().size()].to_vec();
        owned.push((
            name.to_string(),
            dense.shape().to_vec(),
            their_dtype(dense.dtype()),
            data,
        ));
    }
    let views = owned
        .iter()
        .map(|(name, shape, dtype, data)| {
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), data)
                .map(|v| (name.clone(), v))
                .map_err(|e| io_err(path, e))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| io_err(path, e))
}
