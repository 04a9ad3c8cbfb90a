//! The TAEHV tiny decoder against `taehv.py`: fixtures made by
//! `tools/make_taehv_fixtures.py` (taew2_1's and taew2_2's layouts at narrow widths,
//! seeded weights saved as an f16 `.pth` and an f32 `.safetensors` with the same values,
//! latents and taehv.py's decode) and `tools/make_taehv_stages_fixture.py` (a two-stage
//! decoder, 4× in space and time, as for a VAE with 4× spatial compression).

use std::collections::BTreeMap;
use std::path::PathBuf;

use headroom_model::taehv::recognise;
use headroom_model::{
    DecoderKind, OutputFormat, RunToEnd, StreamingDecodeState, TinyConfig, TinyDecoder,
    VideoDecoder,
};
use headroom_tensor::io::npy::read_npy;
use headroom_tensor::{DType, Device, Tensor};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/taehv")
        .join(name)
}

/// The largest |a − b| of two tensors of one shape.
fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    headroom_tensor::compare::max_abs_error(a, b).unwrap()
}

fn torch_bf16_error(name: &str) -> f32 {
    let text = std::fs::read_to_string(fixture(name).join("bf16_error.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["max_abs_error"].as_f64().unwrap() as f32
}

const CASES: [&str; 2] = ["taew2_1", "taew2_2"];

/// Decodes `z` in chunks of `sizes` latent frames through one state.
fn chunked(decoder: &TinyDecoder, z: &Tensor, sizes: &[usize]) -> Tensor {
    let mut state = StreamingDecodeState::new("s").unwrap();
    let mut outs = Vec::new();
    let mut at = 0;
    for &n in sizes {
        let part = z.narrow(2, at, n).unwrap().contiguous().unwrap();
        let out = decoder
            .decode_streams(&[&part], &mut [&mut state], OutputFormat::Video, &RunToEnd)
            .unwrap()
            .unwrap();
        outs.extend(out);
        at += n;
    }
    Tensor::cat(&outs.iter().collect::<Vec<_>>(), 2).unwrap()
}

#[test]
fn tiny_decode_matches_taehv_py_within_1e_4_from_pth_and_safetensors() {
    let dev = Device::cpu().unwrap();
    for name in CASES {
        let dir = fixture(name);
        let z = read_npy(dir.join("latents.npy"), &dev).unwrap();
        let expected = read_npy(dir.join("decoded.npy"), &dev).unwrap();
        for file in ["decoder.pth", "decoder_f32.safetensors"] {
            let decoder = TinyDecoder::load(&dir.join(file), &dev, DType::F32).unwrap();
            let got = decoder.decode(&z).unwrap();
            let err = max_abs_diff(&got, &expected);
            println!("{name} {file}: max abs error {err:e}");
            assert!(err <= 1e-4, "{name} {file}: max abs error {err}");
        }
    }
}

#[test]
fn the_files_shapes_give_the_config() {
    let dev = Device::cpu().unwrap();
    let one = TinyDecoder::load(&fixture("taew2_1").join("decoder.pth"), &dev, DType::F32).unwrap();
    assert_eq!((one.config().latent_channels, one.config().patch), (16, 1));
    assert_eq!(one.config().widths, [32, 16, 8, 8]);
    assert_eq!(one.config().time_strides, [1, 2, 2]);
    let two = TinyDecoder::load(
        &fixture("taew2_2").join("decoder_f32.safetensors"),
        &dev,
        DType::F32,
    )
    .unwrap();
    assert_eq!((two.config().latent_channels, two.config().patch), (48, 2));
    assert_eq!(two.spatial_factor(), 16);
    assert_eq!(two.kind(), DecoderKind::Tiny);
}

#[test]
fn chunked_tiny_decode_equals_one_call_byte_for_byte() {
    let dev = Device::cpu().unwrap();
    for dtype in [DType::F32, DType::BF16] {
        let dir = fixture("taew2_1");
        let decoder = TinyDecoder::load(&dir.join("decoder.pth"), &dev, dtype).unwrap();
        let z = read_npy(dir.join("latents.npy"), &dev).unwrap();
        let z = Tensor::cat(&[&z, &z, &z], 2).unwrap(); // 9 latent frames
        let whole = chunked(&decoder, &z, &[9]).to_f32_vec().unwrap();
        for sizes in [&[3, 3, 3][..], &[1, 2, 6], &[1; 9]] {
            let parts = chunked(&decoder, &z, sizes).to_f32_vec().unwrap();
            assert!(
                whole
                    .iter()
                    .zip(&parts)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype:?} chunks {sizes:?} differ from one call"
            );
        }
        assert_eq!(whole.len(), 3 * (1 + 4 * 8) * 48 * 64);
    }
}

#[test]
fn bf16_tiny_decode_errs_at_most_twice_pytorch_bf16() {
    let dev = Device::cpu().unwrap();
    for name in CASES {
        let dir = fixture(name);
        let decoder = TinyDecoder::load(&dir.join("decoder.pth"), &dev, DType::BF16).unwrap();
        let z = read_npy(dir.join("latents.npy"), &dev).unwrap();
        let expected = read_npy(dir.join("decoded.npy"), &dev).unwrap();
        let got = decoder.decode(&z).unwrap();
        let (err, torch) = (max_abs_diff(&got, &expected), torch_bf16_error(name));
        println!("{name}: bf16 max abs error {err:e} (PyTorch bf16: {torch:e})");
        assert!(err <= 2.0 * torch, "{name}: {err} > 2 × {torch}");
    }
}

#[test]
fn batched_tiny_decode_gives_each_stream_its_own_bytes() {
    let dev = Device::cpu().unwrap();
    let dir = fixture("taew2_1");
    let decoder = TinyDecoder::load(&dir.join("decoder.pth"), &dev, DType::F32).unwrap();
    let z = read_npy(dir.join("latents.npy"), &dev).unwrap();
    let other = z.mul_scalar(-0.7).unwrap();
    let (mut a, mut b) = (
        StreamingDecodeState::new("a").unwrap(),
        StreamingDecodeState::new("b").unwrap(),
    );
    let (mut a1, mut b1) = (
        StreamingDecodeState::new("a1").unwrap(),
        StreamingDecodeState::new("b1").unwrap(),
    );
    for chunk in 0..2 {
        let (za, zb) = if chunk == 0 {
            (&z, &other)
        } else {
            (&other, &z)
        };
        let together = decoder
            .decode_streams(
                &[za, zb],
                &mut [&mut a, &mut b],
                OutputFormat::PlanarUint8,
                &RunToEnd,
            )
            .unwrap()
            .unwrap();
        for (zk, state, got) in [(za, &mut a1, &together[0]), (zb, &mut b1, &together[1])] {
            let alone = decoder
                .decode_streams(&[zk], &mut [state], OutputFormat::PlanarUint8, &RunToEnd)
                .unwrap()
                .unwrap();
            assert_eq!(
                alone[0].to_vec::<u8>().unwrap(),
                got.to_vec::<u8>().unwrap()
            );
        }
    }
    assert_eq!(a.nbytes(), decoder.state_bytes(48, 64));
    assert_eq!(a.frames_decoded, (1 + 4 * 2) + 4 * 3);
}

#[test]
fn a_fresh_and_a_running_stream_do_not_batch() {
    let dev = Device::cpu().unwrap();
    let decoder = TinyDecoder::seeded(
        TinyConfig {
            widths: vec![8, 8, 8, 8],
            ..TinyConfig::taew2_1()
        },
        1,
        &dev,
        DType::F32,
    )
    .unwrap();
    let z = Tensor::randn(&[1, 16, 1, 2, 3], 1, 0, DType::F32, &dev).unwrap();
    let mut ahead = StreamingDecodeState::new("ahead").unwrap();
    decoder.decode(&z).unwrap();
    decoder
        .decode_streams(&[&z], &mut [&mut ahead], OutputFormat::Video, &RunToEnd)
        .unwrap();
    let mut fresh = StreamingDecodeState::new("fresh").unwrap();
    let err = decoder
        .decode_streams(
            &[&z, &z],
            &mut [&mut ahead, &mut fresh],
            OutputFormat::Video,
            &RunToEnd,
        )
        .unwrap_err();
    assert!(err.to_string().contains("same point"), "{err}");
    let wrong = Tensor::randn(&[1, 4, 1, 2, 3], 1, 0, DType::F32, &dev).unwrap();
    let err = decoder.decode(&wrong).unwrap_err();
    assert!(err.to_string().contains("16 channels"), "{err}");
}

#[test]
fn super_and_foreign_files_are_refused_by_name() {
    let mut shapes: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    shapes.insert("decoder.0.weight".into(), vec![512, 16, 1, 1]);
    shapes.insert("decoder.1.conv.0.weight".into(), vec![1024, 1, 7, 7]);
    let err = recognise(&shapes).unwrap_err();
    assert!(err.to_string().contains("_super"), "{err}");
    let mut wan = BTreeMap::new();
    wan.insert("decoder.conv_in.weight".to_string(), vec![384, 16, 3, 3, 3]);
    let err = recognise(&wan).unwrap_err();
    assert!(err.to_string().contains("not a TAEHV file"), "{err}");
    // A file whose TGrow's rows are not a whole number of frames is refused naming the
    // key (16 rows are a stride of 1 at width 16; 24 are 1.5 frames).
    let dev = Device::cpu().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.safetensors");
    let src = fixture("taew2_1").join("decoder_f32.safetensors");
    let file = headroom_tensor::io::safetensors::SafetensorsFile::open(&src).unwrap();
    let mut tensors = Vec::new();
    for name in file.names().unwrap() {
        let t = file.load(&name, &dev, Some(DType::F32)).unwrap();
        let t = if name == "decoder.13.conv.weight" {
            t.narrow(0, 0, 24).unwrap().contiguous().unwrap()
        } else {
            t
        };
        tensors.push((name, t));
    }
    let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    headroom_tensor::io::safetensors::save_safetensors(&path, &refs).unwrap();
    let err = TinyDecoder::load(&path, &dev, DType::F32).unwrap_err();
    assert!(err.to_string().contains("decoder.13.conv.weight"), "{err}");
}

/// Tensor names and shapes, as `recognise` reads them.
type Shapes = BTreeMap<String, Vec<usize>>;

/// The tensor shapes of a safetensors fixture.
fn file_shapes(path: &std::path::Path) -> Shapes {
    let file = headroom_tensor::io::safetensors::SafetensorsFile::open(path).unwrap();
    file.names()
        .unwrap()
        .into_iter()
        .map(|name| {
            let shape = file.info(&name).unwrap().0;
            (name, shape)
        })
        .collect()
}

#[test]
fn two_stage_tiny_decode_streamed_a_latent_frame_at_a_time_matches_pytorch_within_1e_4() {
    let dev = Device::cpu().unwrap();
    let dir = fixture("two_stage");
    let decoder = TinyDecoder::load(&dir.join("decoder.safetensors"), &dev, DType::F32).unwrap();
    let config = decoder.config();
    assert_eq!(config.stage_count(), 2);
    assert_eq!(config.widths, [12, 8, 6]);
    assert_eq!(config.time_strides, [2, 2]);
    assert_eq!((config.spatial_factor(), config.t_upscale()), (4, 4));
    assert_eq!(decoder.slot_count(), 6);
    let z = read_npy(dir.join("latents.npy"), &dev).unwrap();
    let expected = read_npy(dir.join("decoded.npy"), &dev).unwrap();
    let frames = z.shape()[2];
    // As the engine streams: one latent frame a chunk, through one state.
    let got = chunked(&decoder, &z, &vec![1; frames]);
    assert_eq!(got.shape()[2], 1 + 4 * (frames - 1));
    assert_eq!(
        got.shape(),
        &[
            1,
            3,
            1 + 4 * (frames - 1),
            4 * z.shape()[3],
            4 * z.shape()[4]
        ]
    );
    let err = max_abs_diff(&got, &expected);
    println!("two_stage: max abs error {err:e}");
    assert!(err <= 1e-4, "two_stage: max abs error {err}");
    // The state is one frame per memory block of the two stages.
    let mut state = StreamingDecodeState::new("s").unwrap();
    decoder
        .decode_streams(&[&z], &mut [&mut state], OutputFormat::Video, &RunToEnd)
        .unwrap();
    assert_eq!(state.nbytes(), decoder.state_bytes(12, 20));
}

#[test]
fn a_three_stage_file_still_recognises_as_three_stages() {
    for (name, patch) in [("taew2_1", 1), ("taew2_2", 2)] {
        let shapes = file_shapes(&fixture(name).join("decoder_f32.safetensors"));
        let config = recognise(&shapes).unwrap();
        assert_eq!(config.stage_count(), 3, "{name}");
        assert_eq!(config.widths, [32, 16, 8, 8], "{name}");
        assert_eq!(config.time_strides, [1, 2, 2], "{name}");
        assert_eq!(config.spatial_factor(), 8 * patch, "{name}");
    }
    assert_eq!(TinyConfig::taew2_1().widths, [256, 128, 64, 64]);
    assert_eq!(TinyConfig::taew2_1().time_strides, [1, 2, 2]);
    assert_eq!(TinyConfig::taew2_2().spatial_factor(), 16);
}

#[test]
fn a_malformed_stage_layout_is_refused_naming_the_key_and_the_rule() {
    let good = file_shapes(&fixture("two_stage").join("decoder.safetensors"));
    assert_eq!(recognise(&good).unwrap().stage_count(), 2);
    let refused = |edit: &dyn Fn(&mut Shapes), words: &[&str]| {
        let mut shapes = good.clone();
        edit(&mut shapes);
        let err = recognise(&shapes).unwrap_err().to_string();
        for w in words {
            assert!(err.contains(w), "{words:?}: {err}");
        }
    };
    let add = |key: &'static str, shape: Vec<usize>| {
        move |s: &mut Shapes| {
            s.insert(key.to_string(), shape.clone());
        }
    };
    // A last layer off 4 + 6·N.
    refused(
        &add("decoder.19.weight", vec![3, 6, 3, 3]),
        &["decoder.19.weight", "4 + 6·N"],
    );
    // More stages than MAX_STAGES (9: the last at 58).
    refused(
        &add("decoder.58.weight", vec![3, 6, 3, 3]),
        &["decoder.58.weight", "9 stages", "at most 8"],
    );
    // An index no decoder has.
    refused(
        &add("decoder.99999999999999999999999.weight", vec![1]),
        &["decoder.99999999999999999999999.weight", "index"],
    );
    // Weights at a parameter-free layer (stage 0's upsample).
    refused(
        &add("decoder.6.weight", vec![12, 12, 3, 3]),
        &["decoder.6.weight", "upsample"],
    );
    // The output conv where a 2-stage decoder's last ReLU is.
    refused(
        &|s: &mut Shapes| {
            let w = s.remove("decoder.16.weight").unwrap();
            s.remove("decoder.16.bias");
            s.insert("decoder.15.weight".into(), w);
        },
        &["decoder.15.weight", "4 + 6·N"],
    );
    // A TGrow that is not a whole number of frames, and one of another width.
    refused(
        &add("decoder.7.conv.weight", vec![18, 12, 1, 1]),
        &["decoder.7.conv.weight", "stride"],
    );
    refused(
        &add("decoder.13.conv.weight", vec![16, 6, 1, 1]),
        &["decoder.13.conv.weight"],
    );
    // A stage conv whose input is not its stage's width.
    refused(
        &add("decoder.14.weight", vec![6, 9, 3, 3]),
        &["decoder.14.weight"],
    );
    // A stage without its TGrow.
    refused(
        &|s: &mut Shapes| {
            s.remove("decoder.13.conv.weight");
        },
        &["decoder.13.conv.weight"],
    );
    // Strides of 8·4 frames a latent frame, past MAX_T_UPSCALE.
    refused(
        &|s: &mut Shapes| {
            s.insert("decoder.7.conv.weight".into(), vec![96, 12, 1, 1]);
            s.insert("decoder.13.conv.weight".into(), vec![32, 8, 1, 1]);
        },
        &["time_strides", "32 frames"],
    );
    // Configs made in code are held to the same rule.
    let three_widths_one_stride = TinyConfig {
        widths: vec![8, 8, 8],
        time_strides: vec![2],
        ..TinyConfig::taew2_1()
    };
    let err = three_widths_one_stride.validate().unwrap_err().to_string();
    assert!(err.contains("widths"), "{err}");
    let none = TinyConfig {
        widths: vec![8],
        time_strides: vec![],
        ..TinyConfig::taew2_1()
    };
    assert!(none
        .validate()
        .unwrap_err()
        .to_string()
        .contains("time_strides"));
}
