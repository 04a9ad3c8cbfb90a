//! The trained `world` model (`models/world/`), loaded through the same diffusers
//! folder loader as every checkpoint: its own size and first frame, identical bytes
//! across reclaim policies and allocators, and keys that change the video.

use headroom_engine::first_frame;
use headroom_engine::{Engine, EngineConfig, SessionRequest};
use headroom_mem::{AllocatorConfig, AllocatorPolicy, ReclaimPolicy};
use headroom_model::camera::Keys;
use headroom_tensor::Device;

const WORLD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/world");

fn engine(allocator: AllocatorPolicy, reclaim: ReclaimPolicy) -> Engine {
    engine_at(WORLD, allocator, reclaim)
}

fn engine_at(model: &str, allocator: AllocatorPolicy, reclaim: ReclaimPolicy) -> Engine {
    Engine::new(EngineConfig {
        model: model.to_string(),
        allocator: AllocatorConfig::with_policy(allocator),
        reclaim,
        ..EngineConfig::default()
    })
    .unwrap()
}

fn request(keys: &str) -> SessionRequest {
    SessionRequest {
        seed: 3,
        actions: Keys::script(keys).unwrap(),
        ..SessionRequest::new(128, 96, 33)
    }
}

/// Every frame, `[33][96·128·3]` RGB bytes.
fn run(engine: &Engine, request: SessionRequest) -> Vec<Vec<u8>> {
    let mut session = engine.open_session(request).unwrap();
    let mut out = Vec::new();
    for _ in 0..session.chunks_total().unwrap() {
        let frames = session.next_chunk().unwrap().frames;
        let bytes = frames.to_vec::<u8>().unwrap();
        out.extend(bytes.chunks(96 * 128 * 3).map(<[u8]>::to_vec));
    }
    out
}

#[test]
fn the_world_model_has_its_own_size_and_camera_adapter() {
    let e = engine(AllocatorPolicy::Planned, ReclaimPolicy::BeforeDecode);
    assert_eq!(e.native_size(), Some((128, 96)));
    assert_eq!(
        first_frame::native_size(std::path::Path::new(WORLD)),
        Some((128, 96))
    );
    assert!(e.transformer().has_camera());
    assert_eq!(e.transformer().config().in_channels, 36);
}

#[test]
fn worlds_own_tiny_decoder_decodes_its_sessions_close_to_the_full_decoder() {
    let e = Engine::new(EngineConfig {
        model: WORLD.to_string(),
        decoder: headroom_model::DecoderKind::Tiny,
        ..EngineConfig::default()
    })
    .unwrap();
    let tiny = e
        .tiny_decoder()
        .expect("the folder's tiny_decoder.safetensors");
    assert!(
        tiny.config().widths[0] < 64,
        "narrow: {:?}",
        tiny.config().widths
    );
    let with = |decoder| SessionRequest {
        decoder: Some(decoder),
        ..request("wwwdddlll")
    };
    let tiny_frames = run(&e, with(headroom_model::DecoderKind::Tiny));
    let full_frames = run(&e, with(headroom_model::DecoderKind::Full));
    assert_eq!(
        tiny_frames,
        run(&e, with(headroom_model::DecoderKind::Tiny))
    );
    assert_eq!(tiny_frames.len(), 33);
    // The same latents through both decoders: the distilled one stays close (its
    // held-out PSNR against the full decode is in models/world/tiny_decoder.json).
    let psnr = psnr(&tiny_frames.concat(), &full_frames.concat());
    println!("tiny vs full decode of one flight: {psnr:.2} dB");
    assert!(psnr > 25.0, "tiny vs full decode: {psnr:.2} dB");
    assert_ne!(tiny_frames, full_frames);
}

#[test]
fn without_an_image_a_session_starts_from_the_models_first_frame() {
    let e = engine(AllocatorPolicy::Planned, ReclaimPolicy::BeforeDecode);
    let rgb = first_frame::load(std::path::Path::new(WORLD))
        .unwrap()
        .unwrap();
    let device = Device::new(e.platform().clone());
    let own = first_frame::to_tensor(&rgb, 128, 96, &device).unwrap();
    let given = run(
        &e,
        SessionRequest {
            image: Some(own),
            ..request("wwwdddlll")
        },
    );
    assert_eq!(run(&e, request("wwwdddlll")), given);
    let flipped = image::imageops::flip_horizontal(&rgb);
    let other = first_frame::to_tensor(&flipped, 128, 96, &device).unwrap();
    let from_other = run(
        &e,
        SessionRequest {
            image: Some(other),
            ..request("wwwdddlll")
        },
    );
    assert_ne!(from_other, given, "the first frame conditions the video");
}

/// PSNR in dB between two equally long byte slices (RGB frames).
fn psnr(a: &[u8], b: &[u8]) -> f64 {
    let se: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    10.0 * (255f64.powi(2) / (se / a.len() as f64)).log10()
}

#[test]
fn the_first_frame_comes_back_in_its_own_colours() {
    // The bar on held-out scenes (tools/world/eval.py): frame 0 ≥ 30 dB from the
    // image given, ≥ 27 dB with its RGB channels permuted (a VAE that learned its training
    // palettes instead of colour fails the second).
    let e = engine(AllocatorPolicy::Planned, ReclaimPolicy::BeforeDecode);
    let rgb = first_frame::load(std::path::Path::new(WORLD))
        .unwrap()
        .unwrap();
    let device = Device::new(e.platform().clone());
    let mut rotated = rgb.clone();
    for px in rotated.pixels_mut() {
        px.0 = [px.0[1], px.0[2], px.0[0]];
    }
    for (image, bar) in [(&rgb, 30.0), (&rotated, 27.0)] {
        let given = first_frame::to_tensor(image, 128, 96, &device).unwrap();
        let frames = run(
            &e,
            SessionRequest {
                image: Some(given),
                num_frames: 9,
                ..request("ddl")
            },
        );
        let db = psnr(&frames[0], image.as_raw());
        println!("frame 0 against the image given: {db:.2} dB");
        assert!(db >= bar, "frame 0: {db:.2} dB, the bar is {bar} dB");
    }
}

#[test]
fn reclaim_policies_and_allocators_give_identical_bytes() {
    let reference = run(
        &engine(AllocatorPolicy::Planned, ReclaimPolicy::BeforeDecode),
        request("wwlljjaad"),
    );
    for (allocator, reclaim) in [
        (AllocatorPolicy::Pytorch, ReclaimPolicy::Never),
        (AllocatorPolicy::Expandable, ReclaimPolicy::Always),
    ] {
        let got = run(&engine(allocator, reclaim), request("wwlljjaad"));
        assert_eq!(got, reference, "{allocator} {reclaim:?}");
    }
}

#[test]
fn the_keys_change_the_world_models_video_deterministically() {
    // How far and which way they move the picture is measured against the renderer by
    // tools/world/eval.py (models/world/README.md): this model moves it far less than
    // the truth does, so no direction is asserted here.
    let e = engine(AllocatorPolicy::Planned, ReclaimPolicy::BeforeDecode);
    let right = run(&e, request("lllllllll"));
    assert_eq!(right, run(&e, request("lllllllll")));
    assert_ne!(right, run(&e, request("jjjjjjjjj")));
    assert_ne!(right, run(&e, request("")));
}

#[test]
fn camera_guidance_pushes_away_from_a_still_camera_and_is_checked() {
    let e = engine(AllocatorPolicy::Planned, ReclaimPolicy::BeforeDecode);
    let block = |keys: &str, g: f64| SessionRequest {
        camera_guidance: Some(g),
        ..SessionRequest {
            num_frames: 9,
            ..request(keys)
        }
    };
    // Scale 0 keeps only the still camera's velocity: the block a session without keys
    // makes (one block, so no keys/values of the keys' camera reach a later one).
    assert_eq!(run(&e, block("lll", 0.0)), run(&e, block("", 1.0)));
    let guided = run(&e, block("lll", 2.0));
    assert_eq!(guided, run(&e, block("lll", 2.0)));
    assert_ne!(guided, run(&e, block("lll", 1.0)));
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let Err(err) = e.open_session(block("lll", bad)) else {
            panic!("camera_guidance {bad} must be refused")
        };
        let err = err.to_string();
        assert!(
            err.contains("camera_guidance") && err.contains("≥ 0"),
            "{err}"
        );
    }
}

/// A copy of the world model's folder whose transformer config sets `keep_first_frame`.
fn world_with_keep(dir: &std::path::Path, keep: bool) -> String {
    world_with(dir, |json| json["keep_first_frame"] = keep.into())
}

/// A copy of the world model's folder with its transformer config edited.
fn world_with(dir: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let src = std::path::Path::new(WORLD);
    for part in ["transformer", "vae"] {
        std::fs::create_dir_all(dir.join(part)).unwrap();
        for entry in std::fs::read_dir(src.join(part)).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, dir.join(part).join(path.file_name().unwrap())).unwrap();
        }
    }
    std::fs::copy(
        src.join(first_frame::FIRST_FRAME),
        dir.join(first_frame::FIRST_FRAME),
    )
    .unwrap();
    let config = dir.join("transformer/config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(&config, json.to_string()).unwrap();
    dir.to_str().unwrap().to_string()
}

#[test]
fn a_models_flow_shift_is_its_sessions_default_and_a_request_overrides_it() {
    let dir = tempfile::tempdir().unwrap();
    let folder = world_with(dir.path(), |json| json["flow_shift"] = 2.5.into());
    let shifted = engine_at(
        &folder,
        AllocatorPolicy::Planned,
        ReclaimPolicy::BeforeDecode,
    );
    let e = engine(AllocatorPolicy::Planned, ReclaimPolicy::BeforeDecode);
    let block = |shift: Option<f64>| SessionRequest {
        flow_shift: shift,
        num_frames: 9,
        ..request("lll")
    };
    let own = run(&shifted, block(None));
    assert_eq!(own, run(&e, block(Some(2.5))));
    assert_ne!(
        own,
        run(&e, block(None)),
        "the embedded world's shift is not 2.5"
    );
    assert_eq!(run(&shifted, block(Some(5.0))), run(&e, block(Some(5.0))));
    let Err(err) = e.open_session(block(Some(0.0))) else {
        panic!("flow_shift 0 must be refused")
    };
    let err = err.to_string();
    assert!(err.contains("flow_shift") && err.contains("> 0"), "{err}");
}

#[test]
fn a_model_that_keeps_the_first_frame_starts_every_flight_from_the_same_decoded_image() {
    let dir = tempfile::tempdir().unwrap();
    let [keep, plain] = [true, false].map(|k| {
        let folder = world_with_keep(&dir.path().join(k.to_string()), k);
        engine_at(
            &folder,
            AllocatorPolicy::Planned,
            ReclaimPolicy::BeforeDecode,
        )
    });
    let other = |e: &Engine| {
        run(
            e,
            SessionRequest {
                seed: 4,
                ..request("jjjjjjjjj")
            },
        )
    };
    // Kept: frame 0 is the VAE's round trip of the given image, whatever the noise and keys.
    let (a, b) = (run(&keep, request("lllllllll")), other(&keep));
    assert_eq!(a[0], b[0]);
    assert_ne!(a[1..], b[1..]);
    // Not kept: frame 0 is the network's x0 for it, which the noise moves.
    let (c, d) = (run(&plain, request("lllllllll")), other(&plain));
    assert_ne!(c[0], d[0]);
    assert_ne!(a[0], c[0]);
}

#[test]
fn a_camera_adapter_for_another_vaes_fold_is_refused_by_name() {
    use headroom_tensor::io::safetensors::{save_safetensors, SafetensorsFile};
    use headroom_tensor::{DType, Tensor};
    let dir = tempfile::tempdir().unwrap();
    let folder = world_with_keep(dir.path(), true);
    let e = engine(AllocatorPolicy::Planned, ReclaimPolicy::BeforeDecode);
    let fold = e.transformer().camera_fold().unwrap();
    let [_, ph, pw] = e.transformer().config().patch_size;
    // The same model with an adapter whose patch embedding takes rays of the other fold.
    let other = if fold == 8 { 4 } else { 8 };
    let dev = Device::cpu().unwrap();
    let path =
        std::path::Path::new(&folder).join("transformer/diffusion_pytorch_model.safetensors");
    let mut tensors = SafetensorsFile::open(&path)
        .unwrap()
        .load_all(&dev, None)
        .unwrap();
    let key = "patch_embedding_wancamctrl.weight";
    let dim = tensors[key].shape()[0];
    let width = 6 * other * other * ph * pw;
    tensors.insert(
        key.to_string(),
        Tensor::zeros(&[dim, width], DType::F32, &dev).unwrap(),
    );
    let list: Vec<(&str, &Tensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    save_safetensors(&path, &list).unwrap();
    let refused = Engine::new(EngineConfig {
        model: folder,
        ..EngineConfig::default()
    });
    let Err(err) = refused else {
        panic!("an adapter of another fold must be refused")
    };
    let err = err.to_string();
    assert!(
        err.contains(&format!("folded {other}×{other}")) && err.contains(&format!("{fold}×")),
        "{err}"
    );
}
