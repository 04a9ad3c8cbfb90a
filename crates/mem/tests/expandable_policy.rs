//! The `expandable` policy: segments that grow and shrink by pages.

use headroom_mem::{
    AllocatorConfig, AllocatorPolicy, CachingAllocator, ModelledMemory, TraceAction, MIB,
};
use std::sync::Arc;

fn allocator(capacity: u64) -> CachingAllocator {
    let config = AllocatorConfig {
        policy: AllocatorPolicy::Expandable,
        max_split_size: None,
        history: 10_000,
    };
    CachingAllocator::new(Arc::new(ModelledMemory::new(capacity)), config).unwrap()
}

fn reserved(a: &CachingAllocator) -> u64 {
    a.stats().reserved_bytes.all().current as u64
}

#[test]
fn the_devlog_example_reserves_140mib_instead_of_256mib() {
    let a = allocator(1 << 34);
    let first: Vec<_> = (0..8).map(|_| a.allocate(16 * MIB, 0).unwrap()).collect();
    drop(first);
    let _second: Vec<_> = (0..4).map(|_| a.allocate(32 * MIB, 0).unwrap()).collect();
    assert_eq!(a.stats().reserved_bytes.all().peak as u64, 140 * MIB);
    a.check_invariants().unwrap();
}

#[test]
fn pages_are_mapped_at_the_lowest_free_address_in_page_units() {
    let a = allocator(1 << 34);
    let x = a.allocate(16 * MIB, 0).unwrap();
    assert_eq!(reserved(&a), 20 * MIB);
    let y = a.allocate(16 * MIB, 0).unwrap();
    assert_eq!(y.addr(), x.addr() + 16 * MIB);
    assert_eq!(reserved(&a), 40 * MIB);
    let small = a.allocate(4096, 0).unwrap();
    assert_eq!(reserved(&a), 42 * MIB);
    drop(small);
    let maps = a
        .trace()
        .iter()
        .filter(|e| e.action == TraceAction::SegmentMap)
        .count();
    assert_eq!(maps, 3);
}

#[test]
fn empty_cache_unmaps_free_pages_but_live_blocks_pin_theirs() {
    let a = allocator(1 << 34);
    let blocks: Vec<_> = (0..6).map(|_| a.allocate(20 * MIB, 0).unwrap()).collect();
    assert_eq!(reserved(&a), 120 * MIB);
    let mut blocks = blocks.into_iter();
    let kept = blocks.nth(2).unwrap();
    drop(blocks);
    a.empty_cache();
    // Only the pages under the live block in the middle stay mapped.
    assert_eq!(reserved(&a), 20 * MIB);
    assert!(a.stats().num_device_free >= 2);
    drop(kept);
    a.empty_cache();
    assert_eq!(reserved(&a), 0);
    assert_eq!(a.stats().segment.all().current, 0);
    a.check_invariants().unwrap();
}

#[test]
fn partial_pages_at_block_edges_stay_mapped_after_empty_cache() {
    let a = allocator(1 << 34);
    let x = a.allocate(10 * MIB, 0).unwrap();
    let y = a.allocate(25 * MIB, 0).unwrap();
    drop(y);
    a.empty_cache();
    // The first page still holds the live block; pages after it are wholly free.
    assert_eq!(reserved(&a), 20 * MIB);
    a.check_invariants().unwrap();
    drop(x);
}

#[test]
fn expandable_segments_are_per_pool_and_stream() {
    let a = allocator(1 << 34);
    let _x = a.allocate(4096, 0).unwrap();
    let _y = a.allocate(16 * MIB, 0).unwrap();
    let _z = a.allocate(16 * MIB, 1).unwrap();
    assert_eq!(a.stats().segment.all().current, 3);
    assert_eq!(reserved(&a), 2 * MIB + 40 * MIB);
}

#[test]
fn expandable_segments_fail_like_a_device_when_pages_run_out() {
    let a = allocator(60 * MIB);
    let _x = a.allocate(40 * MIB, 0).unwrap();
    let err = a.allocate(30 * MIB, 0).unwrap_err();
    assert!(
        matches!(err, headroom_mem::MemError::OutOfMemory { .. }),
        "{err}"
    );
    assert_eq!(a.stats().num_ooms, 1);
    a.check_invariants().unwrap();
}
