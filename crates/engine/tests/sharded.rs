//! Sharded execution (TP, SP, TP × SP with the in-process communicator) produces the
//! frames of unsharded execution, and each rank keeps only its share of the KV cache.

use std::sync::Arc;

use headroom_engine::{Engine, EngineConfig, Mesh, SessionRequest};
use headroom_mem::{AllocatorConfig, CachingPlatform, Platform, ReclaimPolicy};

fn frames(mesh: Mesh) -> Vec<(Vec<u8>, u64)> {
    let config = EngineConfig {
        model: "tiny".to_string(),
        ..EngineConfig::default()
    };
    Engine::on_each_rank(
        mesh,
        &config,
        |_| {
            Ok(Arc::new(CachingPlatform::cpu(
                None,
                AllocatorConfig::default(),
                ReclaimPolicy::Never,
            )?) as Arc<dyn Platform>)
        },
        |_, engine| {
            let mut session = engine.open_session(SessionRequest::new(64, 32, 21))?;
            let mut out = Vec::new();
            for _ in 0..session.chunks_total().unwrap() {
                out.extend(session.next_chunk()?.frames.to_vec::<u8>()?);
            }
            let kv = engine.kv_pool().map_or(0, |p| p.layout().bytes());
            Ok((out, kv))
        },
    )
    .unwrap()
}

#[test]
fn tp_sp_and_tp_x_sp_produce_the_unsharded_frames() {
    let reference = frames(Mesh::SINGLE);
    let (want, kv_whole) = &reference[0];
    for mesh in [
        Mesh { tp: 2, sp: 1 },
        Mesh { tp: 1, sp: 2 },
        Mesh { tp: 2, sp: 2 },
    ] {
        let ranks = frames(mesh);
        assert_eq!(ranks.len(), mesh.ranks());
        for (rank, (got, kv)) in ranks.iter().enumerate() {
            assert_eq!(got.len(), want.len());
            let max = got
                .iter()
                .zip(want)
                .map(|(a, b)| a.abs_diff(*b))
                .max()
                .unwrap_or(0);
            let mean = got
                .iter()
                .zip(want)
                .map(|(a, b)| a.abs_diff(*b) as f64)
                .sum::<f64>()
                / want.len() as f64;
            println!("{mesh:?} rank {rank}: max |Δ| {max}, mean |Δ| {mean:.5}");
            // f32 sums in another order round a few pixels to the neighbouring level.
            assert!(
                max <= 2 && mean < 0.02,
                "{mesh:?} rank {rank}: max {max}, mean {mean}"
            );
            assert_eq!(
                *kv * mesh.ranks() as u64,
                *kv_whole,
                "{mesh:?}: KV sharded by heads"
            );
        }
        // Every rank decodes the same gathered latents.
        assert!(ranks.iter().all(|(f, _)| f == &ranks[0].0));
    }
}
