//! Sessions without an end (`num_frames = 0`): they stream until stopped, give the bytes
//! of a session of the same length with an end, hold flat memory once the KV window is
//! full, give everything back when dropped, and refuse what has an end of its own.

use headroom_engine::{Engine, EngineConfig, EngineError, NoiseSource, SessionRequest};
use headroom_mem::{AllocatorConfig, AllocatorPolicy};
use headroom_model::camera::{Pose, Trajectory};

const IDENTITY: Pose = [
    [1.0, 0.0, 0.0, 0.0],
    [0.0, 1.0, 0.0, 0.0],
    [0.0, 0.0, 1.0, 0.0],
    [0.0, 0.0, 0.0, 1.0],
];
use headroom_tensor::{DType, Device, Tensor};

fn engine(allocator: AllocatorPolicy) -> Engine {
    Engine::new(EngineConfig {
        model: "tiny".to_string(),
        allocator: AllocatorConfig::with_policy(allocator),
        kv_budget_bytes: Some(64 << 20),
        ..EngineConfig::default()
    })
    .unwrap()
}

fn request(num_frames: usize) -> SessionRequest {
    SessionRequest {
        seed: 11,
        ..SessionRequest::new(48, 32, num_frames)
    }
}

#[test]
fn a_session_without_an_end_streams_the_bytes_of_one_with_an_end_in_flat_memory() {
    for allocator in [AllocatorPolicy::Pytorch, AllocatorPolicy::Planned] {
        let engine = engine(allocator);
        // Past the steady state (the KV window full at the 6th chunk, the image
        // condition settled, two periods), so that both sessions repeat a period.
        let chunks = engine.steady_blocks() + 3;
        let mut finite = engine.open_session(request(12 * chunks - 3)).unwrap();
        let want: Vec<Vec<u8>> = (0..chunks)
            .map(|_| finite.next_chunk().unwrap().frames.to_vec::<u8>().unwrap())
            .collect();
        drop(finite);
        // The twin's plan settled the condition where the session did: nothing missed.
        assert_eq!(
            engine.platform().memory_stats().planned_misses,
            0,
            "{allocator:?}"
        );
        // What the engine keeps between sessions (weights, the KV pool, any cache).
        let floor = engine
            .platform()
            .memory_stats()
            .reserved_bytes
            .all()
            .current;
        let mut open = engine.open_session(request(0)).unwrap();
        assert_eq!(open.chunks_total(), None);
        let mut reserved = Vec::new();
        for (k, want) in want.iter().enumerate() {
            let chunk = open.next_chunk().unwrap();
            assert!(
                &chunk.frames.to_vec::<u8>().unwrap() == want,
                "{allocator:?}: chunk {k} differs from the session with an end"
            );
            reserved.push(chunk.stats_decoded.reserved_bytes.all().current);
        }
        // Past the window and the condition's fixed point every chunk holds the same.
        let steady = &reserved[10..];
        assert!(
            steady.iter().all(|r| *r == steady[0]),
            "{allocator:?}: reserved after each chunk {reserved:?}"
        );
        // It goes on: nothing ends it but the caller.
        open.next_chunk().unwrap();
        drop(open);
        // Both sessions replayed the plan of their steady state's repeating chunks.
        let stats = engine.platform().memory_stats();
        assert_eq!(stats.planned_misses, 0, "{allocator:?}");
        if allocator == AllocatorPolicy::Planned {
            assert!(stats.planned_hits > 0);
            let book = engine.platform().allocator().plans();
            for frames in [" f0 ".to_string(), format!(" f{} ", 12 * chunks - 3)] {
                let key = book
                    .keys()
                    .find(|k| k.contains(&frames))
                    .unwrap()
                    .to_string();
                let plan = book.get(&key).unwrap();
                assert!(plan.period.is_some(), "{key}: no period");
            }
        }
        let after = engine.platform().memory_stats();
        assert_eq!(
            after.reserved_bytes.all().current,
            floor,
            "{allocator:?}: reserved back to the floor"
        );
    }
}

#[test]
fn what_has_an_end_of_its_own_is_refused_for_a_session_without_one() {
    let engine = engine(AllocatorPolicy::Pytorch);
    let dev = Device::cpu().unwrap();
    let trajectory = SessionRequest {
        trajectory: Some(Trajectory {
            poses: vec![IDENTITY; 2],
            intrinsics: Vec::new(),
        }),
        ..request(0)
    };
    let noise = SessionRequest {
        noise: NoiseSource::Supplied(
            Tensor::zeros(&[1, 4, 16, 3, 4, 6], DType::F32, &dev).unwrap(),
        ),
        ..request(0)
    };
    for (r, field) in [(trajectory, "trajectory"), (noise, "noise")] {
        match engine.open_session(r) {
            Err(EngineError::Request { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}
