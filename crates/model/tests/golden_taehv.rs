//! The TAEHV tiny decoder against `taehv.py`: fixtures made by
//! `tools/make_taehv_fixtures.py` (taew2_1's and taew2_2's layouts at narrow widths,
//! seeded weights saved as an f16 `.pth` and an f32 `.safetensors` with the same values,
//! latents and taehv.py's decode).

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
            widths: [8, 8, 8, 8],
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
    // A file whose TGrow has too few rows for 2 frames is refused naming the key.
    let dev = Device::cpu().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.safetensors");
    let src = fixture("taew2_1").join("decoder_f32.safetensors");
    let file = headroom_tensor::io::safetensors::SafetensorsFile::open(&src).unwrap();
    let mut tensors = Vec::new();
    for name in file.names().unwrap() {
        let t = file.load(&name, &dev, Some(DType::F32)).unwrap();
        let t = if name == "decoder.13.conv.weight" {
            t.narrow(0, 0, 16).unwrap().contiguous().unwrap()
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
