//! Times the tanh-GELU over `n` f32 values in place on one thread: `gelu_probe N REPS`.
use std::time::Instant;

use headroom_tensor::kernels::gelu::bias_gelu_rows;

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().unwrap_or(0));
    let n = args.next().unwrap_or(1 << 20);
    let reps = args.next().unwrap_or(20).max(1);
    let mut buf: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.006 - 3.0).collect();
    let start = Instant::now();
    for _ in 0..reps {
        // One row of n values, no bias: the GEMM epilogue's GELU, in place.
        bias_gelu_rows(&mut buf, n, 1, n, None, true);
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{:.3} ns per value ({} values x {reps}), checksum {}",
        secs * 1e9 / (n * reps) as f64,
        n,
        buf.iter().map(|&v| f64::from(v)).sum::<f64>()
    );
}
