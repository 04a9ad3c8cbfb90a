//! Wan's own T5 checkpoint (`models_t5_umt5-xxl-enc-bf16.pth`, Wan names, bf16) and its
//! `google/umt5-xxl/` tokenizer: the text fixtures' encoder written that way by
//! `tools/make_import_fixtures.py --t5` gives the same embeddings as the transformers
//! folder holding the same bf16 weights (whose numbers `golden_text.rs` checks against
//! transformers).

use std::path::{Path, PathBuf};

use headroom_tensor::{DType, Device};
use headroom_text::{TextEncoder, TextEncoderMode};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[test]
fn a_wan_t5_pth_encodes_like_the_transformers_folder_with_the_same_weights() {
    let device = Device::cpu().unwrap();
    let mode = TextEncoderMode::Resident;
    // The Wan repo layout: found by TextEncoder::load from the folder.
    let wan = TextEncoder::load(&fixtures().join("wan_t5"), &device, DType::BF16, mode, 0).unwrap();
    // The transformers twin: text_encoder_bf16/ + tokenizer/.
    let twin_dir = tempfile::tempdir().unwrap();
    for (from, to) in [
        ("text_encoder_bf16", "text_encoder"),
        ("tokenizer", "tokenizer"),
    ] {
        std::fs::create_dir(twin_dir.path().join(to)).unwrap();
        for entry in std::fs::read_dir(fixtures().join(from)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(
                entry.path(),
                twin_dir.path().join(to).join(entry.file_name()),
            )
            .unwrap();
        }
    }
    // Wan's file carries no config; its shapes say everything but the bucket distance,
    // which is UMT5-XXL's 128 (the text fixtures use 20, so the twin is told 128 too).
    let config = twin_dir.path().join("text_encoder/config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace(
        "\"relative_attention_max_distance\": 20",
        "\"relative_attention_max_distance\": 128",
    );
    assert!(text.contains("\"relative_attention_max_distance\": 128"));
    std::fs::write(&config, text).unwrap();
    let twin = TextEncoder::load(twin_dir.path(), &device, DType::BF16, mode, 0).unwrap();
    assert_eq!(wan.config(), twin.config(), "config from the .pth shapes");
    for prompt in ["a red fox in the snow", "Ein Hund läuft am Strand"] {
        let (a, b) = (wan.encode(prompt).unwrap(), twin.encode(prompt).unwrap());
        assert_eq!(a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap(), "{prompt}");
    }
}
