//! Sessions on the tiny built-in model: chunk sizes, determinism across seeds and reclaim
//! policies, residency across sequential sessions, and failure mid-chunk.

use headroom_engine::{Engine, EngineConfig, EngineError, SessionRequest};
use headroom_mem::ReclaimPolicy;

fn engine(reclaim: ReclaimPolicy) -> Engine {
    Engine::new(EngineConfig {
        model: "tiny".to_string(),
        reclaim,
        kv_budget_bytes: Some(64 << 20),
        ..EngineConfig::default()
    })
    .unwrap()
}

fn request(seed: u64) -> SessionRequest {
    SessionRequest {
        seed,
        ..SessionRequest::new(48, 32, 33)
    }
}

fn run(engine: &Engine, request: SessionRequest) -> Vec<Vec<u8>> {
    let mut session = engine.open_session(request).unwrap();
    let mut out = Vec::new();
    for _ in 0..session.chunks_total().unwrap() {
        out.push(session.next_chunk().unwrap().frames.to_vec::<u8>().unwrap());
    }
    out
}

#[test]
fn a_session_yields_9_then_12_frame_chunks_of_rgb_pixels() {
    let engine = engine(ReclaimPolicy::Never);
    let mut session = engine.open_session(request(1)).unwrap();
    assert_eq!(session.chunks_total(), Some(3));
    let mut sizes = Vec::new();
    for i in 0..3 {
        let chunk = session.next_chunk().unwrap();
        assert_eq!(chunk.index, i);
        assert_eq!(&chunk.frames.shape()[1..], [32, 48, 3]);
        sizes.push(chunk.frames.shape()[0]);
    }
    assert_eq!(sizes, [9, 12, 12]);
    assert!(matches!(
        session.next_chunk(),
        Err(EngineError::Finished(_))
    ));
}

#[test]
fn same_seed_gives_identical_bytes_whatever_the_reclaim_policy() {
    let never = run(&engine(ReclaimPolicy::Never), request(7));
    let again = run(&engine(ReclaimPolicy::Never), request(7));
    let before_decode = run(&engine(ReclaimPolicy::BeforeDecode), request(7));
    let always = run(&engine(ReclaimPolicy::Always), request(7));
    assert_eq!(never, again);
    assert_eq!(never, before_decode);
    assert_eq!(never, always);
    assert_ne!(never, run(&engine(ReclaimPolicy::Never), request(8)));
}

#[test]
fn sequential_sessions_leave_the_same_residency_and_never_leak_a_page() {
    let engine = engine(ReclaimPolicy::BeforeDecode);
    let mut after_close = Vec::new();
    for i in 0..20 {
        let request = SessionRequest {
            num_frames: 9,
            ..request(i)
        };
        run(&engine, request);
        after_close.push(
            engine
                .platform()
                .memory_stats()
                .reserved_bytes
                .all()
                .current,
        );
        let pool = engine.kv_pool().unwrap();
        assert_eq!(pool.free_pages(), pool.total_pages());
    }
    assert!(
        after_close.iter().all(|&r| r == after_close[0]),
        "{after_close:?}"
    );
}

#[test]
fn a_session_that_fails_mid_chunk_releases_everything_and_the_next_succeeds() {
    let engine = engine(ReclaimPolicy::Never);
    let allocated = || {
        engine
            .platform()
            .memory_stats()
            .allocated_bytes
            .all()
            .current
    };
    run(&engine, request(1));
    let idle = allocated();
    let mut session = engine.open_session(request(2)).unwrap();
    session.next_chunk().unwrap();
    engine.platform().allocator().inject_oom_after(Some(300));
    let err = session.next_chunk().unwrap_err();
    assert!(err.to_string().contains("out of memory"), "{err}");
    drop(session);
    assert_eq!(allocated(), idle);
    let pool = engine.kv_pool().unwrap();
    assert_eq!(pool.free_pages(), pool.total_pages());
    assert_eq!(run(&engine, request(3)).len(), 3);
}

#[test]
fn bad_requests_are_refused_with_the_field_and_the_rule() {
    let engine = engine(ReclaimPolicy::Never);
    let cases = [
        (SessionRequest::new(50, 32, 33), "width/height"),
        (SessionRequest::new(48, 32, 34), "num_frames"),
        (
            SessionRequest {
                steps: 0,
                ..request(1)
            },
            "steps",
        ),
    ];
    for (r, field) in cases {
        let err = engine.open_session(r).unwrap_err().to_string();
        assert!(err.starts_with("request:") && err.contains(field), "{err}");
    }
    let err = Engine::new(EngineConfig {
        model: "huge".into(),
        ..EngineConfig::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("unknown model") && err.contains("tiny"),
        "{err}"
    );
}

#[test]
fn sessions_beyond_the_kv_budget_are_refused_at_admission() {
    let engine = Engine::new(EngineConfig {
        model: "tiny".to_string(),
        // One session's 18 pages of 12,288 B each (16 tokens; a frame of 6 takes one), not
        // two.
        kv_budget_bytes: Some(300_000),
        ..EngineConfig::default()
    })
    .unwrap();
    let first = engine.open_session(request(1)).unwrap();
    let err = match engine.open_session(request(2)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a second session was admitted"),
    };
    assert!(
        err.starts_with("admission:") && err.contains("pages"),
        "{err}"
    );
    drop(first);
    assert!(engine.open_session(request(2)).is_ok());
}

#[test]
fn camera_actions_steer_the_video_deterministically() {
    use headroom_model::camera::Keys;
    let engine = engine(ReclaimPolicy::Never);
    let with = |script: &str| SessionRequest {
        actions: Keys::script(script).unwrap(),
        ..request(5)
    };
    let still = run(&engine, with(""));
    let forward = run(&engine, with("wwwwwwwww"));
    assert_eq!(forward, run(&engine, with("wwwwwwwww")));
    assert_ne!(forward, still);
    assert_eq!(
        still,
        run(&engine, with("---------")),
        "no keys equals no script"
    );
    let err = engine
        .open_session(with(&"w".repeat(10)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("actions")
            && err.contains("10 key sets for 33 frames, which are 9 latent frames"),
        "{err}"
    );
}

#[test]
fn camera_updates_take_effect_at_the_next_chunk_boundary() {
    use headroom_model::camera::{CameraUpdate, Keys, UpdateMode};
    let engine = engine(ReclaimPolicy::Never);
    let velocity = CameraUpdate {
        mode: UpdateMode::Velocity,
        translation: [0.0, 0.0, 0.05],
        rotation: [0.0, 0.0, 0.0, 1.0],
        transition_chunks: 1.0,
    };
    let chunks = |update_after_first: bool| {
        let mut session = engine.open_session(request(9)).unwrap();
        let first = session.next_chunk().unwrap().frames.to_vec::<u8>().unwrap();
        if update_after_first {
            session.interact(velocity).unwrap();
        }
        let second = session.next_chunk().unwrap().frames.to_vec::<u8>().unwrap();
        (first, second)
    };
    let (a1, a2) = chunks(false);
    let (b1, b2) = chunks(true);
    assert_eq!(a1, b1, "the chunk before the boundary is unchanged");
    assert_ne!(a2, b2, "the update steers the next chunk");
    let mut scripted = engine
        .open_session(SessionRequest {
            actions: Keys::script("www").unwrap(),
            ..request(9)
        })
        .unwrap();
    let err = scripted.interact(velocity).unwrap_err().to_string();
    assert!(err.contains("action script"), "{err}");
    let mut session = engine.open_session(request(9)).unwrap();
    let bad = CameraUpdate {
        translation: [f64::INFINITY, 0.0, 0.0],
        ..velocity
    };
    assert!(session
        .interact(bad)
        .unwrap_err()
        .to_string()
        .contains("finite"));
}

#[test]
fn overlapping_decode_with_the_next_denoise_gives_identical_bytes() {
    let engine = engine(ReclaimPolicy::BeforeDecode);
    let plain = run(&engine, request(11));
    let overlapped = run(
        &engine,
        SessionRequest {
            overlap: true,
            ..request(11)
        },
    );
    assert_eq!(plain, overlapped);
    let pool = engine.kv_pool().unwrap();
    assert_eq!(pool.free_pages(), pool.total_pages());
}

#[test]
fn reusing_the_last_step_kv_skips_the_commit_forward_and_changes_the_output() {
    let engine = engine(ReclaimPolicy::Never);
    let plain = run(&engine, request(12));
    let reused = run(
        &engine,
        SessionRequest {
            reuse_last_step_kv: true,
            ..request(12)
        },
    );
    assert_eq!(plain[0].len(), reused[0].len());
    assert_eq!(
        plain[0], reused[0],
        "the first block sees no history either way"
    );
    assert_ne!(
        plain[1], reused[1],
        "later blocks attend to noisy keys/values"
    );
}

#[test]
fn a_pipeline_folder_loads_and_mismatched_parts_are_refused() {
    let fixtures =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures");
    let dir = tempfile::tempdir().unwrap();
    for (part, src) in [("transformer", "dit/t2v"), ("vae", "vae/tiny_t1")] {
        let to = dir.path().join(part);
        std::fs::create_dir(&to).unwrap();
        for file in ["config.json", "diffusion_pytorch_model.safetensors"] {
            std::fs::copy(fixtures.join(src).join(file), to.join(file)).unwrap();
        }
    }
    let err = Engine::new(EngineConfig {
        model: dir.path().display().to_string(),
        ..EngineConfig::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("z_dim 4") && err.contains("16 in / 16 out"),
        "{err}"
    );
}

#[test]
fn text_embeddings_condition_the_video_and_bad_shapes_are_refused() {
    use headroom_tensor::{DType, Device, Tensor};
    let engine = engine(ReclaimPolicy::Never);
    let dev = Device::cpu().unwrap();
    let text = Tensor::randn(&[7, 16], 3, 0, DType::F32, &dev).unwrap();
    let with = run(
        &engine,
        SessionRequest {
            text_embeds: Some(text),
            num_frames: 9,
            ..request(4)
        },
    );
    let without = run(
        &engine,
        SessionRequest {
            num_frames: 9,
            ..request(4)
        },
    );
    assert_ne!(with, without);
    let bad = Tensor::zeros(&[7, 15], DType::F32, &dev).unwrap();
    let err = engine
        .open_session(SessionRequest {
            text_embeds: Some(bad),
            ..request(4)
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("text_embeds") && err.contains("[L, 16]"),
        "{err}"
    );
}

#[test]
fn a_pose_trajectory_steers_the_camera_and_cannot_be_mixed_with_keys() {
    use headroom_model::camera::{identity, Keys, Trajectory};
    let engine = engine(ReclaimPolicy::Never);
    let poses = (0..33)
        .map(|i| {
            let mut p = identity();
            p[0][3] = 0.02 * i as f64;
            p
        })
        .collect();
    let trajectory = Trajectory {
        poses,
        intrinsics: vec![],
    };
    let with = |t: Option<Trajectory>| SessionRequest {
        trajectory: t,
        ..request(6)
    };
    let moving = run(&engine, with(Some(trajectory.clone())));
    assert_ne!(moving, run(&engine, with(None)));
    assert_eq!(moving, run(&engine, with(Some(trajectory.clone()))));
    let both = SessionRequest {
        actions: Keys::script("w").unwrap(),
        ..with(Some(trajectory))
    };
    assert!(engine
        .open_session(both)
        .unwrap_err()
        .to_string()
        .contains("not both"));
}

#[test]
fn a_prompt_change_mid_stream_changes_only_the_chunks_after_the_boundary() {
    let engine = engine(ReclaimPolicy::Never);
    let prompted = |seed: u64| SessionRequest {
        prompt: Some("a cat runs across the green grass".to_string()),
        ..request(seed)
    };
    let chunks = |change_after_first: bool| {
        let mut session = engine.open_session(prompted(13)).unwrap();
        let first = session.next_chunk().unwrap().frames.to_vec::<u8>().unwrap();
        if change_after_first {
            session
                .set_prompt("snow falls on the quiet village")
                .unwrap();
        }
        let second = session.next_chunk().unwrap().frames.to_vec::<u8>().unwrap();
        (first, second)
    };
    let (a1, a2) = chunks(false);
    let (b1, b2) = chunks(true);
    assert_eq!(a1, b1, "the chunk before the boundary is unchanged");
    assert_ne!(a2, b2, "the new prompt conditions the next chunk");
    // The prompt conditions the video at all, and the same prompt gives the same bytes.
    let plain = run(&engine, request(13));
    let with_prompt = run(&engine, prompted(13));
    assert_ne!(plain, with_prompt);
    assert_eq!(with_prompt, run(&engine, prompted(13)));
    let report = engine.text_report().unwrap();
    assert!(
        report.cache_hits > 0,
        "repeated prompts come from the cache"
    );
}

#[test]
fn a_prompt_and_text_embeddings_cannot_be_mixed() {
    use headroom_tensor::{DType, Device, Tensor};
    let engine = engine(ReclaimPolicy::Never);
    let text = Tensor::zeros(&[7, 16], DType::F32, &Device::cpu().unwrap()).unwrap();
    let err = engine
        .open_session(SessionRequest {
            prompt: Some("a cat".to_string()),
            text_embeds: Some(text),
            ..request(1)
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("prompt") && err.contains("not both"), "{err}");
}

#[test]
fn sessions_of_two_sizes_share_the_kv_pool_which_grows_only_while_idle() {
    let engine = Engine::new(EngineConfig {
        model: "tiny".to_string(),
        max_sessions: 2,
        ..EngineConfig::default()
    })
    .unwrap();
    let large = |seed| SessionRequest {
        seed,
        ..SessionRequest::new(128, 96, 21)
    };
    // 6 tokens a frame take one page of 16, 48 take three.
    assert_eq!(engine.kv_pages_for(48, 32), 18);
    assert_eq!(engine.kv_pages_for(128, 96), 54);
    let small = engine.open_session(request(1)).unwrap();
    let pool = engine.kv_pool().unwrap();
    assert_eq!(pool.total_pages(), 36, "two sessions of the first size");
    let err = match engine.open_session(large(2)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a session larger than the pool was admitted"),
    };
    assert!(
        err.starts_with("admission:") && err.contains("54") && err.contains("pages"),
        "{err}"
    );
    drop(small);
    let mut big = engine.open_session(large(2)).unwrap();
    let pool = engine.kv_pool().unwrap();
    assert_eq!(
        pool.total_pages(),
        108,
        "rebuilt for two of the larger size"
    );
    // Now both sizes run side by side from the one pool.
    let mut small = engine.open_session(request(1)).unwrap();
    assert_eq!(pool.free_pages(), 108 - 54 - 18);
    big.next_chunk().unwrap();
    small.next_chunk().unwrap();
    drop((big, small));
    assert_eq!(pool.free_pages(), pool.total_pages());
}

#[test]
fn a_sessions_chunks_iterate_to_none_with_the_bytes_of_next_chunk() {
    let engine = engine(ReclaimPolicy::Never);
    let request = || SessionRequest::new(48, 32, 21);
    let mut stepped = engine.open_session(request()).unwrap();
    let expected: Vec<Vec<u8>> = (0..2)
        .map(|_| stepped.next_chunk().unwrap().frames.to_vec::<u8>().unwrap())
        .collect();
    let mut session = engine.open_session(request()).unwrap();
    let got: Vec<Vec<u8>> = session
        .chunks()
        .map(|c| c.unwrap().frames.to_vec::<u8>().unwrap())
        .collect();
    assert_eq!(got, expected);
    assert!(session.chunks().next().is_none(), "the end stays the end");
    // By value too.
    assert_eq!(
        engine.open_session(request()).unwrap().into_iter().count(),
        2
    );
}

#[test]
fn a_camera_update_starts_at_the_frame_it_is_queued_for() {
    use headroom_model::camera::{CameraUpdate, UpdateMode};
    let engine = engine(ReclaimPolicy::Never);
    let velocity = CameraUpdate {
        mode: UpdateMode::Velocity,
        translation: [0.0, 0.0, 0.2],
        rotation: [0.0, 0.1, 0.0, 1.0],
        transition_chunks: 1.0,
    };
    let second_chunk = |frame: Option<usize>| {
        let mut session = engine.open_session(request(9)).unwrap();
        session.next_chunk().unwrap();
        if let Some(frame) = frame {
            session.interact_at(velocity, frame).unwrap();
        }
        session.next_chunk().unwrap().frames.to_vec::<u8>().unwrap()
    };
    let none = second_chunk(None);
    let at_0 = second_chunk(Some(0));
    let at_3 = second_chunk(Some(3));
    let at_8 = second_chunk(Some(8));
    let at_11 = second_chunk(Some(11));
    // Frames 0–3 decode from latent frame 0: an update at frame 3 starts with it.
    assert_eq!(at_0, at_3);
    assert_ne!(at_8, at_0, "frame 8 is latent frame 2");
    assert_eq!(at_8, at_11, "frames 8–11 are latent frame 2");
    assert_ne!(at_8, none, "the update still steers the chunk");
    let mut plain = engine.open_session(request(9)).unwrap();
    plain.next_chunk().unwrap();
    plain.interact(velocity).unwrap();
    assert_eq!(
        plain.next_chunk().unwrap().frames.to_vec::<u8>().unwrap(),
        at_0
    );
}

#[test]
fn a_blended_text_change_conditions_each_chunk_of_its_transition_on_the_lerp_and_then_on_the_new_text(
) {
    use headroom_tensor::{DType, Device, Tensor};
    let engine = engine(ReclaimPolicy::Never);
    let cpu = Device::cpu().unwrap();
    let dim = engine.transformer().config().text_dim;
    // Two texts, padded to the 512 rows a session conditions on.
    let text = |k: f32| -> Vec<f32> {
        (0..512 * dim)
            .map(|i| ((i as f32 * 0.37 + k).sin()) * 0.5)
            .collect()
    };
    let (from, to) = (text(0.0), text(1.7));
    let tensor = |v: &[f32]| Tensor::from_f32(v, &[512, dim], DType::F32, &cpu).unwrap();
    let open = || {
        engine
            .open_session(SessionRequest {
                text_embeds: Some(tensor(&from)),
                seed: 21,
                ..SessionRequest::new(48, 32, 57)
            })
            .unwrap()
    };
    let frames =
        |s: &mut headroom_engine::Session| s.next_chunk().unwrap().frames.to_vec::<u8>().unwrap();
    // Blended over 3 chunks after the first.
    let mut blended = open();
    let mut got = vec![frames(&mut blended)];
    blended.set_text_embeds_over(&tensor(&to), 3.0).unwrap();
    let mut blending = Vec::new();
    for _ in 0..4 {
        blending.push(blended.prompt_blending());
        got.push(frames(&mut blended));
    }
    assert_eq!(
        blending,
        [true, true, true, false],
        "the blend covers 3 chunks"
    );
    // The same by hand: a third, two thirds, then the new text, each at once.
    let mut by_hand = open();
    let mut want = vec![frames(&mut by_hand)];
    for a in [1.0f32 / 3.0, 2.0 / 3.0, 1.0, 1.0] {
        let mix: Vec<f32> = if a >= 1.0 {
            to.clone()
        } else {
            from.iter()
                .zip(&to)
                .map(|(&x, &y)| (1.0 - a) * x + a * y)
                .collect()
        };
        by_hand.set_text_embeds(&tensor(&mix)).unwrap();
        want.push(frames(&mut by_hand));
    }
    assert_eq!(got, want);
    // At once differs from blended in the transition.
    let mut snapped = open();
    let first = frames(&mut snapped);
    snapped.set_text_embeds(&tensor(&to)).unwrap();
    assert_eq!(first, got[0]);
    assert_ne!(frames(&mut snapped), got[1]);
    // A bad transition is refused by name.
    let err = blended
        .set_text_embeds_over(&tensor(&to), f64::NAN)
        .unwrap_err()
        .to_string();
    assert!(err.contains("transition_chunks"), "{err}");
}
