//! The `fit` policy: reserved bytes stay within the slack of the allocated peak on a
//! pattern that fragments the cache, and nothing is released while the cache serves.

use headroom_mem::{
    AllocatorConfig, AllocatorPolicy, CachingPlatform, Phase, Platform, ReclaimPolicy, MIB,
};

/// Growing requests, each freed before the next: every new size misses the cache (the
/// shape of a VAE decode going up its resolutions), then the same sizes again.
fn growing(platform: &CachingPlatform) {
    let allocator = platform.allocator();
    for _ in 0..2 {
        for i in 1..=8u64 {
            let a = allocator.allocate(i * 12 * MIB + 3 * 1024, 0).unwrap();
            let small: Vec<_> = (0..4)
                .map(|_| allocator.allocate(300 * 1024, 0).unwrap())
                .collect();
            drop(small);
            drop(a);
        }
    }
    allocator.check_invariants().unwrap();
}

fn run(policy: ReclaimPolicy, allocator: AllocatorPolicy) -> headroom_mem::MemoryStats {
    let platform =
        CachingPlatform::sim(4 << 30, AllocatorConfig::with_policy(allocator), policy).unwrap();
    // A resident tensor under the churn, as weights are.
    let _weights = platform.allocator().allocate(100 * MIB, 0).unwrap();
    growing(&platform);
    platform.memory_stats()
}

#[test]
fn fit_keeps_reserved_within_its_slack_where_never_does_not() {
    for allocator in [AllocatorPolicy::Pytorch, AllocatorPolicy::Expandable] {
        let never = run(ReclaimPolicy::Never, allocator);
        let fit = run(ReclaimPolicy::Fit { slack: 0.05 }, allocator);
        let peak = |s: &headroom_mem::MemoryStats| {
            (
                s.allocated_bytes.all().peak as f64,
                s.reserved_bytes.all().peak as f64,
            )
        };
        let (never_alloc, never_reserved) = peak(&never);
        let (fit_alloc, fit_reserved) = peak(&fit);
        assert_eq!(never_alloc, fit_alloc, "{allocator}: same requests");
        if allocator == AllocatorPolicy::Pytorch {
            assert!(
                never_reserved > 1.5 * never_alloc,
                "{allocator}: the pattern fragments the cache without fit: {never_reserved} vs {never_alloc}"
            );
        }
        assert!(
            fit_reserved <= 1.05 * fit_alloc,
            "{allocator}: fit reserved {fit_reserved} over allocated peak {fit_alloc}"
        );
        assert!(fit.num_reclaims > 0 && fit.reclaimed_bytes > 0);
        assert!(fit.reclaim_ns > 0);
        assert_eq!(never.num_reclaims, 0);
    }
}

#[test]
fn fit_releases_nothing_while_the_cache_serves_the_requests() {
    let platform =
        CachingPlatform::sim(1 << 30, AllocatorConfig::default(), ReclaimPolicy::fit()).unwrap();
    let allocator = platform.allocator();
    for _ in 0..10 {
        let a = allocator.allocate(64 * MIB, 0).unwrap();
        let b = allocator.allocate(32 * MIB, 0).unwrap();
        drop((a, b));
    }
    let stats = platform.memory_stats();
    assert_eq!(stats.num_reclaims, 0);
    assert_eq!(
        stats.num_device_alloc, 2,
        "both segments were cached and reused"
    );
    // Phases inside a session do not flush; the end of a session does.
    assert!(platform.phase(Phase::DenoiseEnd).is_none());
    assert!(platform.phase(Phase::DecodeStart).is_none());
    assert!(platform.phase(Phase::SessionEnd).is_some());
    assert_eq!(platform.memory_stats().reserved_bytes.all().current, 0);
}
