//! One tiny Wan model in every layout users download (made by
//! `tools/make_import_fixtures.py` from seeded diffusers models and checked there with
//! diffusers' own converters) gives diffusers' numbers through every loader.

use std::path::{Path, PathBuf};

use headroom_model::import::{load_transformer, load_vae, ImportOptions};
use headroom_tensor::io::npy::read_npy;
use headroom_tensor::io::safetensors::{save_safetensors, SafetensorsFile};
use headroom_tensor::{DType, Device, Tensor};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/import")
        .join(name)
}

fn assert_close(got: &Tensor, expected: &Tensor, what: &str) {
    assert_eq!(got.shape(), expected.shape(), "{what}");
    let (g, e) = (
        got.to_vec::<f32>().unwrap(),
        expected.to_vec::<f32>().unwrap(),
    );
    let err = headroom_tensor::compare::scaled_abs_diff(&g, &e).unwrap();
    assert!(err <= 1e-4, "{what}: max abs error over scale {err}");
}

fn dit_forward(path: &Path, options: &ImportOptions) -> Tensor {
    let dev = Device::cpu().unwrap();
    let model = load_transformer(path, options, &dev, DType::F32, None)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let x = read_npy(fixture("latents.npy"), &dev).unwrap();
    let text = read_npy(fixture("text.npy"), &dev).unwrap();
    let t = read_npy(fixture("timestep.npy"), &dev)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()[0];
    model.forward(&x, t, Some(&text), None).unwrap()
}

fn load_error(path: &Path, options: &ImportOptions) -> String {
    let dev = Device::cpu().unwrap();
    match load_transformer(path, options, &dev, DType::F32, None) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_dit_layout_gives_diffusers_numbers() {
    let dev = Device::cpu().unwrap();
    let expected = read_npy(fixture("dit_out.npy"), &dev).unwrap();
    let plain = ImportOptions::default();
    let with_config = ImportOptions {
        config: Some(fixture("wan/config.json")),
        ..ImportOptions::default()
    };
    // The base model's config, as `--transformer FILE` over `--model FOLDER` uses it.
    let base = ImportOptions {
        config: None,
        base: Some(
            headroom_model::import::open_transformer(&fixture("wan"), &plain, &dev, DType::F32)
                .unwrap()
                .0,
        ),
        ..ImportOptions::default()
    };
    for (path, options, what) in [
        (fixture("diffusers"), &plain, "diffusers pipeline folder"),
        (
            fixture("diffusers/transformer"),
            &plain,
            "diffusers transformer folder",
        ),
        (fixture("wan"), &plain, "original Wan folder"),
        (
            fixture("comfy.safetensors"),
            &with_config,
            "ComfyUI file + --config",
        ),
        (
            fixture("self_forcing.pt"),
            &base,
            "Self-Forcing .pt over the Wan folder",
        ),
    ] {
        assert_close(&dit_forward(&path, options), &expected, what);
    }
}

#[test]
fn every_vae_layout_gives_diffusers_numbers() {
    let dev = Device::cpu().unwrap();
    let z = read_npy(fixture("vae_latents.npy"), &dev).unwrap();
    let expected = read_npy(fixture("vae_decoded.npy"), &dev).unwrap();
    for (path, what) in [
        (fixture("diffusers"), "diffusers pipeline folder"),
        (fixture("wan"), "original Wan folder"),
        (
            fixture("wan/Wan2.1_VAE.pth"),
            "Wan2.1_VAE.pth, config from shapes",
        ),
    ] {
        let vae = load_vae(&path, &ImportOptions::default(), &dev, DType::F32)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_close(&vae.decode(&z).unwrap(), &expected, what);
    }
}

#[test]
fn a_file_without_config_whose_heads_cannot_be_inferred_asks_for_config() {
    let err = load_error(&fixture("comfy.safetensors"), &ImportOptions::default());
    assert!(
        err.contains("num_attention_heads") && err.contains("--config"),
        "{err}"
    );
}

#[test]
fn unknown_tensors_are_listed_with_the_layout_assumed() {
    let dev = Device::cpu().unwrap();
    let src = SafetensorsFile::open(fixture("wan/diffusion_pytorch_model.safetensors")).unwrap();
    let mut tensors = src.load_all(&dev, None).unwrap();
    tensors.insert(
        "blocks.0.mystery.weight".into(),
        Tensor::zeros(&[2], DType::F32, &dev).unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("wan/config.json"), dir.path().join("config.json")).unwrap();
    let list: Vec<(&str, &Tensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    save_safetensors(
        dir.path().join("diffusion_pytorch_model.safetensors"),
        &list,
    )
    .unwrap();
    let err = load_error(dir.path(), &ImportOptions::default());
    assert!(
        err.contains("blocks.0.mystery.weight") && err.contains("original Wan"),
        "{err}"
    );
}

#[test]
fn truncated_checkpoints_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // A .pt cut short loses its zip directory; a safetensors cut inside its header.
    let pt = std::fs::read(fixture("self_forcing.pt")).unwrap();
    let cut_pt = dir.path().join("cut.pt");
    std::fs::write(&cut_pt, &pt[..pt.len() / 2]).unwrap();
    let st = std::fs::read(fixture("comfy.safetensors")).unwrap();
    let cut_st = dir.path().join("cut.safetensors");
    std::fs::write(&cut_st, &st[..40]).unwrap();
    for path in [cut_pt, cut_st] {
        let err = load_error(&path, &ImportOptions::default());
        assert!(err.contains(&path.display().to_string()), "{err}");
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn lingbot_folders_are_found_and_v1_experts_must_be_chosen() {
    let dev = Device::cpu().unwrap();
    let expected = read_npy(fixture("dit_out.npy"), &dev).unwrap();
    let v2 = tempfile::tempdir().unwrap();
    copy_dir(&fixture("wan"), &v2.path().join("transformers"));
    assert_close(
        &dit_forward(v2.path(), &ImportOptions::default()),
        &expected,
        "LingBot v2 transformers/",
    );
    let v1 = tempfile::tempdir().unwrap();
    copy_dir(&fixture("wan"), &v1.path().join("high_noise_model"));
    copy_dir(&fixture("wan"), &v1.path().join("low_noise_model"));
    let err = load_error(v1.path(), &ImportOptions::default());
    assert!(
        err.contains("high_noise_model") && err.contains("--transformer"),
        "{err}"
    );
    let low = v1.path().join("low_noise_model");
    assert_close(
        &dit_forward(&low, &ImportOptions::default()),
        &expected,
        "LingBot v1 expert",
    );
}

#[test]
fn a_vae_safetensors_in_original_names_reads_like_the_pth() {
    use headroom_tensor::io::pth::PthFile;
    let dev = Device::cpu().unwrap();
    let pth = PthFile::open(fixture("wan/Wan2.1_VAE.pth")).unwrap();
    let tensors: Vec<(String, Tensor)> = pth
        .names()
        .into_iter()
        .map(|n| {
            let t = pth.load(&n, &dev, None).unwrap();
            (n, t)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wan_2.1_vae.safetensors");
    let list: Vec<(&str, &Tensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    save_safetensors(&path, &list).unwrap();
    let z = read_npy(fixture("vae_latents.npy"), &dev).unwrap();
    let expected = read_npy(fixture("vae_decoded.npy"), &dev).unwrap();
    let vae = load_vae(&path, &ImportOptions::default(), &dev, DType::F32).unwrap();
    assert_close(
        &vae.decode(&z).unwrap(),
        &expected,
        "ComfyUI-style VAE safetensors",
    );
}
