//! The transformer against diffusers 0.42.1 `WanTransformer3DModel`: fixtures made by
//! `tools/make_dit_fixtures.py` (tiny configs, seeded weights, inputs, outputs).

use std::path::PathBuf;

use headroom_model::WanTransformer;
use headroom_tensor::io::npy::read_npy;
use headroom_tensor::{DType, Device};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/dit")
        .join(name)
}

#[test]
fn forward_matches_diffusers_with_and_without_text() {
    let dev = Device::cpu().unwrap();
    for name in ["t2v", "i2v36", "h2d16"] {
        let dir = fixture(name);
        let model = WanTransformer::load(&dir, &dev, DType::F32).unwrap();
        let x = read_npy(dir.join("latents.npy"), &dev).unwrap();
        let t = read_npy(dir.join("timestep.npy"), &dev)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()[0];
        let text = read_npy(dir.join("text.npy"), &dev).unwrap();
        for (with_text, file) in [(true, "out_text.npy"), (false, "out_notext.npy")] {
            let expected = read_npy(dir.join(file), &dev).unwrap();
            let got = model
                .forward(&x, t, with_text.then_some(&text), None)
                .unwrap();
            assert_eq!(got.shape(), expected.shape());
            let (g, e) = (
                got.to_vec::<f32>().unwrap(),
                expected.to_vec::<f32>().unwrap(),
            );
            let scale = e.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let err = g
                .iter()
                .zip(&e)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            println!("{name} text={with_text}: max abs error {err:e} (output scale {scale})");
            assert!(
                err <= 1e-4 * scale.max(1.0),
                "{name} text={with_text}: {err}"
            );
        }
    }
}

/// The t2v fixture plus camera weights that are all zero, the adapter's patch embedding
/// `width` wide, in a temporary folder.
fn with_zero_adapter(src: &std::path::Path, width: usize, dev: &Device) -> tempfile::TempDir {
    use headroom_tensor::Tensor;
    let file = headroom_tensor::io::safetensors::SafetensorsFile::open(
        src.join("diffusion_pytorch_model.safetensors"),
    )
    .unwrap();
    let mut tensors = file.load_all(dev, None).unwrap();
    let dim = 36;
    let zeros = |shape: &[usize]| Tensor::zeros(shape, DType::F32, dev).unwrap();
    for (name, shape) in [
        ("patch_embedding_wancamctrl", [dim, width]),
        ("c2ws_hidden_states_layer1", [dim, dim]),
        ("c2ws_hidden_states_layer2", [dim, dim]),
    ] {
        tensors.insert(format!("{name}.weight"), zeros(&shape));
        tensors.insert(format!("{name}.bias"), zeros(&[dim]));
    }
    for b in 0..2 {
        for layer in [
            "cam_injector_layer1",
            "cam_injector_layer2",
            "cam_scale_layer",
            "cam_shift_layer",
        ] {
            tensors.insert(format!("blocks.{b}.{layer}.weight"), zeros(&[dim, dim]));
            tensors.insert(format!("blocks.{b}.{layer}.bias"), zeros(&[dim]));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let list: Vec<(&str, &Tensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    headroom_tensor::io::safetensors::save_safetensors(
        dir.path().join("diffusion_pytorch_model.safetensors"),
        &list,
    )
    .unwrap();
    dir
}

/// A zero camera adapter taking rays folded `fold`×`fold` leaves the t2v fixture's
/// velocity byte-identical (rays of a `wl` flight on the pixel grid of its latents).
fn zero_adapter_is_plain_wan(fold: usize) {
    use headroom_model::camera::{framewise_deltas, identity, ray_embedding, Controller, Keys};
    let dev = Device::cpu().unwrap();
    let src = fixture("t2v");
    let plain = WanTransformer::load(&src, &dev, DType::F32).unwrap();
    assert!(!plain.has_camera());
    assert_eq!(plain.camera_fold(), None);
    let dir = with_zero_adapter(&src, 6 * fold * fold * 4, &dev);
    let with_camera = WanTransformer::load(dir.path(), &dev, DType::F32).unwrap();
    assert!(with_camera.has_camera());
    assert_eq!(with_camera.camera_fold(), Some(fold));
    let x = read_npy(src.join("latents.npy"), &dev).unwrap();
    let mut c = Controller::default();
    let poses: Vec<_> = std::iter::once(identity())
        .chain((0..3).map(|_| c.step(Keys::parse("wl").unwrap())))
        .collect();
    let deltas = framewise_deltas(&poses, None);
    let [h, w] = [x.shape()[3] * fold, x.shape()[4] * fold];
    let k = [[500.0, 500.0, w as f64 / 2.0, h as f64 / 2.0]];
    let rays = ray_embedding(&deltas[1..], h, w, &k, fold, &dev).unwrap();
    let cam = with_camera.camera_tokens(&rays).unwrap().unwrap();
    // Rays of another fold do not fit the adapter.
    let other = ray_embedding(&deltas[1..], h, w, &k, fold / 2, &dev).unwrap();
    let err = with_camera.camera_tokens(&other).unwrap_err().to_string();
    assert!(
        err.contains(&format!("{} channels", 6 * fold * fold)),
        "{err}"
    );
    let grid = with_camera.grid(&x).unwrap();
    let text = with_camera.text_key_values(None).unwrap();
    let tokens = with_camera.embed(&x).unwrap();
    let mask = headroom_tensor::ops::attention::Mask::None;
    let (a, _) = with_camera
        .forward_tokens(
            &tokens,
            &grid.positions(0),
            500.0,
            &text,
            None,
            mask,
            Some(&cam),
        )
        .unwrap();
    let (b, _) = plain
        .forward_tokens(
            &tokens,
            &grid.positions(0),
            500.0,
            &plain.text_key_values(None).unwrap(),
            None,
            mask,
            None,
        )
        .unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
}

#[test]
fn a_zero_initialised_camera_adapter_leaves_the_model_plain_wan() {
    zero_adapter_is_plain_wan(8);
}

#[test]
fn the_camera_adapter_takes_the_fold_its_width_says() {
    // A 4× VAE's adapter: rays folded 4×4, 96 channels a latent cell.
    zero_adapter_is_plain_wan(4);
    // A width that is no 6·s²·patch is refused at load, naming the key.
    let dev = Device::cpu().unwrap();
    let dir = with_zero_adapter(&fixture("t2v"), 100 * 4, &dev);
    let err = WanTransformer::load(dir.path(), &dev, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("patch_embedding_wancamctrl"), "{err}");
}
