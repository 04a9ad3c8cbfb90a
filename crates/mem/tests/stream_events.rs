//! Stream-ordered frees as PyTorch's caching allocator makes them: a block used on another
//! stream (`record_stream`) is freed behind an event on that stream and reused only once
//! the event completed; the statistics count it free at once; emptying the cache waits for
//! the events. Held with a device whose events complete when the test says so.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use headroom_mem::{AllocatorConfig, CachingAllocator, DeviceMemory, ModelledMemory};

/// A modelled device whose events stay pending until `complete_all`.
#[derive(Debug)]
struct ManualEvents {
    memory: ModelledMemory,
    next: AtomicU64,
    /// Event id → (stream, completed).
    events: Mutex<HashMap<u64, (u32, bool)>>,
    waited: AtomicU64,
}

impl ManualEvents {
    fn new() -> Self {
        Self {
            memory: ModelledMemory::new(1 << 30),
            next: AtomicU64::new(1),
            events: Mutex::new(HashMap::new()),
            waited: AtomicU64::new(0),
        }
    }

    fn complete_all(&self) {
        for e in self.events.lock().unwrap().values_mut() {
            e.1 = true;
        }
    }

    fn live_events(&self) -> usize {
        self.events.lock().unwrap().len()
    }
}

impl DeviceMemory for ManualEvents {
    fn name(&self) -> &'static str {
        "manual-events"
    }
    fn capacity(&self) -> u64 {
        self.memory.capacity()
    }
    fn used(&self) -> u64 {
        self.memory.used()
    }
    fn holds_bytes(&self) -> bool {
        false
    }
    fn alloc_segment(&self, size: u64) -> Option<u64> {
        self.memory.alloc_segment(size)
    }
    fn free_segment(&self, addr: u64, size: u64) {
        self.memory.free_segment(addr, size)
    }
    fn reserve(&self, size: u64) -> Option<u64> {
        self.memory.reserve(size)
    }
    fn release_reservation(&self, addr: u64, size: u64) {
        self.memory.release_reservation(addr, size)
    }
    fn map(&self, addr: u64, size: u64) -> bool {
        self.memory.map(addr, size)
    }
    fn unmap(&self, addr: u64, size: u64) {
        self.memory.unmap(addr, size)
    }
    fn record_event(&self, stream: u32) -> Option<u64> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.events.lock().unwrap().insert(id, (stream, false));
        Some(id)
    }
    fn event_done(&self, id: u64) -> bool {
        self.events.lock().unwrap()[&id].1
    }
    fn wait_event(&self, id: u64) {
        self.waited.fetch_add(1, Ordering::Relaxed);
        self.events
            .lock()
            .unwrap()
            .get_mut(&id)
            .expect("live event")
            .1 = true;
    }
    fn destroy_event(&self, id: u64) {
        let removed = self.events.lock().unwrap().remove(&id);
        assert!(
            removed.is_some_and(|e| e.1),
            "an event destroyed before it completed"
        );
    }
}

fn allocator() -> (CachingAllocator, Arc<ManualEvents>) {
    let device = Arc::new(ManualEvents::new());
    let allocator = CachingAllocator::new(device.clone(), AllocatorConfig::default()).unwrap();
    (allocator, device)
}

#[test]
fn a_block_used_on_another_stream_is_reused_only_after_its_event() {
    let (allocator, device) = allocator();
    let a = allocator.allocate(4 << 20, 0).unwrap();
    let addr = a.addr();
    a.record_stream(1);
    a.record_stream(1); // recorded once per stream
    a.record_stream(0); // its own stream needs no event
    drop(a);
    assert_eq!(device.live_events(), 1);
    assert_eq!(allocator.pending_frees(), 1);
    assert_eq!(
        allocator.stats().allocated_bytes.all().current,
        0,
        "counted free at once"
    );
    let b = allocator.allocate(4 << 20, 0).unwrap();
    assert_ne!(b.addr(), addr, "reused while stream 1 may still use it");
    drop(b);
    device.complete_all();
    let c = allocator.allocate(4 << 20, 0).unwrap();
    assert_eq!(allocator.pending_frees(), 0);
    assert_eq!(device.live_events(), 0, "completed events are destroyed");
    // A's block is back in the pool, merged with its segment's free rest: best fit by
    // address hands it out again.
    assert_eq!(c.addr(), addr);
}

#[test]
fn without_record_stream_a_freed_block_is_reused_at_once() {
    let (allocator, device) = allocator();
    let a = allocator.allocate(4 << 20, 0).unwrap();
    let addr = a.addr();
    drop(a);
    assert_eq!(device.live_events(), 0);
    assert_eq!(allocator.allocate(4 << 20, 0).unwrap().addr(), addr);
}

#[test]
fn emptying_the_cache_waits_for_pending_events_and_returns_the_segment() {
    let (allocator, device) = allocator();
    let a = allocator.allocate(30 << 20, 0).unwrap();
    a.record_stream(2);
    drop(a);
    assert!(allocator.stats().reserved_bytes.all().current > 0);
    allocator.empty_cache();
    assert_eq!(device.waited.load(Ordering::Relaxed), 1);
    assert_eq!(allocator.pending_frees(), 0);
    assert_eq!(allocator.stats().reserved_bytes.all().current, 0);
    assert_eq!(device.live_events(), 0);
}
