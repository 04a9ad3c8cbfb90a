//! Device memory: what the caching allocator carves into blocks.
//!
//! A [`DeviceMemory`] hands out whole segments (`cudaMalloc`-like) and, for expandable
//! segments, reserves address ranges and maps or unmaps pages inside them
//! (`cuMemAddressReserve` / `cuMemMap`-like). It enforces the device's capacity: a
//! request beyond it fails the way a device allocation fails, and the allocator's slow
//! path decides what to do next.

#[cfg(feature = "cuda")]
mod cuda;
mod host;
mod modelled;

use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(feature = "cuda")]
pub use cuda::{cuda_device_count, nvml_used_bytes, CudaMemory};
pub use host::HostMemory;
pub use modelled::ModelledMemory;

/// A source of device memory with a fixed capacity.
pub trait DeviceMemory: Send + Sync + std::fmt::Debug {
    /// Short name for messages (`cpu`, `sim`, `cuda`).
    fn name(&self) -> &'static str;
    /// Total bytes this device can hold.
    fn capacity(&self) -> u64;
    /// Bytes currently backed: live segments plus mapped pages.
    fn used(&self) -> u64;
    /// Whether addresses point at real bytes the process can read and write.
    fn holds_bytes(&self) -> bool;
    /// Allocates a segment of `size` bytes; `None` when the device cannot provide it.
    fn alloc_segment(&self, size: u64) -> Option<u64>;
    /// Returns a segment obtained from [`DeviceMemory::alloc_segment`].
    fn free_segment(&self, addr: u64, size: u64);
    /// Reserves `size` bytes of address space backed by nothing yet.
    fn reserve(&self, size: u64) -> Option<u64>;
    /// Gives back a reservation whose pages are all unmapped.
    fn release_reservation(&self, addr: u64, size: u64);
    /// Backs `[addr, addr + size)` inside a reservation with memory; `false` when the
    /// device cannot provide it.
    fn map(&self, addr: u64, size: u64) -> bool;
    /// Returns the memory behind `[addr, addr + size)` to the device.
    fn unmap(&self, addr: u64, size: u64);
    /// Waits for outstanding work on the device (a no-op on the host).
    fn synchronize(&self) {}
    /// Records an event on `stream` after the work submitted to it so far, for a block
    /// freed while that stream may still use it; `None` where work is synchronous (the
    /// host, modelled devices) and the block can be reused at once.
    fn record_event(&self, _stream: u32) -> Option<u64> {
        None
    }
    /// Whether event `id` has completed (without waiting).
    fn event_done(&self, _id: u64) -> bool {
        true
    }
    /// Waits until event `id` has completed.
    fn wait_event(&self, _id: u64) {}
    /// Releases event `id` (after it completed).
    fn destroy_event(&self, _id: u64) {}
    /// Where the byte at device address `addr` lives in this process, for devices that
    /// hold bytes the process can touch.
    fn host_ptr(&self, _addr: u64) -> Option<std::ptr::NonNull<u8>> {
        None
    }
    /// `(free, total)` bytes as the device's driver reports them (`cuMemGetInfo`), for
    /// devices with a driver; `None` where the allocator's own accounting is the truth.
    fn driver_mem_info(&self) -> Option<(u64, u64)> {
        None
    }
}

/// Where device addresses start; high enough to look like a device address and to keep
/// address 0 meaning "none".
pub(crate) const BASE_ADDRESS: u64 = 0x7f00_0000_0000;
/// Alignment of device address ranges, like CUDA's 2 MiB granularity.
pub(crate) const ALIGNMENT: u64 = 2 << 20;

/// Device addresses from a bump counter: every platform numbers its segments the same
/// way, so the allocator's address-ordered choices (best fit breaks ties by address)
/// are the same on the host as on the modelled device, and a plan predicts the host's
/// run exactly.
#[derive(Debug)]
pub(crate) struct AddressSpace {
    next: AtomicU64,
}

impl AddressSpace {
    pub(crate) fn new() -> Self {
        Self {
            next: AtomicU64::new(BASE_ADDRESS),
        }
    }

    /// A fresh range of `size` bytes (rounded up to the alignment).
    pub(crate) fn next_range(&self, size: u64) -> u64 {
        let span = size.div_ceil(ALIGNMENT).max(1) * ALIGNMENT;
        self.next.fetch_add(span, Ordering::Relaxed)
    }
}

/// Capacity accounting shared by device implementations: a lock-free counter that
/// refuses to go past the capacity.
#[derive(Debug)]
pub(crate) struct Budget {
    capacity: u64,
    used: AtomicU64,
}

impl Budget {
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            capacity,
            used: AtomicU64::new(0),
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `size` bytes if they fit under the capacity.
    pub(crate) fn take(&self, size: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(size)
                    .filter(|&total| total <= self.capacity)
            })
            .is_ok()
    }

    pub(crate) fn give(&self, size: u64) {
        self.used.fetch_sub(size, Ordering::AcqRel);
    }
}
