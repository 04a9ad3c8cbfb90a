//! Times bf16 (or f32) causal 3×3×3 convs at the Wan VAE decoder's shapes on the selected
//! CPU path, so a profiler sees the conv alone: `channels` in and out, `frames × h × w`.
//!
//!     cargo run --release -p headroom-tensor --example conv_probe -- [bf16|f32] [reps]
use headroom_tensor::ops::conv::Conv3dOptions;
use headroom_tensor::{DType, Device, Tensor};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dtype = match args.get(1).map(String::as_str) {
        Some("f32") => DType::F32,
        _ => DType::BF16,
    };
    let reps: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(5);
    let dev = Device::cpu().expect("cpu device");
    for (channels, frames, h, w) in [(96, 4, 240, 416), (192, 4, 120, 208), (384, 4, 60, 104)] {
        let x = Tensor::randn(&[1, channels, frames, h, w], 1, 0, DType::F32, &dev).unwrap();
        let weight = Tensor::randn(&[channels, channels, 3, 3, 3], 2, 0, DType::F32, &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let bias = Tensor::randn(&[channels], 3, 0, DType::F32, &dev).unwrap();
        // Two cached frames in front, as every chunk after a stream's first sees them.
        let opts = Conv3dOptions {
            pad_t_front: 0,
            ..Conv3dOptions::causal([1, 1, 1])
        };
        let mut best = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            drop(x.conv3d(&weight, Some(&bias), opts).unwrap());
            best = best.min(t.elapsed().as_secs_f64());
        }
        let flops = 2.0 * (channels * channels * 27 * (frames - 2) * h * w) as f64;
        println!(
            "conv3d {channels}->{channels} {frames}x{h}x{w} {dtype:?}: {best:.3} s, {:.1} GFLOP/s",
            flops / best / 1e9
        );
    }
}
