//! The plan (meta execution on `sim` platforms) predicts, byte for byte, the peaks the
//! same session measures on `cpu` platforms, unsharded and sharded.

use headroom_engine::plan::{run_plan, PlanConfig, PlanPlatform};
use headroom_engine::Mesh;
use headroom_mem::{AllocatorConfig, AllocatorPolicy, ReclaimPolicy, GIB};
use headroom_tensor::DType;

/// The trained world model's pipeline folder.
const WORLD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/world");

fn config(
    model: &str,
    mesh: Mesh,
    allocator: AllocatorPolicy,
    platform: PlanPlatform,
) -> PlanConfig {
    PlanConfig {
        model: model.to_string(),
        transformer: None,
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
        weights: headroom_model::WeightFormat::Native,
        history: 0,
        platform,
        decoder: headroom_model::DecoderKind::Full,
        tiny_decoder: None,
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
        ("tiny", Mesh::SINGLE, AllocatorPolicy::Planned),
        ("small", Mesh::SINGLE, AllocatorPolicy::Planned),
        ("tiny", Mesh { tp: 2, sp: 1 }, AllocatorPolicy::Planned),
        (WORLD, Mesh::SINGLE, AllocatorPolicy::Planned),
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
fn eight_bit_weights_plan_as_they_measure_and_take_fewer_bytes() {
    let native = run_plan(&config(
        "tiny",
        Mesh::SINGLE,
        AllocatorPolicy::Pytorch,
        PlanPlatform::Sim,
    ))
    .unwrap();
    for weights in [
        headroom_model::WeightFormat::Int8,
        headroom_model::WeightFormat::Fp8,
    ] {
        let with = |platform| PlanConfig {
            weights,
            ..config("tiny", Mesh::SINGLE, AllocatorPolicy::Pytorch, platform)
        };
        let planned = run_plan(&with(PlanPlatform::Sim)).unwrap();
        let measured = run_plan(&with(PlanPlatform::Cpu)).unwrap();
        for ((p, m), n) in planned.iter().zip(&measured).zip(&native) {
            let what = format!("{weights} {}", p.policy);
            assert_eq!(p.peak_allocated_bytes, m.peak_allocated_bytes, "{what}");
            assert_eq!(p.peak_reserved_bytes, m.peak_reserved_bytes, "{what}");
            assert_eq!(p.weights_bytes, m.weights_bytes, "{what}");
            assert!(
                p.weights_bytes < n.weights_bytes,
                "{what}: {} vs {}",
                p.weights_bytes,
                n.weights_bytes
            );
        }
    }
}

#[test]
fn sharding_divides_the_transformer_weights_and_the_kv_cache() {
    let plan = |tp: usize, sp: usize| {
        run_plan(&config(
            "small",
            Mesh { tp, sp },
            AllocatorPolicy::Pytorch,
            PlanPlatform::Sim,
        ))
        .unwrap()
    };
    let (w1, w2, w4) = (plan(1, 1), plan(2, 1), plan(4, 1));
    let weights = |rows: &[headroom_engine::plan::RankPlan]| rows[0].weights_bytes as f64;
    // weights(tp) = replicated + sharded / tp: each doubling of tp halves the saving.
    let (first, second) = (weights(&w1) - weights(&w2), weights(&w2) - weights(&w4));
    assert!(
        first > 0.0 && (first / second - 2.0).abs() < 0.01,
        "{first} vs {second}"
    );
    assert!(w2.iter().all(|r| r.weights_bytes == w2[0].weights_bytes));
    let tp2_sp2 = plan(2, 2);
    assert_eq!(
        tp2_sp2[0].kv_bytes * 4,
        w1[0].kv_bytes,
        "KV sharded by heads over tp·sp"
    );
    assert_eq!(
        tp2_sp2[0].weights_bytes, w2[0].weights_bytes,
        "SP replicates weights"
    );
}
