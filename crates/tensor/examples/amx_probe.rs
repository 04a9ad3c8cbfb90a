//! Times the AMX bf16 GEMM at one shape, and its packing steps apart (a development
//! probe; `headroom bench kernels` is the measurement of record):
//!
//! `amx_probe M K N THREADS` with f32 activations; `A_BF16=1` for bf16 activations;
//! `PREPACKED=1` for a weight packed once (`gemm_prepacked_b`, as a model's linears run).
use half::bf16;
use headroom_tensor::kernels::cpu::{amx, pack};
use headroom_tensor::kernels::gemm::MatRef;
use std::time::Instant;

/// A 64-byte aligned window of `len` values of `v` (tile loads need the alignment).
fn aligned(v: &mut Vec<u16>, len: usize) -> &mut [u16] {
    v.resize(len + 32, 0);
    let off = (64 - v.as_ptr() as usize % 64) % 64 / 2;
    &mut v[off..off + len]
}

/// Best wall time of `reps` runs of `f`, in seconds.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|s| s.parse().ok())
        .collect();
    let [m, k, n, threads] = args[..] else {
        eprintln!("usage: amx_probe M K N THREADS");
        std::process::exit(2);
    };
    let prec = amx::Precision::Bf16;
    let a16: Vec<bf16> = (0..m * k)
        .map(|i| bf16::from_f32((i % 13) as f32 * 0.1))
        .collect();
    let a32: Vec<f32> = a16.iter().map(|x| x.to_f32()).collect();
    let a = if std::env::var_os("A_BF16").is_some_and(|v| !v.is_empty()) {
        pack::Operand::Bf16(MatRef::row_major(&a16, 0, k))
    } else {
        pack::Operand::F32(MatRef::row_major(&a32, 0, k))
    };
    // B = Wᵀ of a row-major [n, k] weight (k-contiguous), as a linear layer's.
    let w: Vec<bf16> = (0..k * n)
        .map(|i| bf16::from_f32((i % 7) as f32 * 0.1))
        .collect();
    let b = pack::Operand::Bf16(MatRef::row_major(&w, 0, k).t());
    let mut c = vec![0f32; m * n];
    let flops = 2.0 * (m * n * k) as f64;
    let (mut s_buf, mut b_buf) = (Vec::new(), Vec::new());
    let secs = if std::env::var_os("PREPACKED").is_some_and(|v| !v.is_empty()) {
        let packed = aligned(&mut b_buf, amx::packed_b_len(n, k, prec));
        pack::pack_b(&b, k, n, 0..n.div_ceil(pack::PANEL), prec.parts().1, packed);
        let packed = &*packed;
        let scratch = aligned(&mut s_buf, amx::prepacked_b_scratch_len(k, prec, threads));
        best(20, || {
            let dst = amx::Dst {
                data: &mut c,
                offset: 0,
                ldc: n,
            };
            headroom_tensor::parallel::run(|| {
                amx::gemm_prepacked_b(
                    m, n, k, &a, packed, dst, false, 1.0, prec, threads, scratch, None,
                )
            })
        })
    } else {
        let scratch = aligned(&mut s_buf, amx::scratch_len(n, k, prec, threads));
        best(20, || {
            let dst = amx::Dst {
                data: &mut c,
                offset: 0,
                ldc: n,
            };
            headroom_tensor::parallel::run(|| {
                amx::gemm(
                    amx::Kernel::current(),
                    m,
                    n,
                    k,
                    &a,
                    &b,
                    dst,
                    false,
                    1.0,
                    prec,
                    threads,
                    scratch,
                )
            })
        })
    };
    println!(
        "gemm {m}x{k}x{n}, {threads} threads: {:.2} ms, {:.0} GFLOP/s",
        secs * 1e3,
        flops / secs / 1e9
    );
    let mut pa = Vec::new();
    let pa = aligned(&mut pa, pack::packed_len(m, k, 1));
    let t = best(5, || pack::pack_a(&a, 0, m, k, prec.parts().0, pa));
    let mut pb = Vec::new();
    let pb = aligned(&mut pb, pack::packed_len(n, k, 1));
    let u = best(5, || {
        pack::pack_b(&b, k, n, 0..n.div_ceil(pack::PANEL), prec.parts().1, pb)
    });
    println!(
        "packing on one thread: A {:.2} ms, B {:.2} ms",
        t * 1e3,
        u * 1e3
    );
}
