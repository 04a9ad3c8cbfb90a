//! PyTorch checkpoints (`.pth` / `.pt`), memory-mapped and read without running them:
//! [`zip`] finds the stored entries of the archive, [`index`] checks the pickle against
//! its allow-list and says where each tensor's bytes are, and this module copies them
//! once into allocator blocks, converting the dtype on the way, and drops the mapped
//! pages behind it.

pub mod index;
pub mod zip;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use self::index::{read_pth, PthTensor, StorageDtype};

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::io::release_mapped;
use crate::tensor::Tensor;

/// An open, memory-mapped, checked torch checkpoint.
#[derive(Debug)]
pub struct PthFile {
    path: PathBuf,
    mmap: Mmap,
    tensors: BTreeMap<String, PthTensor>,
}

fn io_err(path: &Path, reason: impl std::fmt::Display) -> TensorError {
    TensorError::Io {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// The dtype a storage loads as (f64 narrows to f32, bool reads as u8), if supported.
fn our_dtype(dtype: StorageDtype) -> Option<DType> {
    Some(match dtype {
        StorageDtype::F32 | StorageDtype::F64 => DType::F32,
        StorageDtype::F16 => DType::F16,
        StorageDtype::BF16 => DType::BF16,
        StorageDtype::I64 => DType::I64,
        StorageDtype::U8 | StorageDtype::Bool => DType::U8,
        StorageDtype::I32 => return None,
    })
}

impl PthFile {
    /// Maps `path` and checks the archive, the pickle and every tensor record.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
        // SAFETY: the map is read-only; a file truncated underneath us by another process
        // is the one hazard, as with every mmap-based loader.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| io_err(path, e))?;
        let tensors = read_pth(&mmap).map_err(|e| io_err(path, e))?;
        // The pickle's pages are not needed again.
        release_mapped(&mmap, 0..mmap.len());
        Ok(Self {
            path: path.to_path_buf(),
            mmap,
            tensors,
        })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensor names (nested dicts joined with `.`), sorted.
    pub fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    fn record(&self, name: &str) -> Result<&PthTensor> {
        self.tensors
            .get(name)
            .ok_or_else(|| io_err(&self.path, format!("no tensor named {name:?}")))
    }

    /// Shape and load dtype of one tensor.
    pub fn info(&self, name: &str) -> Result<(Vec<usize>, DType)> {
        let t = self.record(name)?;
        let dtype = our_dtype(t.dtype).ok_or_else(|| {
            io_err(
                &self.path,
                format!("tensor {name:?} has unsupported dtype {:?}", t.dtype),
            )
        })?;
        Ok((t.shape.clone(), dtype))
    }

    /// Bytes of one tensor as stored.
    pub fn stored_bytes(&self, name: &str) -> Result<u64> {
        Ok(self.record(name)?.data.len() as u64)
    }

    /// Loads one tensor onto `device`, converted to `dtype` (its stored dtype if `None`).
    pub fn load(&self, name: &str, device: &Device, dtype: Option<DType>) -> Result<Tensor> {
        let t = self.record(name)?;
        let (shape, stored) = self.info(name)?;
        let bytes = self
            .mmap
            .get(t.data.clone())
            .ok_or_else(|| io_err(&self.path, format!("tensor {name:?} lies outside the file")))?;
        let tensor = if t.dtype == StorageDtype::F64 {
            let values: Vec<f32> = bytes
                .chunks_exact(8)
                .map(|c| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(c);
                    f64::from_le_bytes(a) as f32
                })
                .collect();
            let t = Tensor::from_slice(&values, &shape, device)?;
            match dtype {
                Some(d) => t.to_dtype(d)?,
                None => t,
            }
        } else {
            Tensor::from_bytes_as(bytes, &shape, stored, dtype.unwrap_or(stored), device)?
        };
        release_mapped(&self.mmap, t.data.clone());
        Ok(tensor)
    }
}
