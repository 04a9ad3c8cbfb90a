//! A modelled device: capacity accounting and addresses, no bytes. Planning a 14B model
//! on a laptop needs the allocator's decisions, not the memory.

use super::{AddressSpace, Budget, DeviceMemory};

/// Device memory that only counts: addresses come from a bump counter (so a replay is
/// deterministic) and no byte is ever touched.
#[derive(Debug)]
pub struct ModelledMemory {
    budget: Budget,
    addresses: AddressSpace,
}

impl ModelledMemory {
    /// A modelled device of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Self {
            budget: Budget::new(capacity),
            addresses: AddressSpace::new(),
        }
    }

    fn next_range(&self, size: u64) -> u64 {
        self.addresses.next_range(size)
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
