//! `headroom vae decode|encode` and `headroom bench vae` through the real binary.

mod common;
use common::headroom;

use std::path::PathBuf;

use headroom_tensor::io::npy::read_npy;
use headroom_tensor::Device;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/vae")
        .join(name)
}

/// The largest |a − b| of two slices of one length.
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    headroom_tensor::compare::max_abs_diff(a, b).expect("one length")
}

#[test]
fn vae_decode_in_chunks_and_encode_match_the_diffusers_fixtures() {
    let dev = Device::cpu().unwrap();
    let dir = fixture("tiny_t2_attn");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("decoded.npy");
    let model = dir.to_str().unwrap();
    let latents = dir.join("latents.npy");
    let res = headroom(&[
        "vae",
        "decode",
        "--model",
        model,
        "--latents",
        latents.to_str().unwrap(),
        "--chunks",
        "1,2",
        "--out",
        out.to_str().unwrap(),
    ]);
    common::assert_ok(&res);
    let got = read_npy(&out, &dev).unwrap();
    let expected = read_npy(dir.join("decoded.npy"), &dev).unwrap();
    assert_eq!(got.shape(), expected.shape());
    assert!(max_abs_diff(&got.to_f32_vec().unwrap(), &expected.to_f32_vec().unwrap()) <= 1e-4);

    let px = tmp.path().join("pixels.npy");
    let res = headroom(&[
        "vae",
        "decode",
        "--model",
        model,
        "--latents",
        latents.to_str().unwrap(),
        "--format",
        "planar_uint8",
        "--out",
        px.to_str().unwrap(),
    ]);
    common::assert_ok(&res);
    let pixels = read_npy(&px, &dev).unwrap();
    assert_eq!(pixels.shape(), &expected.shape()[1..]);

    let enc = tmp.path().join("mean.npy");
    let video = dir.join("video.npy");
    let res = headroom(&[
        "vae",
        "encode",
        "--model",
        model,
        "--video",
        video.to_str().unwrap(),
        "--out",
        enc.to_str().unwrap(),
    ]);
    common::assert_ok(&res);
    let got = read_npy(&enc, &dev).unwrap().to_f32_vec().unwrap();
    let expected = read_npy(dir.join("encoded_mean.npy"), &dev)
        .unwrap()
        .to_f32_vec()
        .unwrap();
    assert!(max_abs_diff(&got, &expected) <= 1e-4);
}

#[test]
fn vae_bad_arguments_are_errors_that_name_the_rule() {
    let dir = fixture("tiny_t1");
    let latents = dir.join("latents.npy");
    let cases: [(&[&str], &str); 3] = [
        (&["--chunks", "1,1"], "sum to the latent frames"),
        (&["--format", "mp4"], "unknown output format"),
        (&["--chunks", "3,0"], "positive"),
    ];
    for (extra, expected) in cases {
        let mut args = vec![
            "vae",
            "decode",
            "--model",
            dir.to_str().unwrap(),
            "--latents",
            latents.to_str().unwrap(),
            "--out",
            "/tmp/unused.npy",
        ];
        args.extend_from_slice(extra);
        let res = headroom(&args);
        assert!(!res.status.success());
        let stderr = String::from_utf8_lossy(&res.stderr);
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
    }
    let res = headroom(&[
        "vae",
        "decode",
        "--model",
        "/nonexistent",
        "--latents",
        latents.to_str().unwrap(),
        "--out",
        "/tmp/x.npy",
    ]);
    assert!(String::from_utf8_lossy(&res.stderr).contains("/nonexistent"));
}

#[test]
fn bench_vae_reports_time_peaks_and_the_declared_state() {
    let res = headroom(&[
        "bench", "vae", "--config", "tiny", "--height", "64", "--width", "64", "--frames", "3",
        "--json",
    ]);
    common::assert_ok(&res);
    let json: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
    assert_eq!(json["frames"], 9);
    assert_eq!(json["state_bytes"], json["declared_state_bytes"]);
    assert!(
        json["allocated_peak_bytes"].as_u64().unwrap()
            <= json["reserved_peak_bytes"].as_u64().unwrap()
    );
    assert!(json["later_frame_ms"].as_f64().unwrap() > 0.0);
}

#[test]
fn dit_forward_matches_the_diffusers_fixture_and_completes_image_channels() {
    let dev = Device::cpu().unwrap();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/dit/i2v36");
    let tmp = tempfile::tempdir().unwrap();
    // Split the 36 channels into 16 noise channels and 20 image-condition channels.
    let x = read_npy(dir.join("latents.npy"), &dev).unwrap();
    let (noise, cond) = (tmp.path().join("noise.npy"), tmp.path().join("cond.npy"));
    headroom_tensor::io::npy::write_npy(&noise, &x.narrow(1, 0, 16).unwrap()).unwrap();
    headroom_tensor::io::npy::write_npy(&cond, &x.narrow(1, 16, 20).unwrap()).unwrap();
    let out = tmp.path().join("v.npy");
    let t = read_npy(dir.join("timestep.npy"), &dev)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()[0]
        .to_string();
    let res = headroom(&[
        "dit",
        "forward",
        "--model",
        dir.to_str().unwrap(),
        "--latents",
        noise.to_str().unwrap(),
        "--image-latents",
        cond.to_str().unwrap(),
        "--timestep",
        &t,
        "--text-embeds",
        dir.join("text.npy").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    common::assert_ok(&res);
    let got = read_npy(&out, &dev).unwrap().to_vec::<f32>().unwrap();
    let expected = read_npy(dir.join("out_text.npy"), &dev)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(max_abs_diff(&got, &expected) <= 1e-4);
    let res = headroom(&[
        "dit",
        "forward",
        "--model",
        dir.to_str().unwrap(),
        "--latents",
        noise.to_str().unwrap(),
        "--timestep",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&res.stderr).contains("--image-latents"));
}

#[test]
fn vae_decode_takes_a_taehv_file_and_chunks_equal_one_call_byte_for_byte() {
    let dev = Device::cpu().unwrap();
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/taehv/taew2_1");
    let tmp = tempfile::tempdir().unwrap();
    let latents = dir.join("latents.npy");
    let decode = |chunks: &str, name: &str| {
        let out = tmp.path().join(name);
        let res = headroom(&[
            "vae",
            "decode",
            "--model",
            dir.join("decoder.pth").to_str().unwrap(),
            "--latents",
            latents.to_str().unwrap(),
            "--chunks",
            chunks,
            "--compare",
            dir.join("decoded.npy").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        common::assert_ok(&res);
        let said = String::from_utf8_lossy(&res.stderr);
        assert!(said.contains("tiny decoder"), "{said}");
        read_npy(&out, &dev).unwrap().to_f32_vec().unwrap()
    };
    let whole = decode("3", "whole.npy");
    let parts = decode("1,2", "parts.npy");
    assert!(whole
        .iter()
        .zip(&parts)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    let expected = read_npy(dir.join("decoded.npy"), &dev)
        .unwrap()
        .to_f32_vec()
        .unwrap();
    assert!(max_abs_diff(&whole, &expected) <= 1e-4);
}
