//! The `cuda` platform (feature `cuda`): device segments from the CUDA driver under both
//! allocator policies, `empty_cache` giving memory back to the driver, and a clear error
//! where there is no driver or no device.
//!
//! Tests that need a GPU print `skipped: no CUDA device (<reason>)` and return when the
//! constructor reports [`MemError::NoDevice`]; run with `--nocapture` to see the reason.
//! When `HEADROOM_DEVICE_CHECK_OUT` names a folder, the GPU tests write their figures
//! there as `mem-cuda-<test>.json` for `tools/device-check.sh`.
#![cfg(feature = "cuda")]

use headroom_mem::{
    cuda_device_count, nvml_used_bytes, AllocatorConfig, AllocatorPolicy, CachingPlatform,
    CudaMemory, DeviceMemory, MemError, Platform, PlatformKind, ReclaimPolicy, GIB, MIB,
};

/// The platform on GPU 0, or `None` after printing why the test is skipped.
fn platform_or_skip(test: &str, policy: AllocatorPolicy) -> Option<CachingPlatform> {
    match CachingPlatform::cuda(
        0,
        AllocatorConfig::with_policy(policy),
        ReclaimPolicy::Never,
    ) {
        Ok(platform) => Some(platform),
        Err(MemError::NoDevice { reason, .. }) => {
            // CI has no GPU, so only the GPU's own switch (set by tools/device-check.sh)
            // turns a missing device into a failure.
            assert!(
                std::env::var("HEADROOM_REQUIRE_GPU").as_deref() != Ok("1"),
                "{test}: HEADROOM_REQUIRE_GPU=1 but no CUDA device ({reason})"
            );
            println!("{test}: skipped: no CUDA device ({reason})");
            None
        }
        Err(other) => panic!("{test}: the cuda platform failed: {other}"),
    }
}

/// Bytes the driver reports in use on the device (all processes).
fn driver_used(platform: &CachingPlatform) -> u64 {
    let (free, total) = platform.mem_info();
    total - free
}

/// Writes `value` to `$HEADROOM_DEVICE_CHECK_OUT/mem-cuda-<test>.json` when set.
fn report(test: &str, value: serde_json::Value) {
    if let Some(dir) = std::env::var_os("HEADROOM_DEVICE_CHECK_OUT") {
        let path = std::path::Path::new(&dir).join(format!("mem-cuda-{test}.json"));
        let text = serde_json::to_string_pretty(&value).expect("json");
        std::fs::write(&path, text).expect("write the device-check figures");
    }
    println!("{test}: {value}");
}

#[test]
fn a_missing_device_is_an_error_not_a_panic() {
    match CachingPlatform::cuda(0, AllocatorConfig::default(), ReclaimPolicy::Never) {
        Err(error @ MemError::NoDevice { .. }) => {
            let message = error.to_string();
            assert!(message.starts_with("no CUDA device: "), "{message}");
            assert!(message.len() > "no CUDA device: ".len() + 10, "{message}");
            assert!(!matches!(cuda_device_count(), Ok(n) if n > 0));
            println!("this machine has no usable GPU: {message}");
        }
        Err(other) => panic!("expected NoDevice or a platform, got {other}"),
        Ok(platform) => {
            assert_eq!(platform.kind(), PlatformKind::Cuda);
            assert_eq!(platform.allocator().device_name(), "cuda");
            assert!(!platform.allocator().holds_bytes());
            let (free, total) = platform.mem_info();
            assert!(total > GIB && free <= total, "mem_info ({free}, {total})");
            assert_eq!(platform.allocator().capacity(), total);
            assert!(cuda_device_count().expect("device count") >= 1);
        }
    }
}

#[test]
fn an_absent_ordinal_is_no_device() {
    let error = CachingPlatform::cuda(4096, AllocatorConfig::default(), ReclaimPolicy::Never)
        .expect_err("no machine has 4097 GPUs");
    assert!(
        matches!(
            error,
            MemError::NoDevice {
                platform: "cuda",
                ..
            }
        ),
        "{error}"
    );
}

fn segments_come_from_the_driver(test: &str, policy: AllocatorPolicy) {
    let Some(platform) = platform_or_skip(test, policy) else {
        return;
    };
    let nvml_before = nvml_used_bytes(0).ok();
    let used_before = driver_used(&platform);
    let sizes = [64 * MIB, 64 * MIB, 96 * MIB, 3 * MIB, 512, 1024 * 1024 + 7];
    let blocks: Vec<_> = sizes
        .iter()
        .flat_map(|&size| (0..4).map(move |_| size))
        .map(|size| {
            platform
                .allocator()
                .allocate(size, 0)
                .unwrap_or_else(|e| panic!("{test}: allocate {size}: {e}"))
        })
        .collect();
    let requested: u64 = sizes.iter().map(|s| 4 * s).sum();
    let stats = platform.memory_stats();
    let reserved = stats.reserved_bytes.all().current as u64;
    assert!(reserved >= requested, "reserved {reserved} < {requested}");
    let mut addrs: Vec<u64> = blocks.iter().map(|b| b.addr()).collect();
    assert!(addrs.iter().all(|&a| a != 0));
    assert!(
        blocks.iter().all(|b| b.as_ptr().is_none()),
        "device bytes are not host bytes"
    );
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(
        addrs.len(),
        blocks.len(),
        "every live block has its own address"
    );
    let used_live = driver_used(&platform);
    let nvml_live = nvml_used_bytes(0).ok();
    assert!(
        used_live >= used_before + reserved * 9 / 10,
        "{test}: driver used {used_before} → {used_live} with {reserved} reserved"
    );
    drop(blocks);
    let cached = platform.memory_stats();
    assert_eq!(cached.allocated_bytes.all().current, 0);
    assert_eq!(
        cached.reserved_bytes.all().current as u64,
        reserved,
        "freed blocks stay cached"
    );
    platform.empty_cache();
    let used_after = driver_used(&platform);
    let nvml_after = nvml_used_bytes(0).ok();
    assert_eq!(platform.memory_stats().reserved_bytes.all().current, 0);
    assert!(
        used_after + reserved * 9 / 10 <= used_live,
        "{test}: empty_cache lowered driver used only {used_live} → {used_after}"
    );
    // Reuse after empty_cache works.
    let again = platform
        .allocator()
        .allocate(64 * MIB, 0)
        .expect("allocate again");
    drop(again);
    platform.empty_cache();
    let peak = platform.memory_stats();
    report(
        test,
        serde_json::json!({
            "policy": policy.name(),
            "requested_bytes": requested,
            "peak_allocated_bytes": peak.allocated_bytes.all().peak,
            "peak_reserved_bytes": peak.reserved_bytes.all().peak,
            "segments_peak": peak.segment.all().peak,
            "driver_used_before": used_before,
            "driver_used_live": used_live,
            "driver_used_after_empty_cache": used_after,
            "nvml_used_before": nvml_before,
            "nvml_used_live": nvml_live,
            "nvml_used_after_empty_cache": nvml_after,
        }),
    );
}

#[test]
fn pytorch_policy_segments_come_from_cu_mem_alloc() {
    segments_come_from_the_driver("pytorch", AllocatorPolicy::Pytorch);
}

#[test]
fn expandable_policy_segments_are_mapped_pages() {
    segments_come_from_the_driver("expandable", AllocatorPolicy::Expandable);
}

#[test]
fn expandable_pages_map_and_unmap_on_the_device() {
    let memory = match CudaMemory::new(0) {
        Ok(memory) => memory,
        Err(MemError::NoDevice { reason, .. }) => {
            assert!(
                std::env::var("HEADROOM_REQUIRE_GPU").as_deref() != Ok("1"),
                "map-unmap: HEADROOM_REQUIRE_GPU=1 but no CUDA device ({reason})"
            );
            println!("map-unmap: skipped: no CUDA device ({reason})");
            return;
        }
        Err(other) => panic!("{other}"),
    };
    let g = memory.granularity();
    assert!(g > 0 && (2 * MIB).is_multiple_of(g), "granularity {g}");
    let (free_before, _) = memory.driver_mem_info().expect("cuMemGetInfo");
    let base = memory.reserve(256 * MIB).expect("cuMemAddressReserve");
    assert!(memory.map(base, 20 * MIB), "{:?}", memory.last_error());
    assert!(
        memory.map(base + 20 * MIB, 2 * MIB),
        "{:?}",
        memory.last_error()
    );
    assert_eq!(memory.used(), 22 * MIB);
    assert!(
        !memory.map(base + 1, 2 * MIB),
        "a misaligned map is refused"
    );
    let (free_mapped, _) = memory.driver_mem_info().expect("cuMemGetInfo");
    assert!(
        free_mapped + 20 * MIB <= free_before,
        "{free_before} → {free_mapped}"
    );
    // Unmap a page in the middle of the first mapping, then the rest.
    memory.unmap(base + 4 * MIB, 2 * MIB);
    assert_eq!(memory.used(), 20 * MIB);
    memory.unmap(base, 4 * MIB);
    memory.unmap(base + 6 * MIB, 16 * MIB);
    assert_eq!(memory.used(), 0);
    assert_eq!(memory.last_error(), None);
    memory.release_reservation(base, 256 * MIB);
    let (free_after, _) = memory.driver_mem_info().expect("cuMemGetInfo");
    assert!(
        free_after + 4 * MIB >= free_before,
        "{free_before} → {free_after}"
    );
    assert_eq!(memory.last_error(), None);
}

#[test]
fn asking_beyond_the_device_is_out_of_memory() {
    let Some(platform) = platform_or_skip("oom", AllocatorPolicy::Pytorch) else {
        return;
    };
    let capacity = platform.allocator().capacity();
    match platform.allocator().allocate(capacity + GIB, 0) {
        Err(MemError::OutOfMemory { platform, .. }) => assert_eq!(platform, "cuda"),
        Err(other) => panic!("expected out of memory, got {other}"),
        Ok(_) => panic!("allocated more than the device holds"),
    }
}
