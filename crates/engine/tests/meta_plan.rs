//! The real model shapes run through a whole session as meta execution on a `sim`
//! platform: the allocator's decisions without the bytes.

use std::sync::Arc;

use headroom_engine::{Engine, EngineConfig, Placement, SessionRequest};
use headroom_mem::{AllocatorConfig, CachingPlatform, ReclaimPolicy, GIB};
use headroom_tensor::DType;

#[test]
fn the_14b_preset_streams_a_session_as_meta_execution() {
    let platform = CachingPlatform::sim(
        1024 * GIB,
        AllocatorConfig::default(),
        ReclaimPolicy::BeforeDecode,
    )
    .unwrap();
    let engine = Engine::load(
        EngineConfig {
            model: "lingbot-world-v2-14b".to_string(),
            weight_dtype: DType::BF16,
            ..EngineConfig::default()
        },
        Placement::host(Arc::new(platform)),
    )
    .unwrap();
    let weights = engine
        .platform()
        .memory_stats()
        .allocated_bytes
        .all()
        .current as f64
        / GIB as f64;
    let mut session = engine
        .open_session(SessionRequest::new(832, 480, 21))
        .unwrap();
    let mut peaks = Vec::new();
    for _ in 0..2 {
        let chunk = session.next_chunk().unwrap();
        assert_eq!(chunk.frames.shape()[1..], [480, 832, 3]);
        peaks.push(chunk.stats_decoded.allocated_bytes.all().peak as f64 / GIB as f64);
    }
    println!("14B meta: weights {weights:.1} GiB, allocated peaks per chunk {peaks:.1?} GiB");
    // 14B transformer + the 4.2B-parameter camera adapter + the VAE, in bf16.
    assert!(
        (33.0..36.0).contains(&weights),
        "{weights} GiB of bf16 weights"
    );
}
