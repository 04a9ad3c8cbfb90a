//! The tokenizer and the UMT5 encoder against transformers 5.x (`T5Tokenizer`,
//! `UMT5EncoderModel`) and the Wan pipeline's `_get_t5_prompt_embeds`, on the tiny
//! fixtures written by `tools/make_text_fixtures.py`.

use std::path::{Path, PathBuf};

use headroom_tensor::io::npy::read_npy;
use headroom_tensor::{DType, Device, Tensor};
use headroom_text::{
    prompt_clean, relative_position_bucket, TextEncoder, TextEncoderMode, TextTokenizer,
    Umt5Encoder,
};
use serde_json::Value;

/// Embeddings match the reference within this (f32 compute on both sides).
const TOLERANCE: f32 = 1e-4;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

struct Record {
    index: usize,
    name: String,
    prompt: String,
    cleaned: String,
    max_length: usize,
    ids: Vec<u32>,
    n: usize,
}

fn records() -> Vec<Record> {
    let text = std::fs::read_to_string(fixtures().join("prompts.json")).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    json["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(index, r)| Record {
            index,
            name: r["name"].as_str().unwrap().to_string(),
            prompt: r["prompt"].as_str().unwrap().to_string(),
            cleaned: r["cleaned"].as_str().unwrap().to_string(),
            max_length: r["max_length"].as_u64().unwrap() as usize,
            ids: r["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect(),
            n: r["n"].as_u64().unwrap() as usize,
        })
        .collect()
}

/// Largest elementwise |a − b| (shapes must match).
/// The largest |a − b| of two tensors of one shape.
fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    headroom_tensor::compare::max_abs_error(a, b).unwrap()
}

fn npy(name: &str, device: &Device) -> Tensor {
    read_npy(fixtures().join(name), device).unwrap()
}

#[test]
fn prompts_clean_like_the_wan_pipeline() {
    for r in records() {
        assert_eq!(prompt_clean(&r.prompt), r.cleaned, "{}", r.name);
    }
}

#[test]
fn token_ids_equal_transformers_for_every_prompt() {
    let records = records();
    // Covers ASCII, accents, CJK, emoji (unknown pieces), HTML entities, an added special
    // token, the empty prompt and truncation.
    assert!(records
        .iter()
        .any(|r| r.n == r.max_length && r.cleaned.len() > 60));
    assert!(records.iter().any(|r| r.cleaned.is_empty() && r.n == 1));
    for folder in ["tokenizer", "tokenizer_v4"] {
        for r in &records {
            let tokenizer =
                TextTokenizer::from_dir(&fixtures().join(folder), r.max_length).unwrap();
            let tokens = tokenizer.tokenize(&r.cleaned).unwrap();
            assert_eq!(tokens.ids, r.ids, "{folder}: {}", r.name);
            assert_eq!(tokens.n, r.n, "{folder}: {}", r.name);
            assert_eq!(tokens.ids[r.n - 1], 1, "{}: ends in </s>", r.name);
        }
    }
}

#[test]
fn relative_position_buckets_equal_transformers() {
    let text = std::fs::read_to_string(fixtures().join("buckets.json")).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    let from = json["offset_from"].as_i64().unwrap();
    for (key, buckets, max_distance) in [("32_128", 32, 128), ("32_20", 32, 20)] {
        for (i, want) in json[key].as_array().unwrap().iter().enumerate() {
            let rel = from + i as i64;
            assert_eq!(
                relative_position_bucket(rel, buckets, max_distance) as u64,
                want.as_u64().unwrap(),
                "{key}: offset {rel}"
            );
        }
    }
}

#[test]
fn embeddings_equal_the_wan_pipeline_within_tolerance() {
    let device = Device::cpu().unwrap();
    let mut worst = 0f32;
    for r in records() {
        let encoder = TextEncoder::load(
            &fixtures(),
            &device,
            DType::F32,
            TextEncoderMode::Resident,
            0,
        )
        .unwrap()
        .with_max_length(r.max_length)
        .unwrap();
        let got = encoder.encode(&r.prompt).unwrap();
        let want = npy(&format!("embeds_{}.npy", r.index), &device);
        assert_eq!(got.shape(), [r.max_length, 32]);
        let diff = max_abs_diff(&got, &want);
        assert!(diff <= TOLERANCE, "{}: max |diff| {diff}", r.name);
        worst = worst.max(diff);
        // Rows past the real tokens are exact zeros.
        let values = got.to_f32_vec().unwrap();
        assert!(values[r.n * 32..].iter().all(|&v| v == 0.0), "{}", r.name);
        assert!(values[..r.n * 32].iter().any(|&v| v != 0.0), "{}", r.name);
    }
    println!("max |diff| vs transformers: {worst:e}");
}

#[test]
fn masked_forward_equals_last_hidden_state() {
    // The whole padded sequence with the attention mask, padding rows included.
    let device = Device::cpu().unwrap();
    let encoder = Umt5Encoder::load(&fixtures().join("text_encoder"), &device, DType::F32).unwrap();
    for r in records() {
        let mask: Vec<bool> = (0..r.ids.len()).map(|i| i < r.n).collect();
        let got = encoder.forward(&r.ids, Some(&mask)).unwrap();
        let want = npy(&format!("hidden_{}.npy", r.index), &device);
        let diff = max_abs_diff(&got, &want);
        assert!(diff <= TOLERANCE, "{}: max |diff| {diff}", r.name);
    }
}

/// Max |diff| allowed for bf16 compute against the f32-compute embeddings (scale ~1).
const BF16_TOLERANCE: f32 = 0.03;

#[test]
fn bf16_weights_load_from_shards_and_compute_within_bf16_error_of_the_reference() {
    let device = Device::cpu().unwrap();
    let tokenizer = TextTokenizer::from_dir(&fixtures().join("tokenizer"), 16).unwrap();
    // Sharded bf16 files kept as bf16, and the f32 file rounded to bf16 on load.
    let sharded =
        Umt5Encoder::load(&fixtures().join("text_encoder_bf16"), &device, DType::BF16).unwrap();
    let rounded =
        Umt5Encoder::load(&fixtures().join("text_encoder"), &device, DType::BF16).unwrap();
    let f32_bytes = Umt5Encoder::load(&fixtures().join("text_encoder"), &device, DType::F32)
        .unwrap()
        .weight_bytes();
    assert!(
        sharded.weight_bytes() < f32_bytes * 6 / 10,
        "bf16 weights stay bf16"
    );
    for r in records().iter().filter(|r| r.max_length == 16) {
        let tokens = tokenizer.tokenize(&r.cleaned).unwrap();
        let want = npy(&format!("embeds_bf16_{}.npy", r.index), &device);
        for (what, encoder) in [("sharded", &sharded), ("rounded", &rounded)] {
            let hidden = encoder.forward(&tokens.ids[..tokens.n], None).unwrap();
            let got = want.narrow(0, 0, r.n).unwrap();
            let diff = max_abs_diff(&hidden, &got.contiguous().unwrap());
            // bf16 weights compute in bf16 (activations rounded as the GEMMs pack them,
            // f32 accumulation, f32 norms and softmax): the reference ran the same
            // bf16-rounded weights in f32, so the gap is bf16 activation rounding.
            assert!(
                diff <= BF16_TOLERANCE,
                "{what}: {}: max |diff| {diff}",
                r.name
            );
        }
    }
}

#[test]
fn missing_folders_are_named() {
    let device = Device::cpu().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let err = TextEncoder::load(
        empty.path(),
        &device,
        DType::F32,
        TextEncoderMode::Resident,
        0,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("text_encoder") && err.contains("missing"),
        "{err}"
    );
}
