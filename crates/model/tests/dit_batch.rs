//! A batched forward of several sessions' tokens gives each session the bytes of its
//! forward alone: rows never mix, on every CPU path this machine runs, in f32 and bf16.

use headroom_model::dit::{BatchItem, DitConfig, KeyValues, TextKeyValues, WanTransformer};
use headroom_tensor::kernels::cpu::{set_path, CpuPath};
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::{DType, Device, Tensor};

fn config() -> DitConfig {
    DitConfig {
        num_attention_heads: 4,
        attention_head_dim: 16,
        in_channels: 16,
        out_channels: Some(16),
        text_dim: 24,
        freq_dim: 32,
        ffn_dim: 160,
        num_layers: 2,
        ..DitConfig::default()
    }
}

/// One session's inputs: its latents' tokens, positions, timestep, text, past and
/// camera tokens.
struct Input {
    tokens: Tensor,
    positions: Vec<[usize; 3]>,
    t: f32,
    text: TextKeyValues,
    past: Option<Vec<KeyValues>>,
    camera: Tensor,
}

fn input(
    model: &WanTransformer,
    dev: &Device,
    seed: u64,
    [h, w]: [usize; 2],
    first: usize,
    t: f32,
    text_tokens: Option<usize>,
) -> Input {
    let x = Tensor::randn(&[1, 16, 3, h, w], seed, 0, DType::F32, dev).unwrap();
    let grid = model.grid(&x).unwrap();
    let text =
        text_tokens.map(|n| Tensor::randn(&[n, 24], seed + 100, 0, DType::F32, dev).unwrap());
    let rays = Tensor::randn(&[1, 384, 3, h, w], seed + 200, 0, DType::F32, dev).unwrap();
    // Earlier frames' keys/values: the session's own previous block, run alone.
    let past = (first > 0).then(|| {
        let prev = Tensor::randn(&[1, 16, 3, h, w], seed + 300, 0, DType::F32, dev).unwrap();
        let text = model.text_key_values(None).unwrap();
        let cam = model.camera_tokens(&rays).unwrap().unwrap();
        model
            .forward_tokens(
                &model.embed(&prev).unwrap(),
                &grid.positions(first - 3),
                0.0,
                &text,
                None,
                Mask::None,
                Some(&cam),
            )
            .unwrap()
            .1
    });
    Input {
        tokens: model.embed(&x).unwrap(),
        positions: grid.positions(first),
        t,
        text: model.text_key_values(text.as_ref()).unwrap(),
        past,
        camera: model.camera_tokens(&rays).unwrap().unwrap(),
    }
}

fn item(i: &Input) -> BatchItem<'_> {
    BatchItem {
        tokens: &i.tokens,
        positions: &i.positions,
        t: i.t,
        text: &i.text,
        past: i.past.as_deref(),
        camera: Some(&i.camera),
    }
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn assert_same(alone: &(Tensor, Vec<KeyValues>), batched: &(Tensor, Vec<KeyValues>), what: &str) {
    assert_eq!(alone.0.shape(), batched.0.shape(), "{what}");
    assert!(
        bits(&alone.0) == bits(&batched.0),
        "{what}: velocity differs"
    );
    for (l, (a, b)) in alone.1.iter().zip(&batched.1).enumerate() {
        assert!(bits(&a.k) == bits(&b.k), "{what}: keys of layer {l} differ");
        assert!(
            bits(&a.v) == bits(&b.v),
            "{what}: values of layer {l} differ"
        );
    }
}

#[test]
fn a_batched_forward_gives_each_session_the_bytes_of_its_forward_alone_on_every_path() {
    let dev = Device::cpu().unwrap();
    let mut ran = Vec::new();
    for path in CpuPath::ALL {
        if !path.supported() {
            continue;
        }
        set_path(Some(path)).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let model = WanTransformer::seeded(config(), 7, &dev, dtype).unwrap();
            // Different resolutions, timesteps, prompts and histories; 3·12·16 rows
            // (144, as a `world` block) beside smaller ones, 360 rows stacked.
            let inputs = [
                input(&model, &dev, 1, [12, 16], 0, 1000.0, None),
                input(&model, &dev, 2, [8, 8], 3, 937.5, Some(5)),
                input(&model, &dev, 3, [12, 16], 6, 0.0, Some(9)),
                input(&model, &dev, 4, [4, 8], 3, 625.0, None),
            ];
            let alone: Vec<_> = inputs
                .iter()
                .map(|i| {
                    let it = item(i);
                    model
                        .forward_tokens(
                            it.tokens,
                            it.positions,
                            it.t,
                            it.text,
                            it.past,
                            Mask::None,
                            it.camera,
                        )
                        .unwrap()
                })
                .collect();
            for n in [1, 2, 4] {
                let items: Vec<_> = inputs[..n].iter().map(item).collect();
                let batched = model.forward_batch(&items, Mask::None).unwrap();
                assert_eq!(batched.len(), n);
                for (k, (a, b)) in alone.iter().zip(&batched).enumerate() {
                    assert_same(a, b, &format!("{path} {dtype:?} batch of {n}, session {k}"));
                }
            }
        }
        ran.push(path.name());
    }
    set_path(None).unwrap();
    println!("paths checked: {ran:?}");
}

#[test]
fn a_batch_refuses_mixed_camera_tokens_and_an_empty_list() {
    let dev = Device::cpu().unwrap();
    let model = WanTransformer::seeded(config(), 7, &dev, DType::F32).unwrap();
    let a = input(&model, &dev, 1, [4, 4], 0, 1000.0, None);
    let b = input(&model, &dev, 2, [4, 4], 0, 1000.0, None);
    let mut without = item(&b);
    without.camera = None;
    let err = model
        .forward_batch(&[item(&a), without], Mask::None)
        .unwrap_err();
    assert!(err.to_string().contains("camera"), "{err}");
    assert!(model.forward_batch(&[], Mask::None).is_err());
}
