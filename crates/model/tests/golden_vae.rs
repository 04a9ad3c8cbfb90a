//! The VAE against diffusers 0.42.1: fixtures made by `tools/make_vae_fixtures.py` (tiny
//! configs, seeded weights saved with `save_pretrained`, inputs and `AutoencoderKLWan`
//! outputs).

use std::path::PathBuf;

use headroom_model::{OutputFormat, StreamingDecodeState, StreamingDecoder, WanVae};
use headroom_tensor::io::npy::read_npy;
use headroom_tensor::{DType, Device, Tensor};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vae")
        .join(name)
}

/// The largest |a − b| of two tensors of one shape.
fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    headroom_tensor::compare::max_abs_error(a, b).unwrap()
}

const CONFIGS: [&str; 3] = ["tiny_t1", "tiny_t2_attn", "tiny_t0"];

#[test]
fn decode_matches_diffusers_within_1e_4() {
    let dev = Device::cpu().unwrap();
    for name in CONFIGS {
        let dir = fixture(name);
        let vae = WanVae::load(&dir, &dev, DType::F32).unwrap();
        let z = read_npy(dir.join("latents.npy"), &dev).unwrap();
        let expected = read_npy(dir.join("decoded.npy"), &dev).unwrap();
        let got = vae.decode(&z).unwrap();
        let err = max_abs_diff(&got, &expected);
        println!("{name}: decode max abs error {err:e}");
        assert!(err <= 1e-4, "{name}: decode max abs error {err}");
    }
}

#[test]
fn encode_matches_diffusers_within_1e_4() {
    let dev = Device::cpu().unwrap();
    for name in CONFIGS {
        let dir = fixture(name);
        let vae = WanVae::load(&dir, &dev, DType::F32).unwrap();
        let video = read_npy(dir.join("video.npy"), &dev).unwrap();
        let expected = read_npy(dir.join("encoded_mean.npy"), &dev).unwrap();
        let got = vae.encode(&video).unwrap();
        let err = max_abs_diff(&got, &expected);
        println!("{name}: encode max abs error {err:e}");
        assert!(err <= 1e-4, "{name}: encode max abs error {err}");
    }
}

#[test]
fn streamed_decode_of_a_real_checkpoint_equals_its_one_call_decode() {
    let dev = Device::cpu().unwrap();
    let dir = fixture("tiny_t2_attn");
    let vae = WanVae::load(&dir, &dev, DType::F32).unwrap();
    let z = read_npy(dir.join("latents.npy"), &dev).unwrap();
    let whole = vae.decode(&z).unwrap().to_vec::<f32>().unwrap();
    let decoder = StreamingDecoder::new(&vae, None);
    let mut state = StreamingDecodeState::new("s").unwrap();
    let mut parts = Vec::new();
    for i in 0..3 {
        let out = decoder
            .decode_chunk(
                &z.narrow(2, i, 1).unwrap(),
                &mut state,
                OutputFormat::Video,
                true,
            )
            .unwrap();
        parts.push(out.unwrap());
    }
    let streamed = Tensor::cat(&parts.iter().collect::<Vec<_>>(), 2)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(streamed, whole);
}

#[test]
fn loading_names_a_missing_or_misshaped_tensor_with_both_shapes() {
    let dev = Device::cpu().unwrap();
    let src = fixture("tiny_t0");
    let dir = tempfile::tempdir().unwrap();
    let file = headroom_tensor::io::safetensors::SafetensorsFile::open(
        src.join("diffusion_pytorch_model.safetensors"),
    )
    .unwrap();
    let mut tensors = file.load_all(&dev, None).unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let save = |tensors: &std::collections::BTreeMap<String, Tensor>| {
        let list: Vec<(&str, &Tensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        headroom_tensor::io::safetensors::save_safetensors(
            dir.path().join("diffusion_pytorch_model.safetensors"),
            &list,
        )
        .unwrap();
    };
    let bias = tensors.remove("decoder.conv_out.bias").unwrap();
    save(&tensors);
    let err = WanVae::load(dir.path(), &dev, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing tensor \"decoder.conv_out.bias\"") && err.contains("[3]"),
        "{err}"
    );
    tensors.insert(
        "decoder.conv_out.bias".into(),
        bias.narrow(0, 0, 2).unwrap(),
    );
    save(&tensors);
    let err = WanVae::load(dir.path(), &dev, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"decoder.conv_out.bias\"") && err.contains("[2]") && err.contains("[3]"),
        "{err}"
    );
}

#[test]
fn a_sharded_checkpoint_loads_like_a_single_file() {
    let dev = Device::cpu().unwrap();
    let src = fixture("tiny_t1");
    let file = headroom_tensor::io::safetensors::SafetensorsFile::open(
        src.join("diffusion_pytorch_model.safetensors"),
    )
    .unwrap();
    let tensors = file.load_all(&dev, None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let mut weight_map = serde_json::Map::new();
    let names: Vec<&String> = tensors.keys().collect();
    for (shard, chunk) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file_name = format!(
            "diffusion_pytorch_model-0000{}-of-00002.safetensors",
            shard + 1
        );
        let list: Vec<(&str, &Tensor)> = chunk.iter().map(|k| (k.as_str(), &tensors[*k])).collect();
        headroom_tensor::io::safetensors::save_safetensors(dir.path().join(&file_name), &list)
            .unwrap();
        for k in chunk {
            weight_map.insert((*k).clone(), file_name.clone().into());
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(
        dir.path()
            .join("diffusion_pytorch_model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let sharded = WanVae::load(dir.path(), &dev, DType::F32).unwrap();
    let single = WanVae::load(&src, &dev, DType::F32).unwrap();
    let z = read_npy(src.join("latents.npy"), &dev).unwrap();
    assert_eq!(
        sharded.decode(&z).unwrap().to_vec::<f32>().unwrap(),
        single.decode(&z).unwrap().to_vec::<f32>().unwrap()
    );
}

#[test]
fn encoding_a_stream_in_pieces_equals_encoding_it_whole() {
    use headroom_model::vae::StreamingEncodeState;
    let dev = Device::cpu().unwrap();
    let dir = fixture("tiny_t2_attn");
    let vae = WanVae::load(&dir, &dev, DType::F32).unwrap();
    let video = read_npy(dir.join("video.npy"), &dev).unwrap(); // 9 frames
    let whole = vae.encode(&video).unwrap().to_vec::<f32>().unwrap();
    let mut state = StreamingEncodeState::default();
    let a = vae
        .encode_frames(&video.narrow(2, 0, 5).unwrap(), &mut state)
        .unwrap();
    let b = vae
        .encode_frames(&video.narrow(2, 5, 4).unwrap(), &mut state)
        .unwrap();
    let pieces = Tensor::cat(&[&a, &b], 2).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(pieces, whole);
    let err = vae
        .encode_frames(&video.narrow(2, 0, 3).unwrap(), &mut state)
        .unwrap_err()
        .to_string();
    assert!(err.contains("whole chunks"), "{err}");
}
