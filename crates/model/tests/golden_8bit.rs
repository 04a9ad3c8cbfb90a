//! 8-bit checkpoints as users download them (made by `tools/make_fp8_fixtures.py` from
//! the `t2v` golden DiT): ComfyUI's `fp8_scaled` (per-tensor `scale_weight`, the
//! `scaled_fp8` marker, an 8-bit tensor outside the blocks), Kijai's plain
//! `fp8_e4m3fn` and lightx2v's int8 with per-channel `weight_scale`. Each loads with its
//! linears kept in 8 bits and gives diffusers' forward on the weights it holds: fp8
//! within twice PyTorch's own bf16 error, int8 (its products W8A8) within 3 % relative
//! L2. A layout it does not read is refused by name.

use std::path::PathBuf;

use headroom_model::import::{load_transformer, ImportOptions};
use headroom_model::{DitConfig, WeightFormat};
use headroom_tensor::io::npy::read_npy;
use headroom_tensor::io::safetensors::{save_safetensors, SafetensorsFile};
use headroom_tensor::{DType, Device, Tensor};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fp8")
        .join(name)
}

fn options(weights: WeightFormat) -> ImportOptions {
    let config = std::fs::read_to_string(fixture("config.json")).unwrap();
    let config = DitConfig::from_json(&serde_json::from_str(&config).unwrap()).unwrap();
    ImportOptions {
        base: Some(config),
        weights,
        ..ImportOptions::default()
    }
}

/// The forward of `file` loaded in bf16 as `weights`, and the bytes its weights took.
fn forward(file: &str, weights: WeightFormat) -> (Tensor, u64) {
    let dev = Device::cpu().unwrap();
    let model = load_transformer(&fixture(file), &options(weights), &dev, DType::BF16, None)
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let bytes = dev.platform().memory_stats().allocated_now();
    let x = read_npy(fixture("latents.npy"), &dev).unwrap();
    let text = read_npy(fixture("text.npy"), &dev).unwrap();
    let t = read_npy(fixture("timestep.npy"), &dev)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()[0];
    (model.forward(&x, t, Some(&text), None).unwrap(), bytes)
}

fn bf16_error(name: &str) -> f32 {
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("bf16_error.json")).unwrap())
            .unwrap();
    info["max_abs_error"][name].as_f64().unwrap() as f32
}

#[test]
fn fp8_files_give_diffusers_numbers_within_twice_its_bf16_error() {
    let dev = Device::cpu().unwrap();
    for name in ["comfy_fp8_scaled", "kijai_fp8_e4m3fn"] {
        let expected = read_npy(fixture(&format!("out_{name}.npy")), &dev).unwrap();
        let (got, _) = forward(&format!("{name}.safetensors"), WeightFormat::Native);
        let err = headroom_tensor::compare::max_abs_error(&got, &expected).unwrap();
        let bound = 2.0 * bf16_error(name);
        assert!(
            err <= bound,
            "{name}: {err} against 2 × PyTorch's bf16 error = {bound}"
        );
    }
}

#[test]
fn an_int8_file_gives_diffusers_numbers_within_three_percent() {
    let dev = Device::cpu().unwrap();
    let expected = read_npy(fixture("out_int8_weight_scale.npy"), &dev).unwrap();
    let (got, _) = forward("int8_weight_scale.safetensors", WeightFormat::Native);
    let rel = headroom_tensor::compare::relative_l2(&got, &expected).unwrap();
    assert!(rel < 0.03, "relative L2 {rel}");
}

#[test]
fn eight_bit_linears_stay_eight_bit_and_weights_can_change_format() {
    let (_, fp8) = forward("comfy_fp8_scaled.safetensors", WeightFormat::Native);
    let (_, int8) = forward("int8_weight_scale.safetensors", WeightFormat::Native);
    // The same file dequantized at load: its linears in bf16.
    let dev = Device::cpu().unwrap();
    let (codes, scale) = {
        let f = SafetensorsFile::open(fixture("comfy_fp8_scaled.safetensors")).unwrap();
        let key = "model.diffusion_model.blocks.0.ffn.0";
        (
            f.load(&format!("{key}.weight"), &dev, None).unwrap(),
            f.load(&format!("{key}.scale_weight"), &dev, None).unwrap(),
        )
    };
    assert_eq!(codes.dtype(), DType::F8E4M3);
    assert_eq!(scale.numel(), 1);
    // Each block linear value is one byte against bf16's two: 2 blocks × (8 · 36² +
    // 2 · 36 · 72) values.
    let linears = 2 * (8 * 36 * 36 + 2 * 36 * 72) as u64;
    let (_, requantized) = forward("comfy_fp8_scaled.safetensors", WeightFormat::Int8);
    let bf16 = {
        let model = load_transformer(
            &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dit/t2v"),
            &ImportOptions::default(),
            &dev,
            DType::BF16,
            None,
        )
        .unwrap();
        assert_eq!(model.config().num_layers, 2);
        dev.platform().memory_stats().allocated_now()
    };
    for (what, bytes) in [("fp8", fp8), ("int8", int8), ("fp8 → int8", requantized)] {
        assert!(
            bytes + linears * 9 / 10 <= bf16,
            "{what}: {bytes} bytes against bf16's {bf16}"
        );
    }
    // A format change on load computes with the new format: close to the file's numbers.
    let (native, _) = forward("comfy_fp8_scaled.safetensors", WeightFormat::Native);
    let (as_int8, _) = forward("comfy_fp8_scaled.safetensors", WeightFormat::Int8);
    let rel = headroom_tensor::compare::relative_l2(&as_int8, &native).unwrap();
    assert!(rel > 0.0 && rel < 0.03, "fp8 → int8: relative L2 {rel}");
}

#[test]
fn a_layout_it_does_not_read_is_refused_by_name() {
    // Block-wise scales: one per 18 inputs of each output.
    let err = load_changed("comfy_fp8_scaled.safetensors", |key, t| {
        let blockwise = key == "model.diffusion_model.blocks.0.self_attn.q.scale_weight";
        Some(if blockwise {
            Tensor::full(&[36, 2], 0.01, DType::F32, t.device()).unwrap()
        } else {
            t
        })
    });
    assert!(
        err.contains("block-wise") && err.contains("scale_weight"),
        "{err}"
    );
    // An int8 weight without its scale.
    let err = load_changed("int8_weight_scale.safetensors", |key, t| {
        (key != "blocks.1.ffn.2.weight_scale").then_some(t)
    });
    assert!(
        err.contains("blocks.1.ffn.net.2.weight") && err.contains("weight_scale"),
        "{err}"
    );
}

/// The error of loading fixture `file` with each tensor passed through `change` (`None`
/// drops it).
fn load_changed(file: &str, change: impl Fn(&str, Tensor) -> Option<Tensor>) -> String {
    let dev = Device::cpu().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let changed: Vec<(String, Tensor)> = SafetensorsFile::open(fixture(file))
        .unwrap()
        .load_all(&dev, None)
        .unwrap()
        .into_iter()
        .filter_map(|(k, t)| change(&k, t).map(|t| (k, t)))
        .collect();
    let path = dir.path().join(file);
    let refs: Vec<(&str, &Tensor)> = changed.iter().map(|(k, t)| (k.as_str(), t)).collect();
    save_safetensors(&path, &refs).unwrap();
    load_transformer(
        &path,
        &options(WeightFormat::Native),
        &dev,
        DType::BF16,
        None,
    )
    .unwrap_err()
    .to_string()
}

/// Every 8-bit layout loads onto a GPU device and runs its forward there with the
/// linears kept in 8 bits (on the checked launcher: every launch checked, nothing
/// computed): the codes and scales upload as they are, a file's 8-bit tensors outside the
/// linears widen on the device, and each product runs the 8-bit path (the fixture's
/// widths are not multiples of 16, so the path that widens each weight).
#[test]
fn eight_bit_files_run_their_forward_on_a_gpu_device() {
    use headroom_mem::{AllocatorConfig, CachingPlatform, ReclaimPolicy};
    use headroom_tensor::cuda::check::CheckedLauncher;
    use std::sync::Arc;
    for (file, quantizer, widen) in [
        (
            "comfy_fp8_scaled.safetensors",
            "quantize_rows_e4m3",
            "e4m3_to_bf16",
        ),
        (
            "kijai_fp8_e4m3fn.safetensors",
            "quantize_rows_e4m3",
            "e4m3_to_bf16",
        ),
        (
            "int8_weight_scale.safetensors",
            "quantize_rows_i8",
            "i8_to_bf16",
        ),
    ] {
        let platform =
            CachingPlatform::sim(8 << 30, AllocatorConfig::default(), ReclaimPolicy::Never)
                .unwrap();
        let checker = Arc::new(CheckedLauncher::new().unwrap());
        let gpu = Device::with_launcher(Arc::new(platform), checker.clone());
        let options = options(WeightFormat::Native);
        let model = load_transformer(&fixture(file), &options, &gpu, DType::BF16, None)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let x = read_npy(fixture("latents.npy"), &gpu).unwrap();
        let text = read_npy(fixture("text.npy"), &gpu).unwrap();
        let out = model.forward(&x, 500.0, Some(&text), None).unwrap();
        assert_eq!(out.shape(), x.shape(), "{file}");
        let seen = checker.report();
        let products = seen
            .launches
            .get("scale_bias_act_f32")
            .copied()
            .unwrap_or(0);
        let quantized: u64 = seen
            .launches
            .iter()
            .filter(|(k, _)| k.starts_with(quantizer))
            .map(|(_, n)| n)
            .sum();
        // Each product quantizes its input (aligned shapes) or widens its weight.
        let widened = seen.launches.get(widen).copied().unwrap_or(0);
        assert!(
            products > 0 && quantized + widened == products,
            "{file}: {seen:?}"
        );
    }
}
