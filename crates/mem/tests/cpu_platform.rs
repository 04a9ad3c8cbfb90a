//! The `cpu` platform hands out real host memory and gives it back to the OS.

use headroom_mem::{
    process_rss_bytes, AllocatorConfig, AllocatorPolicy, CachingPlatform, Platform, PlatformKind,
    ReclaimPolicy, GIB, MIB,
};

fn touch(allocation: &headroom_mem::Allocation) {
    let ptr = allocation.as_ptr().expect("cpu allocations hold bytes");
    // SAFETY: the allocation owns `size()` writable bytes until it is dropped.
    unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0xA5, allocation.size() as usize) };
}

fn rss_falls_after_empty_cache(policy: AllocatorPolicy) {
    let platform = CachingPlatform::cpu(
        Some(4 * GIB),
        AllocatorConfig::with_policy(policy),
        ReclaimPolicy::Never,
    )
    .unwrap();
    assert_eq!(platform.kind(), PlatformKind::Cpu);
    let before = process_rss_bytes().unwrap();
    let blocks: Vec<_> = (0..8)
        .map(|_| platform.allocator().allocate(128 * MIB, 0).unwrap())
        .collect();
    blocks.iter().for_each(touch);
    let touched = process_rss_bytes().unwrap();
    assert!(
        touched >= before + 900 * MIB,
        "RSS {before} → {touched} after touching 1 GiB"
    );
    drop(blocks);
    // Freed blocks stay cached: reserved and resident.
    let cached = process_rss_bytes().unwrap();
    assert!(
        cached >= before + 900 * MIB,
        "RSS fell before empty_cache: {cached}"
    );
    assert!(platform.memory_stats().reserved_bytes.all().current as u64 >= GIB);
    platform.empty_cache();
    let after = process_rss_bytes().unwrap();
    assert!(
        after + 900 * MIB <= cached,
        "RSS {cached} → {after} after empty_cache"
    );
    assert_eq!(platform.memory_stats().reserved_bytes.all().current, 0);
}

#[test]
fn rss_falls_after_empty_cache_under_the_pytorch_policy() {
    rss_falls_after_empty_cache(AllocatorPolicy::Pytorch);
}

#[test]
fn rss_falls_after_empty_cache_under_the_expandable_policy() {
    rss_falls_after_empty_cache(AllocatorPolicy::Expandable);
}

#[test]
fn cpu_allocations_are_writable_and_readable() {
    let platform =
        CachingPlatform::cpu(Some(GIB), AllocatorConfig::default(), ReclaimPolicy::Never).unwrap();
    let a = platform.allocator().allocate(4096, 0).unwrap();
    touch(&a);
    let ptr = a.as_ptr().unwrap();
    // SAFETY: 4096 initialised bytes owned by `a`.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), 4096) };
    assert!(bytes.iter().all(|&b| b == 0xA5));
}

#[test]
fn a_segment_beyond_the_capacity_fails_like_a_device_allocation() {
    let platform = CachingPlatform::cpu(
        Some(64 * MIB),
        AllocatorConfig::default(),
        ReclaimPolicy::Never,
    )
    .unwrap();
    let err = platform.allocator().allocate(100 * MIB, 0).unwrap_err();
    assert!(
        matches!(err, headroom_mem::MemError::OutOfMemory { capacity, .. } if capacity == 64 * MIB)
    );
    assert_eq!(platform.mem_info(), (64 * MIB, 64 * MIB));
    let _ok = platform.allocator().allocate(60 * MIB, 0).unwrap();
    assert_eq!(platform.mem_info().0, 4 * MIB);
}

#[test]
fn cpu_capacity_defaults_to_physical_memory() {
    let platform =
        CachingPlatform::cpu(None, AllocatorConfig::default(), ReclaimPolicy::Never).unwrap();
    assert_eq!(
        platform.mem_info().1,
        headroom_mem::HostMemory::physical_memory()
    );
    assert!(platform.mem_info().1 > 0);
}
