//! Times the AMX GEMM and its packing steps at one shape (a development probe).
use half::bf16;
use headroom_tensor::kernels::cpu::{amx, pack};
use headroom_tensor::kernels::gemm::MatRef;
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().unwrap())
        .collect();
    let (m, k, n, threads) = (args[0], args[1], args[2], args[3]);
    if let Some(copies) = std::env::var("PREPACKED").ok().and_then(|v| v.parse().ok()) {
        prepacked(m, k, n, threads, copies);
        return;
    }
    let a: Vec<bf16> = (0..m * k)
        .map(|i| bf16::from_f32((i % 13) as f32 * 0.1))
        .collect();
    let b: Vec<bf16> = (0..k * n)
        .map(|i| bf16::from_f32((i % 7) as f32 * 0.1))
        .collect();
    let mut c = vec![0f32; m * n];
    let mut scratch = vec![0u16; amx::scratch_len(n, k, amx::Precision::Bf16, threads) + 64];
    let off = (64 - scratch.as_ptr() as usize % 64) % 64 / 2;
    let scratch = &mut scratch[off..];
    let af: Vec<f32> = a.iter().map(|x| x.to_f32()).collect();
    let ao = if std::env::var_os("A_F32").is_some() {
        pack::Operand::F32(MatRef::row_major(&af, 0, k))
    } else {
        pack::Operand::Bf16(MatRef::row_major(&a, 0, k))
    };
    // B = Wᵀ of a row-major [n, k] weight (k-contiguous), as a linear layer's.
    let bo = pack::Operand::Bf16(MatRef {
        data: &b,
        offset: 0,
        row_stride: 1,
        col_stride: k as isize,
    });
    let flops = 2.0 * (m * n * k) as f64;
    let run = || {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            headroom_tensor::parallel::run(|| {
                amx::gemm(
                    m,
                    n,
                    k,
                    &ao,
                    &bo,
                    amx::Dst {
                        data: &mut c,
                        offset: 0,
                        ldc: n,
                    },
                    false,
                    1.0,
                    amx::Precision::Bf16,
                    threads,
                    scratch,
                )
            });
            best = best.min(t.elapsed().as_secs_f64());
        }
        best
    };
    let _ = run;
    let mut best = f64::MAX;
    for _ in 0..30 {
        let t = Instant::now();
        headroom_tensor::parallel::run(|| {
            amx::gemm(
                m,
                n,
                k,
                &ao,
                &bo,
                amx::Dst {
                    data: &mut c,
                    offset: 0,
                    ldc: n,
                },
                false,
                1.0,
                amx::Precision::Bf16,
                threads,
                &mut *scratch,
            )
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "gemm {m}x{k}x{n} {threads} threads: {:.2} ms, {:.0} GFLOP/s",
        best * 1e3,
        flops / best / 1e9
    );
    let mut pb = vec![0u16; pack::packed_len(n, k, 1)];
    pack::pack_b(&bo, k, n, 0..n.div_ceil(32), &[pack::Part::Hi], &mut pb);
    let t = Instant::now();
    pack::pack_b(&bo, k, n, 0..n.div_ceil(32), &[pack::Part::Hi], &mut pb);
    println!(
        "pack_b (1 thread): {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let mut pa_raw = vec![0u16; pack::packed_len(m, k, 1) + 32];
    let o = (64 - pa_raw.as_ptr() as usize % 64) % 64 / 2;
    let pa = &mut pa_raw[o..];
    pack::pack_a(&ao, 0, m, k, &[pack::Part::Hi], pa);
    let t = Instant::now();
    pack::pack_a(&ao, 0, m, k, &[pack::Part::Hi], pa);
    println!(
        "pack_a (1 thread): {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let t = Instant::now();
    amx::gemm_packed(
        m,
        n,
        k,
        &*pa,
        &pb,
        amx::Dst {
            data: &mut c,
            offset: 0,
            ldc: n,
        },
        false,
        1.0,
        amx::Precision::Bf16,
    );
    let s = t.elapsed().as_secs_f64();
    println!(
        "gemm_packed (1 thread, no packing; pa aligned {}): {:.2} ms, {:.0} GFLOP/s",
        pa.as_ptr() as usize % 64,
        s * 1e3,
        flops / s / 1e9
    );
    println!("{}", c[3]);
}

/// Prepacked B, cycling through `copies` weight buffers so each call meets a cold one
/// (as a model's layers do): `PREPACKED=copies amx_probe M K N THREADS`.
#[allow(dead_code)]
fn prepacked(m: usize, k: usize, n: usize, threads: usize, copies: usize) {
    let a: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.1).collect();
    let ao = pack::Operand::F32(MatRef::row_major(&a, 0, k));
    let len = amx::packed_b_len(n, k, amx::Precision::Bf16);
    let bufs: Vec<Vec<u16>> = (0..copies)
        .map(|c| {
            let mut v = vec![0u16; len + 32];
            for (i, x) in v.iter_mut().enumerate() {
                *x = 0x3f80 + ((i + c) % 5) as u16;
            }
            v
        })
        .collect();
    let al = |v: &Vec<u16>| (64 - v.as_ptr() as usize % 64) % 64 / 2;
    let mut c = vec![0f32; m * n];
    let mut scratch =
        vec![0u16; amx::prepacked_b_scratch_len(k, amx::Precision::Bf16, threads) + 64];
    let off = (64 - scratch.as_ptr() as usize % 64) % 64 / 2;
    let scratch = &mut scratch[off..];
    let flops = 2.0 * (m * n * k) as f64;
    let t = Instant::now();
    let rounds = 3;
    for _ in 0..rounds {
        for b in &bufs {
            let bp = &b[al(b)..];
            headroom_tensor::parallel::run(|| {
                amx::gemm_prepacked_b(
                    m,
                    n,
                    k,
                    &ao,
                    bp,
                    amx::Dst {
                        data: &mut c,
                        offset: 0,
                        ldc: n,
                    },
                    false,
                    1.0,
                    amx::Precision::Bf16,
                    threads,
                    &mut *scratch,
                )
            });
        }
    }
    let s = t.elapsed().as_secs_f64() / (rounds * copies) as f64;
    println!(
        "prepacked {m}x{k}x{n} {threads} threads, {copies} weight copies: {:.2} ms, {:.0} GFLOP/s",
        s * 1e3,
        flops / s / 1e9
    );
}
