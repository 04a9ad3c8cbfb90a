//! `headroom text encode` and `headroom generate --prompt` through the real binary.

mod common;
use common::headroom;

use std::path::PathBuf;

use headroom_tensor::io::npy::read_npy;
use headroom_tensor::Device;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../text/tests/fixtures")
}

#[test]
fn text_encode_writes_the_pipeline_embeddings() {
    let dev = Device::cpu().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("e.npy");
    let model = fixtures();
    // Prompt 0 of the fixtures ("ascii"), recorded at max_length 16.
    let res = headroom(&[
        "text",
        "encode",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "A cat runs across the green grass",
        "--max-length",
        "16",
        "--out",
        out.to_str().unwrap(),
    ]);
    common::assert_ok(&res);
    let got = read_npy(&out, &dev).unwrap();
    let want = read_npy(fixtures().join("embeds_0.npy"), &dev).unwrap();
    assert_eq!(got.shape(), [16, 32]);
    let (got, want) = (got.to_f32_vec().unwrap(), want.to_f32_vec().unwrap());
    let diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff <= 1e-4, "max |diff| {diff}");

    let res = headroom(&[
        "text",
        "encode",
        "--model",
        tmp.path().to_str().unwrap(),
        "--prompt",
        "a cat",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!res.status.success());
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(stderr.contains("text_encoder"), "{stderr}");
}

#[test]
fn generate_with_a_prompt_reports_the_text_encoder() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("v.y4m");
    let res = headroom(&[
        "generate",
        "--model",
        "tiny",
        "--width",
        "48",
        "--height",
        "32",
        "--frames",
        "9",
        "--prompt",
        "a red car drives along the mountain road",
        "--text-encoder",
        "on-demand",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    common::assert_ok(&res);
    let report: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
    let text = &report["text_encoder"];
    assert_eq!(text["mode"], "on-demand");
    assert_eq!(text["resident_weight_bytes"], 0);
    assert_eq!(text["loads"], 1);
    assert!(text["weight_bytes"].as_u64().unwrap() > 0);
}
