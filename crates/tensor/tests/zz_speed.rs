use half::bf16;
use headroom_tensor::kernels::cpu::pack::Operand;
use headroom_tensor::kernels::cpu::CpuPath;
use headroom_tensor::kernels::gemm::{gemm_on, gemm_scratch_len_on, Compute, MatRef, Threads};
#[test]
#[ignore]
fn speed() {
    for &(m, n, k) in &[(4680usize, 1536usize, 1536usize), (1170, 1536, 1536), (1170, 8960, 1536), (1170, 1536, 8960)] {
        let av: Vec<f32> = (0..m * k).map(|i| ((i % 17) as f32 - 8.0) * 0.01).collect();
        let bv: Vec<f32> = (0..k * n).map(|i| ((i % 13) as f32 - 6.0) * 0.01).collect();
        let bb: Vec<bf16> = bv.iter().map(|&x| bf16::from_f32(x)).collect();
        let a = Operand::F32(MatRef::row_major(&av, 0, k));
        for (name, path, compute, b) in [
            ("amx bf16 (B bf16 [n][k])", CpuPath::Amx, Compute::Bf16, Operand::Bf16(MatRef::row_major(&bb, 0, k).t())),
            ("amx bf16 (B f32 [k][n])", CpuPath::Amx, Compute::Bf16, Operand::F32(MatRef::row_major(&bv, 0, n))),
            ("amx x3", CpuPath::Amx, Compute::F32, Operand::F32(MatRef::row_major(&bv, 0, k).t())),
            ("avx512 f32", CpuPath::Avx512, Compute::F32, Operand::F32(MatRef::row_major(&bv, 0, k).t())),
        ] {
            let mut dst = vec![0f32; m * n];
            let mut scratch = vec![0f32; gemm_scratch_len_on(path, m, n, k, compute, Threads::Pool)];
            let mut best = f64::INFINITY;
            for _ in 0..4 {
                let t = std::time::Instant::now();
                headroom_tensor::parallel::run(|| gemm_on(path, m, n, k, a, b, &mut dst, 0, n, false, 1.0, compute, Threads::Pool, &mut scratch));
                best = best.min(t.elapsed().as_secs_f64());
            }
            eprintln!("{m}x{n}x{k} {name}: {:.0} GFLOP/s", 2.0 * (m * n * k) as f64 / best / 1e9);
        }
    }
}
