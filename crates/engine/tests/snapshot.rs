//! Session snapshots: a session snapshotted after chunk K and resumed on a new engine
//! (another process, as far as the session can tell) makes the bytes of the
//! uninterrupted session from chunk K + 1 on — on every built-in model small enough to
//! run here and `world`, both decoders, f32, bf16 and 8-bit weights, an image, a camera
//! mid-transition, a pending prompt, an overlapped block, a session without an end and
//! the planned allocator — and a snapshot that cannot resume here is refused by name
//! before anything is allocated.

use headroom_engine::snapshot::{format::write_atomic, FORMAT_VERSION};
use headroom_engine::{
    Engine, EngineConfig, EngineError, Session, SessionRequest, SessionSnapshot, SnapshotFault,
};
use headroom_mem::{AllocatorConfig, AllocatorPolicy};
use headroom_model::camera::{CameraUpdate, Keys, UpdateMode};
use headroom_model::{DecoderKind, WeightFormat};
use headroom_tensor::{DType, Device, Tensor};

const WORLD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/world");

fn config(model: &str) -> EngineConfig {
    EngineConfig {
        model: model.to_string(),
        kv_budget_bytes: Some(64 << 20),
        ..EngineConfig::default()
    }
}

/// What happens before chunk `i` of a session (the same in every run).
type Prepare = fn(&mut Session, usize);

fn nothing(_: &mut Session, _: usize) {}

fn frames(session: &mut Session) -> Vec<u8> {
    session.next_chunk().unwrap().frames.to_vec::<u8>().unwrap()
}

/// Runs `chunks` chunks uninterrupted, then again with a snapshot after chunk `at`
/// (taken after `prepare(at + 1)`, so what it queued is in the snapshot) resumed on a
/// new engine of the same config through a file; the resumed chunks must be the bytes
/// of the uninterrupted ones.
fn resumes_byte_identically(
    config: &EngineConfig,
    request: &SessionRequest,
    chunks: usize,
    at: usize,
    prepare: Prepare,
) -> SessionSnapshot {
    let engine = Engine::new(config.clone()).unwrap();
    let mut whole = engine.open_session(request.clone()).unwrap();
    let mut want = Vec::new();
    for i in 0..chunks {
        prepare(&mut whole, i);
        want.push(frames(&mut whole));
    }
    drop(whole);

    let mut first = engine.open_session(request.clone()).unwrap();
    for (i, want) in want.iter().enumerate().take(at + 1) {
        prepare(&mut first, i);
        assert_eq!(&frames(&mut first), want, "chunk {i} before the snapshot");
    }
    prepare(&mut first, at + 1);
    let snapshot = first.snapshot().unwrap();
    assert_eq!(snapshot.progress.chunks_done, at + 1);
    // The snapshot changes nothing: the session itself goes on to the same bytes.
    assert_eq!(
        frames(&mut first),
        want[at + 1],
        "the snapshotted session goes on"
    );
    drop(first);
    drop(engine);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("chunk-{at}.hrsnap"));
    snapshot.write(&path).unwrap();
    let other = Engine::new(config.clone()).unwrap();
    let mut resumed = other.resume(path.as_path()).unwrap();
    assert_eq!(resumed.chunks_done(), at + 1);
    for (i, want) in want.iter().enumerate().skip(at + 1) {
        if i > at + 1 {
            prepare(&mut resumed, i);
        }
        assert_eq!(&frames(&mut resumed), want, "resumed chunk {i}");
    }
    if request.num_frames > 0 {
        assert!(matches!(
            resumed.next_chunk(),
            Err(EngineError::Finished(_))
        ));
    }
    snapshot
}

fn image(height: usize, width: usize) -> Tensor {
    let values: Vec<f32> = (0..3 * height * width)
        .map(|i| ((i * 29 % 97) as f32 / 48.0) - 1.0)
        .collect();
    Tensor::from_slice(&values, &[3, height, width], &Device::cpu().unwrap()).unwrap()
}

#[test]
fn tiny_resumes_byte_identically_after_each_chunk_with_an_image_both_decoders() {
    let request = SessionRequest {
        seed: 5,
        image: Some(image(32, 48)),
        ..SessionRequest::new(48, 32, 45)
    };
    for decoder in [DecoderKind::Full, DecoderKind::Tiny] {
        let config = EngineConfig {
            decoder,
            ..config("tiny")
        };
        for at in [0, 2] {
            let snap = resumes_byte_identically(&config, &request, 4, at, nothing);
            let parts: Vec<&str> = snap.parts().iter().map(|p| p.0).collect();
            for part in ["kv", "text", "condition", "decoder", "session"] {
                assert!(parts.contains(&part), "{decoder}: {parts:?}");
            }
        }
    }
}

#[test]
fn bf16_and_8bit_weights_resume_byte_identically() {
    let request = SessionRequest::new(48, 32, 33);
    for (dtype, weights) in [
        (DType::BF16, WeightFormat::Native),
        (DType::BF16, WeightFormat::Int8),
        (DType::BF16, WeightFormat::Fp8),
    ] {
        let config = EngineConfig {
            weight_dtype: dtype,
            weights,
            ..config("tiny")
        };
        resumes_byte_identically(&config, &request, 3, 0, nothing);
    }
}

fn target_over_three_chunks(s: &mut Session, i: usize) {
    if i == 1 {
        s.interact(CameraUpdate {
            mode: UpdateMode::Target,
            translation: [0.4, 0.0, 0.9],
            rotation: [0.0, 0.2, 0.0, 1.0],
            transition_chunks: 3.0,
        })
        .unwrap();
    }
    if i == 2 {
        // A prompt change pending at the snapshot after chunk 1.
        let text = Tensor::from_slice(
            &(0..5 * 16)
                .map(|v| (v as f32 * 0.37).sin())
                .collect::<Vec<_>>(),
            &[5, 16],
            &Device::cpu().unwrap(),
        )
        .unwrap();
        s.set_text_embeds(&text).unwrap();
    }
}

#[test]
fn a_camera_mid_transition_and_a_pending_prompt_resume_byte_identically() {
    let request = SessionRequest::new(48, 32, 57);
    // After chunk 1 the target is one chunk into its three and a prompt is pending.
    let snap = resumes_byte_identically(&config("tiny"), &request, 5, 1, target_over_three_chunks);
    assert!(snap.parts().iter().any(|p| p.0 == "pending_text"));
    resumes_byte_identically(&config("tiny"), &request, 5, 2, target_over_three_chunks);
}

#[test]
fn an_overlapped_block_and_an_open_ended_session_resume_byte_identically() {
    let overlap = SessionRequest {
        overlap: true,
        actions: Keys::script("wwddaa+wjjll").unwrap(),
        ..SessionRequest::new(48, 32, 45)
    };
    let snap = resumes_byte_identically(&config("tiny"), &overlap, 4, 1, nothing);
    assert!(
        snap.parts().iter().any(|p| p.0 == "pending"),
        "the block denoised ahead"
    );
    // No end: past the KV window (18 frames = 6 blocks) so eviction is in the history.
    let open = SessionRequest::new(48, 32, 0);
    let snap = resumes_byte_identically(&config("tiny"), &open, 9, 6, nothing);
    assert_eq!(snap.progress.horizon, None);
}

#[test]
fn a_file_trajectory_and_supplied_noise_resume_byte_identically() {
    use headroom_model::camera::Trajectory;
    // 33 frames: a camera sliding right and turning, one pose per pixel frame.
    let poses = (0..33)
        .map(|i| {
            let (t, a) = (i as f64 * 0.03, i as f64 * 0.01);
            [
                [a.cos(), 0.0, a.sin(), t],
                [0.0, 1.0, 0.0, 0.0],
                [-a.sin(), 0.0, a.cos(), 0.0],
                [0.0, 0.0, 0.0, 1.0],
            ]
        })
        .collect();
    let trajectory = Trajectory::new(poses, Vec::new()).unwrap();
    let request = SessionRequest {
        trajectory: Some(trajectory),
        ..SessionRequest::new(48, 32, 33)
    };
    resumes_byte_identically(&config("tiny"), &request, 3, 0, nothing);
    // Noise supplied for every draw: [blocks, steps, C, 3, h, w].
    let n = 3 * 4 * 16 * 3 * 4 * 6;
    let values: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let noise = Tensor::from_slice(&values, &[3, 4, 16, 3, 4, 6], &Device::cpu().unwrap()).unwrap();
    let request = SessionRequest {
        noise: headroom_engine::NoiseSource::Supplied(noise),
        ..SessionRequest::new(48, 32, 33)
    };
    let snap = resumes_byte_identically(&config("tiny"), &request, 3, 1, nothing);
    assert!(snap.parts().iter().any(|p| p.0 == "noise"));
}

#[test]
fn the_planned_allocator_resumes_byte_identically() {
    let config = EngineConfig {
        allocator: AllocatorConfig::with_policy(AllocatorPolicy::Planned),
        ..config("tiny")
    };
    resumes_byte_identically(&config, &SessionRequest::new(48, 32, 45), 4, 1, nothing);
}

#[test]
fn small_resumes_byte_identically() {
    let request = SessionRequest {
        image: Some(image(32, 48)),
        ..SessionRequest::new(48, 32, 33)
    };
    resumes_byte_identically(&config("small"), &request, 3, 0, nothing);
}

#[test]
fn world_resumes_byte_identically_with_both_decoders() {
    let request = SessionRequest {
        seed: 3,
        actions: Keys::script("wwww+dw+dddll").unwrap(),
        ..SessionRequest::new(128, 96, 33)
    };
    for decoder in [DecoderKind::Full, DecoderKind::Tiny] {
        let config = EngineConfig {
            decoder,
            ..config(WORLD)
        };
        resumes_byte_identically(&config, &request, 3, 0, nothing);
    }
}

fn snapshot_of(config: &EngineConfig) -> Vec<u8> {
    let engine = Engine::new(config.clone()).unwrap();
    let mut s = engine
        .open_session(SessionRequest::new(48, 32, 33))
        .unwrap();
    s.next_chunk().unwrap();
    s.snapshot().unwrap().to_bytes().unwrap()
}

fn refusal(engine: &Engine, bytes: &[u8]) -> (SnapshotFault, String) {
    let before = engine.platform().memory_stats().allocated_now();
    let e = engine.resume(bytes).unwrap_err();
    assert_eq!(
        engine.platform().memory_stats().allocated_now(),
        before,
        "nothing allocated for a refused snapshot"
    );
    (e.snapshot_fault().expect("a snapshot error"), e.to_string())
}

#[test]
fn a_snapshot_that_cannot_resume_here_is_refused_by_name_before_any_allocation() {
    let bytes = snapshot_of(&config("tiny"));
    let engine = Engine::new(config("tiny")).unwrap();
    // Truncated anywhere.
    for cut in [3, 100, bytes.len() / 2, bytes.len() - 1] {
        let (fault, msg) = refusal(&engine, &bytes[..cut]);
        assert_eq!(fault, SnapshotFault::Truncated, "cut at {cut}: {msg}");
    }
    // A bit flipped in the tensor data.
    let mut flipped = bytes.clone();
    let at = flipped.len() - 10;
    flipped[at] ^= 0x10;
    let (fault, msg) = refusal(&engine, &flipped);
    assert_eq!(fault, SnapshotFault::Corrupt);
    assert!(msg.contains("checksum"), "{msg}");
    // Another model, dtype, decoder, KV window.
    for (other, what) in [
        (config("small"), "model architecture"),
        (
            EngineConfig {
                weight_dtype: DType::BF16,
                ..config("tiny")
            },
            "dtype",
        ),
        (
            EngineConfig {
                weight_seed: 9,
                ..config("tiny")
            },
            "weights",
        ),
        (
            EngineConfig {
                window_frames: 12,
                ..config("tiny")
            },
            "kv window",
        ),
    ] {
        let other = Engine::new(other).unwrap();
        let (fault, msg) = refusal(&other, &bytes);
        assert_eq!(fault, SnapshotFault::Mismatch, "{msg}");
        assert!(msg.contains(what), "{what}: {msg}");
    }
    // Another format version: the header's version string changed (same length).
    let version = format!("\"version\":\"{FORMAT_VERSION}\"");
    let text = String::from_utf8_lossy(&bytes).to_string();
    assert!(text.contains(&version));
    let newer = bytes
        .windows(version.len())
        .position(|w| w == version.as_bytes())
        .unwrap();
    let mut v = bytes.clone();
    v[newer + version.len() - 2] = b'9';
    let (fault, msg) = refusal(&engine, &v);
    assert_eq!(fault, SnapshotFault::Version, "{msg}");
    // The good bytes still resume.
    engine.resume(bytes.as_slice()).unwrap();
}

#[test]
fn a_snapshot_of_an_ended_session_is_refused_and_a_written_one_is_whole() {
    let engine = Engine::new(config("tiny")).unwrap();
    let mut s = engine.open_session(SessionRequest::new(48, 32, 9)).unwrap();
    s.next_chunk().unwrap();
    let done = s.snapshot().unwrap();
    assert_eq!(done.progress.horizon, Some(1));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.hrsnap");
    let written = done.write(&path).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), written);
    assert!(write_atomic(&dir.path().join("no/such/dir/x"), b"1").is_err());
    // A resumed session that has made every chunk is finished.
    let mut again = engine.resume(path.as_path()).unwrap();
    assert!(matches!(again.next_chunk(), Err(EngineError::Finished(_))));
}

#[test]
fn a_mesh_session_resumes_from_each_ranks_shard_and_refuses_another_mesh() {
    use headroom_engine::replicated::{follow, lead_open, lead_resume, lead_shutdown, shard_path};
    use headroom_engine::{Mesh, Placement};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chunk-0.hrsnap");
    let request = SessionRequest {
        actions: Keys::script("wwwddd+jj").unwrap(),
        ..SessionRequest::new(64, 32, 33)
    };
    let mesh = Mesh { tp: 2, sp: 2 };
    // One mesh runs the whole session, snapshotting after chunk 0; a second mesh (new
    // engines) resumes from the shards.
    let run = |resume: bool| {
        let (request, path) = (request.clone(), path.clone());
        mesh.run_threads(move |groups| {
            let engine = Engine::load(
                config("tiny"),
                Placement::rank(Device::new(config("tiny").cpu_platform()?), &groups),
            )?;
            if groups.rank() != 0 {
                follow(&engine, &groups.world)?;
                return Ok(None);
            }
            let mut session = if resume {
                lead_resume(&engine, &groups.world, &path)?
            } else {
                lead_open(&engine, &groups.world, request.clone())?
            };
            let mut out = Vec::new();
            let start = session.session().map_or(0, Session::chunks_done);
            for i in start..3 {
                out.push(session.next_chunk()?.frames.to_vec::<u8>()?);
                if !resume && i == 0 {
                    session.snapshot_to(&path)?;
                }
            }
            session.close(&engine)?;
            lead_shutdown(&groups.world)?;
            Ok(Some(out))
        })
        .unwrap()
        .into_iter()
        .flatten()
        .next()
        .unwrap()
    };
    let whole = run(false);
    for rank in 0..4 {
        assert!(shard_path(&path, rank).is_file(), "rank {rank}'s shard");
    }
    assert_eq!(
        shard_path(&path, 3).file_name().unwrap(),
        "chunk-0.rank-3.hrsnap"
    );
    let resumed = run(true);
    assert_eq!(resumed, whole[1..], "the resumed mesh makes chunks 1 and 2");
    // A shard on an engine alone (another mesh shape) is refused, naming the mesh.
    let alone = Engine::new(config("tiny")).unwrap();
    let e = alone.resume(path.as_path()).unwrap_err();
    assert_eq!(e.snapshot_fault(), Some(SnapshotFault::Mismatch));
    assert!(
        e.to_string()
            .contains("mesh: snapshot tp 2 sp 2 rank 0, here tp 1 sp 1 rank 0"),
        "{e}"
    );
}

#[test]
fn the_estimate_is_the_bytes_of_a_steady_state_snapshot() {
    for (model, w, h, decoder, overlap) in [
        ("tiny", 48, 32, DecoderKind::Full, false),
        ("tiny", 64, 32, DecoderKind::Tiny, true),
        (WORLD, 128, 96, DecoderKind::Full, false),
    ] {
        let engine = Engine::new(EngineConfig {
            decoder,
            ..config(model)
        })
        .unwrap();
        let text_dim = engine.transformer().config().text_dim;
        let text = Tensor::zeros(&[7, text_dim], DType::F32, &Device::cpu().unwrap()).unwrap();
        let mut s = engine
            .open_session(SessionRequest {
                text_embeds: Some(text),
                decoder: Some(decoder),
                overlap,
                ..SessionRequest::new(w, h, 0)
            })
            .unwrap();
        let want = engine
            .snapshot_estimate(w, h, Some(decoder), overlap)
            .unwrap();
        // Past the KV window and until the image condition settles (its encoder cache
        // is then freed).
        let mut snap = None;
        for _ in 0..40 {
            s.next_chunk().unwrap();
            let taken = s.snapshot().unwrap();
            let encoder = taken
                .parts()
                .iter()
                .find(|p| p.0 == "condition")
                .map_or(0, |p| p.2);
            if s.chunks_done() >= 6 && encoder == want.condition_bytes {
                snap = Some(taken);
                break;
            }
        }
        let snap = snap.unwrap_or_else(|| panic!("{model}: the condition never settled"));
        let part = |name: &str| snap.parts().iter().find(|p| p.0 == name).map_or(0, |p| p.2);
        let got = [
            part("kv"),
            part("text"),
            part("condition"),
            part("decoder"),
            part("pending"),
        ];
        let est = [
            want.kv_bytes,
            want.text_bytes,
            want.condition_bytes,
            want.decoder_bytes,
            want.pending_bytes,
        ];
        assert_eq!(got, est, "{model} {w}x{h} {decoder} overlap {overlap}");
        assert_eq!(snap.state_bytes(), want.total_bytes);
    }
}

fn text_blend_over_three_chunks(s: &mut Session, i: usize) {
    if i == 1 {
        let text = Tensor::from_slice(
            &(0..5 * 16)
                .map(|v| (v as f32 * 0.61).cos())
                .collect::<Vec<_>>(),
            &[5, 16],
            &Device::cpu().unwrap(),
        )
        .unwrap();
        s.set_text_embeds_over(&text, 3.0).unwrap();
    }
}

#[test]
fn a_prompt_blend_resumes_byte_identically_before_and_inside_its_transition() {
    let request = SessionRequest::new(48, 32, 69);
    for after in [1, 2, 3] {
        let snap = resumes_byte_identically(
            &config("tiny"),
            &request,
            6,
            after,
            text_blend_over_three_chunks,
        );
        // Inside the transition after chunks 1 and 2; done after chunk 3.
        let blending = snap.contents().0.contains_key("text.blend_from");
        assert_eq!(blending, after < 3, "after chunk {after}");
    }
}
