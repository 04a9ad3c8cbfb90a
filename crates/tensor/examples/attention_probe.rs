//! Times the attention kernel at one shape (a development probe):
//! `attention_probe Q_LEN KV_LEN HEADS HEAD_DIM [bf16|f32]`.
use headroom_tensor::kernels::attention::{
    attention, attention_scratch_len, AttentionParams, Mask,
};
use headroom_tensor::kernels::gemm::Compute;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> usize { args.get(i).and_then(|s| s.parse().ok()).unwrap_or(0) };
    let (q_len, kv_len, heads, d) = (num(0), num(1), num(2), num(3));
    let compute = match args.get(4).map(String::as_str) {
        Some("f32") => Compute::F32,
        Some("near-f32") => Compute::NearF32,
        _ => Compute::Bf16,
    };
    let p = AttentionParams {
        heads,
        q_len,
        kv_len,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        mask: Mask::None,
        q_head_stride: d,
        q_token_stride: heads * d,
        k_head_stride: d,
        k_token_stride: heads * d,
        v_head_stride: d,
        v_token_stride: heads * d,
        out_head_stride: d,
        out_token_stride: heads * d,
        compute,
    };
    let fill = |n: usize, s: u32| -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(s) >> 8) % 1000) as f32 / 500.0
                    - 1.0
            })
            .collect()
    };
    let q = fill(q_len * heads * d, 1);
    let k = fill(kv_len * heads * d, 2);
    let v = fill(kv_len * heads * d, 3);
    let mut out = vec![0f32; q_len * heads * d];
    let mut scratch = vec![0f32; attention_scratch_len(&p) + 16];
    let off = (64 - scratch.as_ptr() as usize % 64) % 64 / 4;
    let scratch = &mut scratch[off..];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        attention(&p, &q, &k, &v, &mut out, scratch);
        best = best.min(t.elapsed().as_secs_f64());
    }
    let flops = 4.0 * (heads * q_len * kv_len * d) as f64;
    println!("attention {q_len}q x {kv_len}k x {heads}h x {d}d {compute:?}: {:.2} ms, {:.0} GFLOP/s (checksum {})", best * 1e3, flops / best / 1e9, out.iter().map(|&x| x as f64).sum::<f64>());
}
