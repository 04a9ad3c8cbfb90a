//! The bf16 path against diffusers' f32 outputs, held to at most twice PyTorch's own bf16
//! error on the same fixtures (`bf16_error.json`, made by `tools/make_bf16_errors.py`).

use std::path::PathBuf;

use headroom_model::{WanTransformer, WanVae};
use headroom_tensor::io::npy::read_npy;
use headroom_tensor::{DType, Device, Tensor};

fn fixture(kind: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(kind)
        .join(name)
}

fn torch_bf16_error(dir: &std::path::Path) -> f32 {
    let text = std::fs::read_to_string(dir.join("bf16_error.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["max_abs_error"].as_f64().unwrap() as f32
}

/// The largest |a − b| of two tensors of one shape.
fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    headroom_tensor::compare::max_abs_error(a, b).unwrap()
}

#[test]
fn bf16_dit_errs_at_most_twice_pytorch_bf16() {
    let dev = Device::cpu().unwrap();
    for name in ["t2v", "i2v36", "h2d16"] {
        let dir = fixture("dit", name);
        let model = WanTransformer::load(&dir, &dev, DType::BF16).unwrap();
        let x = read_npy(dir.join("latents.npy"), &dev).unwrap();
        let t = read_npy(dir.join("timestep.npy"), &dev)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()[0];
        let text = read_npy(dir.join("text.npy"), &dev).unwrap();
        let expected = read_npy(dir.join("out_text.npy"), &dev).unwrap();
        let got = model.forward(&x, t, Some(&text), None).unwrap();
        let (err, torch) = (max_abs_diff(&got, &expected), torch_bf16_error(&dir));
        println!("{name}: bf16 max abs error {err:e} (PyTorch bf16: {torch:e})");
        assert!(err <= 2.0 * torch, "{name}: {err} > 2 × {torch}");
    }
}

#[test]
fn bf16_vae_decode_errs_at_most_twice_pytorch_bf16() {
    let dev = Device::cpu().unwrap();
    for name in ["tiny_t0", "tiny_t1", "tiny_t2_attn"] {
        let dir = fixture("vae", name);
        let vae = WanVae::load(&dir, &dev, DType::BF16).unwrap();
        let z = read_npy(dir.join("latents.npy"), &dev).unwrap();
        let expected = read_npy(dir.join("decoded.npy"), &dev).unwrap();
        let got = vae.decode(&z).unwrap();
        let (err, torch) = (max_abs_diff(&got, &expected), torch_bf16_error(&dir));
        println!("{name}: bf16 decode max abs error {err:e} (PyTorch bf16: {torch:e})");
        assert!(err <= 2.0 * torch, "{name}: {err} > 2 × {torch}");
    }
}
