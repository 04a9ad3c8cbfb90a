//! The whole stepwise loop against the reference rollout of `tools/reference_rollout.py`
//! (diffusers full-sequence forwards with per-token timesteps and the window's attention
//! mask): noise injected, 8 blocks so that blocks 6 and 7 run past the first KV eviction,
//! the camera adapter in both cases, image conditioning (36 channels), a camera velocity
//! interaction and a prompt change at a chunk boundary in the i2v case; and the layout
//! of a 4× VAE (`dim_mult [1, 2, 2]`, 4× in time too) under a patch `[1, 4, 4]` DiT whose
//! camera adapter takes rays folded 4×4, image-conditioned and driven by a key script.
//! Every block's clean latents must be within 1e-4 (relative to the block's largest
//! value) of the reference's.

use std::path::PathBuf;
use std::sync::Arc;

use headroom_engine::{
    Engine, EngineConfig, EngineError, LatentRecorder, NoiseSource, SessionRequest,
};
use headroom_model::camera::{CameraUpdate, Keys, UpdateMode};
use headroom_tensor::io::npy::read_npy;
use headroom_tensor::{Device, Tensor};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rollout")
        .join(name)
}

/// One camera interaction of a scenario, queued before chunk `chunk`.
#[derive(serde::Deserialize)]
struct Event {
    chunk: usize,
    mode: String,
    translation: [f64; 3],
    rotation: [f64; 4],
}

/// What `scenario.json` says the reference ran.
#[derive(serde::Deserialize)]
struct Scenario {
    width: usize,
    height: usize,
    frames: usize,
    blocks: usize,
    steps: usize,
    flow_shift: f64,
    sink_frames: usize,
    window_frames: usize,
    actions: String,
    events: Vec<Event>,
    prompt_change_chunk: Option<usize>,
}

fn scenario(dir: &std::path::Path) -> Scenario {
    let text = std::fs::read_to_string(dir.join("scenario.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn engine(dir: &std::path::Path, s: &Scenario) -> Engine {
    Engine::new(EngineConfig {
        model: dir.display().to_string(),
        sink_frames: s.sink_frames,
        window_frames: s.window_frames,
        ..EngineConfig::default()
    })
    .unwrap()
}

fn request(dir: &std::path::Path, s: &Scenario, host: &Device) -> SessionRequest {
    let image = dir.join("image.npy");
    SessionRequest {
        steps: s.steps,
        flow_shift: Some(s.flow_shift),
        text_embeds: Some(read_npy(dir.join("text_a.npy"), host).unwrap()),
        image: image.exists().then(|| read_npy(image, host).unwrap()),
        actions: Keys::script(&s.actions).unwrap(),
        noise: NoiseSource::Supplied(read_npy(dir.join("noise.npy"), host).unwrap()),
        ..SessionRequest::new(s.width, s.height, s.frames)
    }
}

/// Runs the scenario of fixture `name` (decoding on a second thread with `overlap`) and
/// returns, per block, the largest absolute difference to the reference divided by the
/// reference block's largest value.
fn relative_errors(name: &str, overlap: bool) -> Vec<f32> {
    let dir = fixture(name);
    let s = scenario(&dir);
    let host = Device::cpu().unwrap();
    let engine = engine(&dir, &s);
    let recorder = Arc::new(LatentRecorder::default());
    let mut session = engine
        .open_session(SessionRequest {
            latent_sink: Some(Arc::clone(&recorder) as _),
            overlap,
            ..request(&dir, &s, &host)
        })
        .unwrap();
    assert_eq!(session.chunks_total(), Some(s.blocks));
    let text_b = read_npy(dir.join("text_b.npy"), &host).unwrap();
    for chunk in 0..s.blocks {
        for e in s.events.iter().filter(|e| e.chunk == chunk) {
            let mode = match e.mode.as_str() {
                "velocity" => UpdateMode::Velocity,
                _ => UpdateMode::Target,
            };
            session
                .interact(CameraUpdate {
                    mode,
                    translation: e.translation,
                    rotation: e.rotation,
                    transition_chunks: 1.0,
                })
                .unwrap();
        }
        if s.prompt_change_chunk == Some(chunk) {
            session.set_text_embeds(&text_b).unwrap();
        }
        session.next_chunk().unwrap();
    }
    let expected: Tensor = read_npy(dir.join("latents.npy"), &host).unwrap();
    let per_block = expected.numel() / s.blocks;
    let expected = expected.to_vec::<f32>().unwrap();
    assert_eq!(recorder.len(), s.blocks);
    (0..s.blocks)
        .map(|b| {
            let got = recorder.block(b).unwrap();
            let want = &expected[b * per_block..(b + 1) * per_block];
            assert_eq!(got.len(), want.len());
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let err = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            err / scale
        })
        .collect()
}

fn assert_within_reference(name: &str, overlap: bool) {
    let errors = relative_errors(name, overlap);
    let shown: Vec<String> = errors.iter().map(|e| format!("{e:.1e}")).collect();
    println!(
        "{name} (overlap {overlap}): max relative error per block {}",
        shown.join(" ")
    );
    for (b, e) in errors.iter().enumerate() {
        assert!(*e <= 1e-4, "{name}: block {b} is {e:e} from the reference");
    }
}

#[test]
fn every_block_of_a_t2v_camera_script_rollout_matches_the_reference_past_the_eviction() {
    assert_within_reference("t2v_cam", false);
}

#[test]
fn decoding_on_a_second_thread_keeps_every_block_on_the_reference() {
    assert_within_reference("t2v_cam", true);
}

#[test]
fn every_block_of_an_i2v_rollout_with_velocity_and_prompt_change_matches_the_reference() {
    assert_within_reference("i2v_cam", false);
}

#[test]
fn every_block_of_a_4x_vae_patch_4_camera_script_i2v_rollout_matches_the_reference() {
    assert_within_reference("i2v_cam_s4", false);
}

#[test]
fn supplied_noise_of_the_wrong_shape_is_refused_naming_the_expected_one() {
    let dir = fixture("t2v_cam");
    let s = scenario(&dir);
    let host = Device::cpu().unwrap();
    let engine = engine(&dir, &s);
    let short = Tensor::zeros(
        &[2, s.steps, 16, 3, 6, 8],
        headroom_tensor::DType::F32,
        &host,
    )
    .unwrap();
    let err = engine
        .open_session(SessionRequest {
            noise: NoiseSource::Supplied(short),
            ..request(&dir, &s, &host)
        })
        .unwrap_err();
    assert!(matches!(err, EngineError::Request { field: "noise", .. }));
    let text = err.to_string();
    assert!(
        text.contains(&format!("[{}, {}, 16, 3, 6, 8]", s.blocks, s.steps)),
        "{text}"
    );
}
