//! Attention and RoPE ops against f64 references.

mod common;

use common::{assert_close, cpu, rand, Rng};
use headroom_tensor::kernels::rope::RopeTable;
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::{DType, Tensor};

/// Full-matrix f64 attention over [B, L, H, D] data.
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    [b, lq, lk, h, d]: [usize; 5],
    visible: impl Fn(usize, usize) -> bool,
) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; b * lq * h * d];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..lq {
                let qv = &q[((bi * lq + i) * h + hi) * d..][..d];
                let scores: Vec<Option<f64>> = (0..lk)
                    .map(|j| {
                        visible(i, j).then(|| {
                            let kv = &k[((bi * lk + j) * h + hi) * d..][..d];
                            scale * qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>()
                        })
                    })
                    .collect();
                let m = scores
                    .iter()
                    .flatten()
                    .cloned()
                    .fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores
                    .iter()
                    .map(|s| s.map_or(0.0, |s| (s - m).exp()))
                    .collect();
                let total: f64 = weights.iter().sum();
                for (j, w) in weights.iter().enumerate() {
                    if *w == 0.0 {
                        continue;
                    }
                    for e in 0..d {
                        out[((bi * lq + i) * h + hi) * d + e] +=
                            w / total * v[((bi * lk + j) * h + hi) * d + e];
                    }
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_the_reference_on_strided_views_with_and_without_mask() {
    let dev = cpu();
    let mut rng = Rng::new(41);
    let (b, l, h, d) = (2, 37, 3, 16);
    // A fused qkv projection [B, L, 3·H·D] viewed as three strided [B, L, H, D] tensors.
    let (qkv, vqkv) = rand(&mut rng, &[b, l, 3, h, d], 2.0, &dev);
    let part = |i: usize| qkv.narrow(2, i, 1).unwrap().squeeze(2).unwrap();
    let (q, k, v) = (part(0), part(1), part(2));
    let split = |i: usize| -> Vec<f64> {
        (0..b * l)
            .flat_map(|t| vqkv[(t * 3 + i) * h * d..][..h * d].to_vec())
            .collect()
    };
    let (vq, vk, vv) = (split(0), split(1), split(2));
    let got = Tensor::scaled_dot_product_attention(&q, &k, &v, Mask::None, None).unwrap();
    assert_eq!(got.shape(), [b, l, h, d]);
    assert_close(
        &got,
        &reference(&vq, &vk, &vv, [b, l, l, h, d], |_, _| true),
        2e-5,
    );
    let mask = Mask::BlockCausal {
        block_len: 5,
        q_start: 0,
    };
    let got = Tensor::scaled_dot_product_attention(&q, &k, &v, mask, None).unwrap();
    assert_close(
        &got,
        &reference(&vq, &vk, &vv, [b, l, l, h, d], |i, j| j / 5 <= i / 5),
        2e-5,
    );
}

#[test]
fn attention_scratch_does_not_grow_with_the_key_length() {
    let dev = cpu();
    let scratch_for = |lk: usize| {
        let q = Tensor::zeros(&[1, 64, 2, 32], DType::F32, &dev).unwrap();
        let k = Tensor::zeros(&[1, lk, 2, 32], DType::F32, &dev).unwrap();
        let platform = dev.platform();
        let base = platform.memory_stats().requested_bytes.all().current;
        platform.reset_peak_stats();
        let out = Tensor::scaled_dot_product_attention(&q, &k, &k, Mask::None, None).unwrap();
        let peak = platform.memory_stats().requested_bytes.all().peak - base;
        peak as usize - out.numel() * 4
    };
    let small = scratch_for(1_000);
    let large = scratch_for(32_760);
    assert_eq!(small, large);
    assert!(small < 8 << 20, "scratch {small} B");
}

#[test]
fn attention_shape_errors_name_the_shapes() {
    let dev = cpu();
    let q = Tensor::zeros(&[1, 4, 2, 8], DType::F32, &dev).unwrap();
    let k = Tensor::zeros(&[1, 4, 3, 8], DType::F32, &dev).unwrap();
    let err = Tensor::scaled_dot_product_attention(&q, &k, &k, Mask::None, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("attention:") && err.contains("[1, 4, 3, 8]"),
        "{err}"
    );
}

#[test]
fn rope_rotates_interleaved_pairs_by_grid_position() {
    let dev = cpu();
    let mut rng = Rng::new(42);
    let (l, h, d) = (6, 2, 12);
    let (x, vx) = rand(&mut rng, &[1, l, h, d], 1.0, &dev);
    let table = RopeTable::new(d, 16, 10_000.0);
    let positions: Vec<[usize; 3]> = (0..l).map(|i| [i / 3, i % 3, (i * 5) % 7]).collect();
    let got = x.rope(&table, &positions).unwrap();
    let mut expected = vx.clone();
    for (t, pos) in positions.iter().enumerate() {
        for hi in 0..h {
            for j in 0..d / 2 {
                let (axis, jj) = (j / 2, j % 2); // 4/4/4 split: two pairs per axis
                let angle = pos[axis] as f64 / 10_000f64.powf((2 * jj) as f64 / 4.0);
                let (c, s) = (angle.cos() as f32 as f64, angle.sin() as f32 as f64);
                let at = (t * h + hi) * d + 2 * j;
                let (a, b) = (vx[at], vx[at + 1]);
                expected[at] = a * c - b * s;
                expected[at + 1] = a * s + b * c;
            }
        }
    }
    assert_close(&got, &expected, 1e-6);
    let err = x.rope(&table, &positions[..3]).unwrap_err().to_string();
    assert!(err.contains("3 positions for 6 tokens"), "{err}");
    let far = vec![[16, 0, 0]; l];
    assert!(x
        .rope(&table, &far)
        .unwrap_err()
        .to_string()
        .contains("beyond"));
}
