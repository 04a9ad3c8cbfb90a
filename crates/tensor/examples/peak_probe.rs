//! The bare-loop peaks of the AVX-512 FMA and `vdpbf16ps` paths, three times in a row:
//! how steady the ceiling `bench kernels` divides by is on this machine.
//! `cargo run --release -p headroom-tensor --example peak_probe [ITERATIONS]`.

fn main() {
    use headroom_tensor::kernels::cpu::{peak::peak_gflops, CpuPath};
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    for _ in 0..3 {
        let show = |p| peak_gflops(p, n).map_or("—".to_string(), |g| format!("{g:.1}"));
        println!(
            "{} threads: fma {} GFLOP/s, vdpbf16ps {} GFLOP/s",
            headroom_tensor::parallel::num_threads(),
            show(CpuPath::Avx512),
            show(CpuPath::Avx512Bf16)
        );
    }
}
