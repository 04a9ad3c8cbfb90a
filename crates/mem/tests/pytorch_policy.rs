//! The `pytorch` policy, rule by rule (REFERENCE.md §1), on a modelled device so that
//! addresses are deterministic.

use headroom_mem::{
    AllocatorConfig, AllocatorPolicy, CachingAllocator, MemError, ModelledMemory, TraceAction, MIB,
};
use std::sync::Arc;

fn allocator(capacity: u64, max_split_size: Option<u64>) -> CachingAllocator {
    let config = AllocatorConfig {
        policy: AllocatorPolicy::Pytorch,
        max_split_size,
        history: 10_000,
    };
    CachingAllocator::new(Arc::new(ModelledMemory::new(capacity)), config).unwrap()
}

fn reserved(a: &CachingAllocator) -> u64 {
    a.stats().reserved_bytes.all().current as u64
}

fn allocated(a: &CachingAllocator) -> u64 {
    a.stats().allocated_bytes.all().current as u64
}

#[test]
fn requests_round_up_to_multiples_of_512_bytes() {
    let a = allocator(1 << 30, None);
    assert_eq!(a.allocate(1, 0).unwrap().size(), 512);
    assert_eq!(a.allocate(512, 0).unwrap().size(), 512);
    assert_eq!(a.allocate(513, 0).unwrap().size(), 1024);
    let x = a.allocate(1000, 0).unwrap();
    assert_eq!(x.requested_size(), 1000);
    assert_eq!(a.stats().requested_bytes.all().current, 1000);
    assert_eq!(allocated(&a), 1024);
}

#[test]
fn zero_byte_requests_touch_nothing() {
    let a = allocator(1 << 30, None);
    let x = a.allocate(0, 0).unwrap();
    assert_eq!((x.addr(), x.size()), (0, 0));
    assert_eq!(reserved(&a), 0);
    assert_eq!(a.stats().num_device_alloc, 0);
}

#[test]
fn small_requests_get_2mib_segments_in_the_small_pool() {
    let a = allocator(1 << 30, None);
    let _x = a.allocate(MIB, 0).unwrap();
    assert_eq!(reserved(&a), 2 * MIB);
    let s = a.stats();
    assert_eq!(
        s.reserved_bytes
            .get(headroom_mem::StatType::SmallPool)
            .current as u64,
        2 * MIB
    );
    assert_eq!(a.snapshot().segments[0].segment_type, "small");
}

#[test]
fn large_requests_under_10mib_get_20mib_segments() {
    let a = allocator(1 << 30, None);
    let _x = a.allocate(MIB + 1, 0).unwrap();
    assert_eq!(reserved(&a), 20 * MIB);
    let _y = a.allocate(30 * MIB, 0).unwrap();
    let snapshot = a.snapshot();
    assert_eq!(snapshot.segments[0].segment_type, "large");
    // 9.5 MiB fits the rest of the first segment (20 − 1.0005 rounded), no new segment.
    let _z = a.allocate(9 * MIB + MIB / 2, 0).unwrap();
    assert_eq!(reserved(&a), 50 * MIB);
}

#[test]
fn large_requests_of_10mib_or_more_round_up_to_2mib_segments() {
    let a = allocator(1 << 30, None);
    let _x = a.allocate(10 * MIB + 1, 0).unwrap();
    assert_eq!(reserved(&a), 12 * MIB);
    let _y = a.allocate(10 * MIB, 0).unwrap();
    assert_eq!(reserved(&a), 22 * MIB);
}

#[test]
fn best_fit_takes_the_smallest_cached_block_that_holds_the_request() {
    let a = allocator(1 << 30, None);
    let b12 = a.allocate(12 * MIB, 0).unwrap();
    let b16 = a.allocate(16 * MIB, 0).unwrap();
    let b14 = a.allocate(14 * MIB, 0).unwrap();
    let addr14 = b14.addr();
    drop((b12, b16, b14));
    let x = a.allocate(13 * MIB, 0).unwrap();
    assert_eq!(x.addr(), addr14);
    // 14 − 13 = 1 MiB is not more than 1 MiB: the large block is not split.
    assert_eq!(x.size(), 14 * MIB);
    assert_eq!(reserved(&a), 42 * MIB);
}

#[test]
fn best_fit_breaks_ties_by_lowest_address() {
    let a = allocator(1 << 30, None);
    let first = a.allocate(12 * MIB, 0).unwrap();
    let second = a.allocate(12 * MIB, 0).unwrap();
    let (low, high) = (
        first.addr().min(second.addr()),
        first.addr().max(second.addr()),
    );
    drop(second);
    drop(first);
    let x = a.allocate(12 * MIB, 0).unwrap();
    assert_eq!(x.addr(), low);
    let y = a.allocate(12 * MIB, 0).unwrap();
    assert_eq!(y.addr(), high);
}

#[test]
fn cached_blocks_are_reused_only_on_their_stream() {
    let a = allocator(1 << 30, None);
    drop(a.allocate(12 * MIB, 1).unwrap());
    let _x = a.allocate(12 * MIB, 0).unwrap();
    assert_eq!(reserved(&a), 24 * MIB);
    let _y = a.allocate(12 * MIB, 1).unwrap();
    assert_eq!(reserved(&a), 24 * MIB);
}

#[test]
fn small_pool_blocks_split_when_the_remainder_is_at_least_512_bytes() {
    let a = allocator(1 << 30, None);
    let x = a.allocate(512, 0).unwrap();
    let y = a.allocate(1024, 0).unwrap();
    assert_eq!(y.addr(), x.addr() + 512);
    assert_eq!(reserved(&a), 2 * MIB);
    let s = a.stats();
    assert_eq!(s.inactive_split.all().current, 1);
    assert_eq!(s.inactive_split_bytes.all().current as u64, 2 * MIB - 1536);
}

#[test]
fn large_pool_blocks_split_only_when_the_remainder_exceeds_1mib() {
    let a = allocator(1 << 30, None);
    let x = a.allocate(9 * MIB, 0).unwrap();
    assert_eq!(x.size(), 9 * MIB);
    assert_eq!(
        a.stats().inactive_split_bytes.all().current as u64,
        11 * MIB
    );
    drop(x);
    // Remainder 20 − 19 = 1 MiB is not more than 1 MiB: the whole block is handed out.
    let y = a.allocate(19 * MIB, 0).unwrap();
    assert_eq!(y.size(), 20 * MIB);
    assert_eq!(allocated(&a), 20 * MIB);
    assert_eq!(a.stats().inactive_split.all().current, 0);
}

#[test]
fn freed_blocks_merge_with_free_neighbours_in_their_segment() {
    let a = allocator(1 << 30, None);
    let x = a.allocate(512, 0).unwrap();
    let y = a.allocate(512, 0).unwrap();
    let z = a.allocate(512, 0).unwrap();
    drop(x);
    drop(z);
    assert_eq!(a.stats().inactive_split.all().current, 2);
    drop(y);
    let s = a.stats();
    assert_eq!(s.inactive_split.all().current, 0);
    assert_eq!(s.inactive_split_bytes.all().current, 0);
    let snapshot = a.snapshot();
    assert_eq!(snapshot.segments.len(), 1);
    assert_eq!(snapshot.segments[0].blocks.len(), 1);
    assert_eq!(snapshot.segments[0].blocks[0].size, 2 * MIB);
    a.check_invariants().unwrap();
}

#[test]
fn freed_blocks_of_different_segments_never_merge() {
    let a = allocator(1 << 30, None);
    let x = a.allocate(12 * MIB, 0).unwrap();
    let y = a.allocate(12 * MIB, 0).unwrap();
    // The modelled device places the segments back to back.
    assert_eq!(y.addr(), x.addr() + 12 * MIB);
    drop((x, y));
    let z = a.allocate(20 * MIB, 0).unwrap();
    assert_eq!(reserved(&a), 44 * MIB);
    assert_eq!(a.snapshot().segments.len(), 3);
    drop(z);
}

#[test]
fn max_split_size_keeps_oversize_blocks_from_small_requests() {
    let a = allocator(1 << 30, Some(32 * MIB));
    drop(a.allocate(40 * MIB, 0).unwrap());
    let _x = a.allocate(12 * MIB, 0).unwrap();
    assert_eq!(reserved(&a), 52 * MIB);
}

#[test]
fn max_split_size_lets_oversize_requests_round_up_by_less_than_20mib() {
    let a = allocator(1 << 30, Some(32 * MIB));
    let big = a.allocate(64 * MIB, 0).unwrap();
    let big_addr = big.addr();
    drop(big);
    // 64 < 50 + 20: taken whole (oversize blocks are never split).
    let x = a.allocate(50 * MIB, 0).unwrap();
    assert_eq!((x.addr(), x.size()), (big_addr, 64 * MIB));
    assert_eq!(a.stats().oversize_allocations.current, 1);
    drop(x);
    // 64 ≥ 40 + 20: not taken.
    let _y = a.allocate(40 * MIB, 0).unwrap();
    assert_eq!(reserved(&a), 104 * MIB);
    assert_eq!(a.stats().oversize_segments.current, 2);
}

#[test]
fn max_split_size_must_exceed_20mib() {
    let err = CachingAllocator::new(
        Arc::new(ModelledMemory::new(1 << 30)),
        AllocatorConfig {
            max_split_size: Some(20 * MIB),
            ..AllocatorConfig::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("max_split_size") && err.contains("20 MiB"),
        "{err}"
    );
}

#[test]
fn a_failed_segment_allocation_frees_cached_segments_counts_a_retry_and_retries() {
    let a = allocator(40 * MIB, None);
    drop(a.allocate(30 * MIB, 1).unwrap());
    let x = a.allocate(20 * MIB, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_ooms, 0);
    assert_eq!(s.num_sync_all_streams, 1);
    assert_eq!(s.num_device_free, 1);
    assert_eq!(reserved(&a), 20 * MIB);
    drop(x);
}

#[test]
fn oversize_cached_blocks_are_released_first_without_counting_a_retry() {
    let a = allocator(64 * MIB, Some(32 * MIB));
    drop(a.allocate(40 * MIB, 0).unwrap());
    let _x = a.allocate(30 * MIB, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.num_alloc_retries, 0);
    assert_eq!(s.num_device_free, 1);
    assert_eq!(reserved(&a), 30 * MIB);
}

#[test]
fn out_of_memory_is_an_error_that_counts_and_says_what_to_change() {
    let a = allocator(40 * MIB, None);
    let _live = a.allocate(30 * MIB, 0).unwrap();
    let err = a.allocate(20 * MIB, 0).unwrap_err();
    match &err {
        MemError::OutOfMemory {
            requested,
            capacity,
            allocated,
            reserved,
            free,
            ..
        } => {
            assert_eq!(*requested, 20 * MIB);
            assert_eq!(*capacity, 40 * MIB);
            assert_eq!(*allocated, 30 * MIB);
            assert_eq!(*reserved, 30 * MIB);
            assert_eq!(*free, 10 * MIB);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("out of memory") && message.contains("20.0 MiB"),
        "{message}"
    );
    let s = a.stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries), (1, 1));
    assert!(a.trace().iter().any(|e| e.action == TraceAction::Oom));
}

#[test]
fn empty_cache_frees_only_segments_without_live_blocks() {
    let a = allocator(1 << 30, None);
    let live = a.allocate(512, 0).unwrap();
    let other = a.allocate(512, 0).unwrap();
    drop(other);
    drop(a.allocate(12 * MIB, 0).unwrap());
    assert_eq!(reserved(&a), 14 * MIB);
    a.empty_cache();
    assert_eq!(reserved(&a), 2 * MIB);
    assert_eq!(a.stats().num_device_free, 1);
    drop(live);
    a.empty_cache();
    assert_eq!(reserved(&a), 0);
}

#[test]
fn statistics_track_current_and_peak_and_reset_to_current() {
    let a = allocator(1 << 30, None);
    let x = a.allocate(12 * MIB, 0).unwrap();
    // 4 MiB gets a 20 MiB segment, split: 4 MiB allocated, 16 MiB inactive split.
    let y = a.allocate(4 * MIB, 0).unwrap();
    drop(x);
    let s = a.stats();
    assert_eq!(s.allocated_bytes.all().peak as u64, 16 * MIB);
    assert_eq!(s.allocated_bytes.all().current as u64, 4 * MIB);
    assert_eq!(s.active_bytes.all().current as u64, 4 * MIB);
    assert_eq!(s.reserved_bytes.all().current as u64, 32 * MIB);
    assert_eq!(s.inactive_split_bytes.all().current as u64, 16 * MIB);
    assert_eq!(s.allocation.all().current, 1);
    assert_eq!(s.segment.all().current, 2);
    assert_eq!(s.num_device_alloc, 2);
    a.reset_peak_stats();
    let s = a.stats();
    assert_eq!(s.allocated_bytes.all().peak as u64, 4 * MIB);
    assert_eq!(s.reserved_bytes.all().peak as u64, 32 * MIB);
    drop(y);
}

#[test]
fn the_trace_records_segments_allocations_and_frees_in_order() {
    let a = allocator(1 << 30, None);
    let x = a.allocate(512, 0).unwrap();
    drop(x);
    a.record_phase("decode_start");
    a.empty_cache();
    let actions: Vec<_> = a.trace().iter().map(|e| e.action).collect();
    assert_eq!(
        actions,
        [
            TraceAction::SegmentAlloc,
            TraceAction::Alloc,
            TraceAction::Free,
            TraceAction::Phase,
            TraceAction::EmptyCache,
            TraceAction::SegmentFree,
        ]
    );
    assert_eq!(a.trace()[3].name.as_deref(), Some("decode_start"));
}

#[test]
fn concurrent_allocations_from_many_threads_stay_consistent() {
    let a = allocator(1 << 34, None);
    std::thread::scope(|scope| {
        for t in 0..4u32 {
            let a = a.clone();
            scope.spawn(move || {
                let mut held = Vec::new();
                for i in 0..2000u64 {
                    let size = 1 + (i * 7919 + u64::from(t) * 104_729) % (3 * MIB);
                    held.push(a.allocate(size, t % 2).unwrap());
                    if i % 3 == 0 {
                        held.swap_remove((i as usize * 31) % held.len());
                    }
                }
            });
        }
    });
    a.check_invariants().unwrap();
    assert_eq!(allocated(&a), 0);
    a.empty_cache();
    assert_eq!(reserved(&a), 0);
}

#[test]
fn an_injected_oom_fails_exactly_the_chosen_allocation_once() {
    let a = allocator(1 << 30, None);
    a.inject_oom_after(Some(2));
    let _x = a.allocate(512, 0).unwrap();
    let _y = a.allocate(512, 0).unwrap();
    assert!(matches!(
        a.allocate(512, 0),
        Err(MemError::OutOfMemory { .. })
    ));
    assert!(a.allocate(512, 0).is_ok());
    assert_eq!(a.stats().num_ooms, 1);
}
