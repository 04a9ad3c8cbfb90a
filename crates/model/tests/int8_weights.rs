//! `--weights int8`: the DiT blocks' linears quantized per output channel at load, their
//! products W8A8: the forward stays close to the f32 one, the weights take fewer bytes
//! than the same network held natively in the same dtype, and the bytes repeat run to
//! run.

use headroom_model::dit::{DitConfig, WanTransformer};
use headroom_model::{WeightFormat, WeightStore};
use headroom_tensor::{DType, Device, Tensor};

fn config() -> DitConfig {
    DitConfig {
        num_attention_heads: 4,
        attention_head_dim: 32,
        in_channels: 16,
        out_channels: Some(16),
        text_dim: 24,
        freq_dim: 32,
        ffn_dim: 320,
        num_layers: 2,
        ..DitConfig::default()
    }
}

/// The seeded network held as `format`, and the bytes its weights took.
fn load(format: WeightFormat, dtype: DType) -> (WanTransformer, Device, i64) {
    let dev = Device::cpu().unwrap();
    let before = dev.platform().memory_stats().allocated_now();
    let store = WeightStore::seeded(5, &dev, dtype).with_format(format);
    let model = WanTransformer::from_store(config(), &store).unwrap();
    let bytes = dev.platform().memory_stats().allocated_now() as i64 - before as i64;
    (model, dev, bytes)
}

fn forward(model: &WanTransformer, dev: &Device) -> Tensor {
    let x = Tensor::randn(&[1, 16, 3, 6, 8], 1, 0, DType::F32, dev).unwrap();
    let text = Tensor::randn(&[7, 24], 2, 0, DType::F32, dev).unwrap();
    model.forward(&x, 500.0, Some(&text), None).unwrap()
}

#[test]
fn an_int8_forward_is_within_three_percent_of_the_f32_one_in_fewer_bytes() {
    let (f32_model, dev, _) = load(WeightFormat::Native, DType::F32);
    let reference = forward(&f32_model, &dev);
    drop(f32_model);
    // The blocks' linears here: 2 × (8 · 128² + 2 · 128 · 320) values.
    let linears = 2 * (8 * 128 * 128 + 2 * 128 * 320);
    for dtype in [DType::F32, DType::BF16] {
        let (native, _, native_bytes) = load(WeightFormat::Native, dtype);
        drop(native);
        let (model, dev, bytes) = load(WeightFormat::Int8, dtype);
        let out = forward(&model, &dev);
        let error = headroom_tensor::compare::relative_l2(&out, &reference).unwrap();
        assert!(error < 0.03, "{dtype}: relative L2 {error}");
        assert!(error > 0.0, "{dtype}: the int8 path ran");
        // Each linear value went from the dtype's bytes to one (norms, embeddings and
        // the head stay as loaded; scales take 8 bytes a channel).
        let saved = (dtype.size() as i64 - 1) * linears;
        assert!(
            native_bytes - bytes >= saved * 9 / 10,
            "{dtype}: {bytes} bytes against {native_bytes} natively"
        );
        assert_eq!(
            forward(&model, &dev).to_f32_vec().unwrap(),
            out.to_f32_vec().unwrap(),
            "{dtype}: the same bytes twice"
        );
    }
}
