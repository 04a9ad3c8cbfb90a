//! Rotary positions are absolute and unbounded: a forward past the table's 1024 frames
//! grows it with the same formula, so it equals a model built with a larger table, and
//! every position below keeps its bytes.

use headroom_model::dit::{DitConfig, WanTransformer};
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::{DType, Device, Tensor};

fn config(rope_max_seq_len: usize) -> DitConfig {
    DitConfig {
        num_attention_heads: 2,
        attention_head_dim: 16,
        in_channels: 16,
        out_channels: Some(16),
        text_dim: 24,
        freq_dim: 32,
        ffn_dim: 64,
        num_layers: 2,
        rope_max_seq_len,
        ..DitConfig::default()
    }
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_f32_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// The velocity and the first layer's keys of one block at `first_frame`.
fn block_at(model: &WanTransformer, x: &Tensor, first_frame: usize) -> (Vec<u32>, Vec<u32>) {
    let grid = model.grid(x).unwrap();
    let text = model.text_key_values(None).unwrap();
    let (v, kvs) = model
        .forward_tokens(
            &model.embed(x).unwrap(),
            &grid.positions(first_frame),
            500.0,
            &text,
            None,
            Mask::None,
            None,
        )
        .unwrap();
    (bits(&v), bits(&kvs[0].k))
}

#[test]
fn frames_past_the_rotary_table_match_a_larger_table_and_earlier_frames_keep_their_bytes() {
    let dev = Device::cpu().unwrap();
    let x = Tensor::randn(&[1, 16, 3, 4, 6], 3, 0, DType::F32, &dev).unwrap();
    let grown = WanTransformer::seeded(config(1024), 9, &dev, DType::F32).unwrap();
    let large = WanTransformer::seeded(config(4096), 9, &dev, DType::F32).unwrap();
    let early = block_at(&grown, &x, 6);
    // Frame 2998: latent frame 3000 of a session (~12,000 frames), beyond 1024.
    let late = block_at(&grown, &x, 2998);
    assert_eq!(late, block_at(&large, &x, 2998), "past the table");
    assert_ne!(late.1, early.1, "the position changes the keys");
    assert_eq!(
        block_at(&grown, &x, 6),
        early,
        "below the table, after it grew"
    );
    assert_eq!(
        block_at(&large, &x, 6),
        early,
        "below the table, larger table"
    );
}
