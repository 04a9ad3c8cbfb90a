//! A tensor's bytes: one block from the platform's allocator, returned when the last
//! tensor sharing it is dropped.

use std::sync::Arc;

use headroom_mem::Allocation;

use crate::cuda::launch::Launcher;
use crate::device::Device;
use crate::error::Result;

/// Bytes owned through an allocator block (none on a meta device; device memory, told to
/// the device's launcher, on a GPU).
#[derive(Debug)]
pub struct Storage {
    allocation: Allocation,
    len: usize,
    launcher: Option<Arc<dyn Launcher>>,
}

impl Storage {
    /// A block of `len` bytes from `device`'s allocator (contents unspecified).
    pub fn allocate(device: &Device, len: usize) -> Result<Self> {
        let allocation = device.platform().allocator().allocate(len as u64, 0)?;
        let launcher = device.launcher().cloned();
        if let Some(l) = &launcher {
            l.allocated(allocation.addr(), len as u64);
        }
        Ok(Self {
            allocation,
            len,
            launcher,
        })
    }

    /// Bytes in the block as requested.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The block's address (0 for empty blocks; fake on meta devices).
    pub fn addr(&self) -> u64 {
        self.allocation.addr()
    }

    /// The bytes, or `None` on a meta device.
    pub fn bytes(&self) -> Option<&[u8]> {
        if self.len == 0 {
            return Some(&[]);
        }
        let ptr = self.allocation.as_ptr()?;
        // SAFETY: the allocation owns at least `len` bytes for as long as `self` lives, and
        // shared references to them only exist through `&self`.
        Some(unsafe { std::slice::from_raw_parts(ptr.as_ptr(), self.len) })
    }

    /// The bytes for writing, or `None` on a meta device.
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        if self.len == 0 {
            return Some(&mut []);
        }
        let ptr = self.allocation.as_ptr()?;
        // SAFETY: as in `bytes`, and `&mut self` makes this the only reference.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), self.len) })
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Some(l) = &self.launcher {
            l.released(self.allocation.addr());
        }
    }
}
