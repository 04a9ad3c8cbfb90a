//! Block-causal generation with a KV cache equals one full forward with a block-causal
//! mask, on a seeded tiny transformer.

use headroom_model::dit::{DitConfig, KeyValues, WanTransformer};
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::{DType, Device, Tensor};

fn tiny() -> DitConfig {
    DitConfig {
        num_attention_heads: 3,
        attention_head_dim: 12,
        in_channels: 16,
        out_channels: Some(16),
        text_dim: 20,
        freq_dim: 32,
        ffn_dim: 72,
        num_layers: 2,
        ..DitConfig::default()
    }
}

#[test]
fn incremental_blocks_with_a_kv_cache_equal_the_masked_full_forward() {
    let dev = Device::cpu().unwrap();
    let model = WanTransformer::seeded(tiny(), 3, &dev, DType::F32).unwrap();
    let x = Tensor::randn(&[1, 16, 6, 4, 6], 1, 0, DType::F32, &dev).unwrap();
    let text = Tensor::randn(&[5, 20], 2, 0, DType::F32, &dev).unwrap();
    let t = 625.0;
    let full = model.forward(&x, t, Some(&text), Some(3)).unwrap();

    let text_kv = model.text_key_values(Some(&text)).unwrap();
    let mut past: Option<Vec<KeyValues>> = None;
    let mut outs = Vec::new();
    for block in 0..2 {
        let chunk = x.narrow(2, 3 * block, 3).unwrap();
        let grid = model.grid(&chunk).unwrap();
        let tokens = model.embed(&chunk).unwrap();
        let (v, own) = model
            .forward_tokens(
                &tokens,
                &grid.positions(3 * block),
                t,
                &text_kv,
                past.as_deref(),
                Mask::None,
                None,
            )
            .unwrap();
        outs.push(model.unpatchify(&v, grid).unwrap());
        past = Some(match past {
            None => own,
            Some(p) => p
                .iter()
                .zip(own)
                .map(|(p, o)| KeyValues {
                    k: Tensor::cat(&[&p.k, &o.k], 1).unwrap(),
                    v: Tensor::cat(&[&p.v, &o.v], 1).unwrap(),
                })
                .collect(),
        });
    }
    let incremental = Tensor::cat(&[&outs[0], &outs[1]], 2).unwrap();
    let (a, b) = (
        full.to_vec::<f32>().unwrap(),
        incremental.to_vec::<f32>().unwrap(),
    );
    let err = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    println!("block-causal incremental vs masked full: max abs error {err:e}");
    assert!(err <= 1e-5, "{err}");
    // Without the mask the first block would see the second: outputs differ.
    let unmasked = model
        .forward(&x, t, Some(&text), None)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(unmasked.iter().zip(&a).any(|(x, y)| (x - y).abs() > 1e-4));
}

#[test]
fn the_real_model_shapes_build_on_a_modelled_device() {
    let dev = Device::sim(1 << 40).unwrap();
    let config = DitConfig {
        num_attention_heads: 12,
        ffn_dim: 8960,
        num_layers: 30,
        in_channels: 16,
        ..DitConfig::default()
    };
    let model = WanTransformer::seeded(config, 1, &dev, DType::BF16).unwrap();
    let x = Tensor::zeros(&[1, 16, 3, 60, 104], DType::F32, &dev).unwrap();
    let v = model.forward(&x, 1000.0, None, None).unwrap();
    assert_eq!(v.shape(), [1, 16, 3, 60, 104]);
    let weights = dev.platform().memory_stats().allocated_bytes.all().peak;
    println!(
        "Wan2.1-1.3B meta forward: peak allocated {:.2} GiB",
        weights as f64 / (1u64 << 30) as f64
    );
}
