//! Times the elementwise kernels at each CPU path's build ([`headroom_tensor::kernels::simd`]),
//! side by side in one run: RMS norm, broadcast add and multiply, f32 ↔ bf16 casts, layer
//! norm then SiLU, 20 times each over a 4096 × 1536 f32 tensor, three rounds.
//!
//!     cargo run --release -p headroom-tensor --example elementwise_probe

use headroom_tensor::kernels::cpu::{self, CpuPath};
use headroom_tensor::{DType, Device, Tensor};
use std::time::Instant;
fn main() {
    let dev = Device::cpu().unwrap();
    let x = Tensor::randn(&[4096, 1536], 1, 0, DType::F32, &dev).unwrap();
    let y = Tensor::randn(&[4096, 1536], 2, 0, DType::F32, &dev).unwrap();
    let w = Tensor::randn(&[1536], 3, 0, DType::F32, &dev).unwrap();
    let xb = x.to_dtype(DType::BF16).unwrap();
    for round in 0..3 {
        let paths = [CpuPath::Scalar, CpuPath::Avx2, cpu::best()];
        for path in paths.into_iter().filter(|p| p.supported()) {
            cpu::set_path(Some(path)).unwrap();
            let t = Instant::now();
            for _ in 0..20 {
                drop(x.rms_norm(Some(&w), 1e-6).unwrap());
            }
            let norm = t.elapsed().as_secs_f64();
            let t = Instant::now();
            for _ in 0..20 {
                drop(x.add(&y).unwrap());
                drop(x.mul(&w).unwrap());
            }
            let bin = t.elapsed().as_secs_f64();
            let t = Instant::now();
            for _ in 0..20 {
                drop(x.to_dtype(DType::BF16).unwrap());
                drop(xb.to_dtype(DType::F32).unwrap());
            }
            let conv = t.elapsed().as_secs_f64();
            let t = Instant::now();
            for _ in 0..20 {
                drop(x.layer_norm(None, None, 1e-6).unwrap().silu().unwrap());
            }
            let ln = t.elapsed().as_secs_f64();
            println!("round {round} {path:>10}: rms_norm {norm:.3} s, add+mul {bin:.3} s, bf16 casts {conv:.3} s, layer_norm+silu {ln:.3} s");
        }
    }
}
