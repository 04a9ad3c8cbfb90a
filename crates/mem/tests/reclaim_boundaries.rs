//! Reclaim policies at phase boundaries, proven on the recording platform.

use std::sync::Arc;

use headroom_mem::{
    AllocatorConfig, CachingPlatform, Phase, Platform, PlatformCall, ReclaimPolicy,
    RecordingPlatform, TraceAction, MIB,
};

fn recording(policy: ReclaimPolicy, caches: bool) -> RecordingPlatform {
    let inner = CachingPlatform::sim(1 << 30, AllocatorConfig::default(), policy).unwrap();
    inner.allocator().set_history(1000);
    RecordingPlatform::with_caching(Arc::new(inner), caches)
}

#[test]
fn before_decode_reclaims_at_decode_start_and_releases_the_cache() {
    let platform = recording(ReclaimPolicy::BeforeDecode, true);
    drop(platform.allocator().allocate(64 * MIB, 0).unwrap());
    assert!(platform.phase(Phase::DenoiseEnd).is_none());
    assert_eq!(platform.count(PlatformCall::EmptyCache), 0);
    let reclaim = platform
        .phase(Phase::DecodeStart)
        .expect("the reclaim branch ran");
    assert_eq!(reclaim.released_bytes, 64 * MIB);
    assert_eq!(platform.count(PlatformCall::EmptyCache), 1);
    let stats = platform.memory_stats();
    assert_eq!(stats.num_reclaims, 1);
    assert_eq!(stats.reclaimed_bytes, 64 * MIB);
    assert_eq!(stats.reserved_bytes.all().current, 0);
    // The reclaim comes right after the phase marker, before anything allocates.
    let actions: Vec<_> = platform
        .allocator()
        .trace()
        .iter()
        .map(|e| e.action)
        .collect();
    let phase = actions
        .iter()
        .rposition(|&a| a == TraceAction::Phase)
        .unwrap();
    assert_eq!(actions[phase + 1], TraceAction::EmptyCache);
}

#[test]
fn a_platform_that_does_not_cache_device_memory_is_never_asked_to_reclaim() {
    let platform = recording(ReclaimPolicy::Always, false);
    drop(platform.allocator().allocate(64 * MIB, 0).unwrap());
    for phase in Phase::ALL {
        assert!(platform.phase(phase).is_none());
    }
    assert_eq!(platform.count(PlatformCall::EmptyCache), 0);
    assert_eq!(platform.memory_stats().num_reclaims, 0);
}

#[test]
fn never_leaves_the_cache_resident_across_boundaries() {
    let platform = recording(ReclaimPolicy::Never, true);
    drop(platform.allocator().allocate(64 * MIB, 0).unwrap());
    for phase in Phase::ALL {
        assert!(platform.phase(phase).is_none());
    }
    assert_eq!(platform.count(PlatformCall::EmptyCache), 0);
    assert_eq!(
        platform.memory_stats().reserved_bytes.all().current as u64,
        64 * MIB
    );
}

#[test]
fn bounded_reclaims_only_when_the_cache_passes_its_bound() {
    let policy = ReclaimPolicy::Bounded {
        max_cached_fraction: 0.25,
        min_free_fraction: 0.0,
    };
    let platform = recording(policy, true);
    drop(platform.allocator().allocate(200 * MIB, 0).unwrap());
    // 200 MiB of 1 GiB cached: under 25 %.
    assert!(platform.phase(Phase::SessionEnd).is_none());
    drop(platform.allocator().allocate(300 * MIB, 1).unwrap());
    // 500 MiB cached: over.
    let reclaim = platform.phase(Phase::SessionEnd).unwrap();
    assert_eq!(reclaim.released_bytes, 500 * MIB);
}

#[test]
fn every_phase_boundary_is_marked_in_the_trace() {
    let platform = recording(ReclaimPolicy::Never, true);
    for phase in Phase::ALL {
        platform.phase(phase);
    }
    let names: Vec<_> = platform
        .allocator()
        .trace()
        .into_iter()
        .filter_map(|e| e.name)
        .collect();
    assert_eq!(
        names,
        [
            "text_end",
            "denoise_end",
            "decode_start",
            "session_end",
            "error",
            "sleep",
            "model_swap"
        ]
    );
    let phases: Vec<_> = platform
        .calls()
        .into_iter()
        .filter(|c| matches!(c, PlatformCall::Phase(_)))
        .collect();
    assert_eq!(phases.len(), 7);
}

#[test]
fn empty_cache_on_an_empty_platform_is_a_no_op_not_an_error() {
    let platform =
        CachingPlatform::sim(1 << 30, AllocatorConfig::default(), ReclaimPolicy::Always).unwrap();
    platform.empty_cache();
    platform.synchronize();
    platform.reset_peak_stats();
    assert_eq!(platform.memory_stats().reserved_bytes.all().current, 0);
    assert!(platform.caches_device_memory());
}
