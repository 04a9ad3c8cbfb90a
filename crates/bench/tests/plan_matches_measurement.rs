//! The plan (meta execution on `sim` platforms) predicts, byte for byte, the peaks the
//! same session measures on `cpu` platforms, unsharded and sharded.

use headroom_bench::plan::{run_plan, PlanConfig, PlanPlatform};
use headroom_engine::Mesh;
use headroom_mem::{AllocatorConfig, AllocatorPolicy, ReclaimPolicy, GIB};
use headroom_tensor::DType;

fn config(
    model: &str,
    mesh: Mesh,
    allocator: AllocatorPolicy,
    platform: PlanPlatform,
) -> PlanConfig {
    PlanConfig {
        model: model.to_string(),
        height: 64,
        width: 64,
        frames: 21,
        mesh,
        capacity: 4 * GIB,
        allocator: AllocatorConfig::with_policy(allocator),
        policies: vec![ReclaimPolicy::Never, ReclaimPolicy::BeforeDecode],
        kv_fraction: None,
        chunks: None,
        weight_dtype: DType::F32,
        history: 0,
        platform,
    }
}

#[test]
fn planned_peaks_equal_measured_peaks() {
    for (model, mesh, allocator) in [
        ("tiny", Mesh::SINGLE, AllocatorPolicy::Pytorch),
        ("tiny", Mesh::SINGLE, AllocatorPolicy::Expandable),
        ("small", Mesh::SINGLE, AllocatorPolicy::Pytorch),
        ("tiny", Mesh { tp: 2, sp: 1 }, AllocatorPolicy::Pytorch),
        ("tiny", Mesh { tp: 1, sp: 2 }, AllocatorPolicy::Pytorch),
        ("tiny", Mesh { tp: 2, sp: 2 }, AllocatorPolicy::Pytorch),
    ] {
        let planned = run_plan(&config(model, mesh, allocator, PlanPlatform::Sim)).unwrap();
        let measured = run_plan(&config(model, mesh, allocator, PlanPlatform::Cpu)).unwrap();
        assert_eq!(planned.len(), 2 * mesh.ranks());
        for (p, m) in planned.iter().zip(&measured) {
            let what = format!("{model} {mesh:?} {allocator} {} rank {}", p.policy, p.rank);
            assert_eq!(p.peak_allocated_bytes, m.peak_allocated_bytes, "{what}");
            assert_eq!(p.peak_reserved_bytes, m.peak_reserved_bytes, "{what}");
            assert_eq!(
                p.post_session_reserved_bytes, m.post_session_reserved_bytes,
                "{what}"
            );
            assert_eq!(p.weights_bytes, m.weights_bytes, "{what}");
            assert_eq!(p.peak_phase, m.peak_phase, "{what}");
            assert!(p.peak_reserved_bytes >= p.peak_allocated_bytes);
            assert!(p.kv_bytes > 0 && p.decoder_state_bytes > 0 && p.conditioning_bytes > 0);
        }
    }
}

#[test]
fn sharding_divides_the_transformer_weights_and_the_kv_cache() {
    let whole = run_plan(&config(
        "small",
        Mesh::SINGLE,
        AllocatorPolicy::Pytorch,
        PlanPlatform::Sim,
    ))
    .unwrap();
    let tp2 = run_plan(&config(
        "small",
        Mesh { tp: 2, sp: 2 },
        AllocatorPolicy::Pytorch,
        PlanPlatform::Sim,
    ))
    .unwrap();
    assert_eq!(tp2[0].kv_bytes * 4, whole[0].kv_bytes);
    assert!(tp2[0].weights_bytes < whole[0].weights_bytes);
    assert!(tp2.iter().all(|r| r.weights_bytes == tp2[0].weights_bytes));
}
