//! A modelled device: capacity accounting and addresses, no bytes. Planning a 14B model
//! on a laptop needs the allocator's decisions, not the memory.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Budget, DeviceMemory};

/// Where modelled addresses start; high enough to look like a device address and to keep
/// address 0 meaning "none".
const BASE_ADDRESS: u64 = 0x7f00_0000_0000;
/// Alignment of modelled segments and reservations, like CUDA's 2 MiB granularity.
const ALIGNMENT: u64 = 2 << 20;

/// Device memory that only counts: addresses come from a bump counter (so a replay is
/// deterministic) and no byte is ever touched.
#[derive(Debug)]
pub struct ModelledMemory {
    budget: Budget,
    next_address: AtomicU64,
}

impl ModelledMemory {
    /// A modelled device of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Self {
            budget: Budget::new(capacity),
            next_address: AtomicU64::new(BASE_ADDRESS),
        }
    }

    fn next_range(&self, size: u64) -> u64 {
        let span = size.div_ceil(ALIGNMENT).max(1) * ALIGNMENT;
        self.next_address.fetch_add(span, Ordering::Relaxed)
    }
}

impl DeviceMemory for ModelledMemory {
    fn name(&self) -> &'static str {
        "sim"
    }
    fn capacity(&self) -> u64 {
        self.budget.capacity()
    }
    fn used(&self) -> u64 {
        self.budget.used()
    }
    fn holds_bytes(&self) -> bool {
        false
    }
    fn alloc_segment(&self, size: u64) -> Option<u64> {
        self.budget.take(size).then(|| self.next_range(size))
    }
    fn free_segment(&self, _addr: u64, size: u64) {
        self.budget.give(size);
    }
    fn reserve(&self, size: u64) -> Option<u64> {
        Some(self.next_range(size))
    }
    fn release_reservation(&self, _addr: u64, _size: u64) {}
    fn map(&self, _addr: u64, size: u64) -> bool {
        self.budget.take(size)
    }
    fn unmap(&self, _addr: u64, size: u64) {
        self.budget.give(size);
    }
}
