//! Every CPU path's GEMM against the scalar reference, on odd shapes (K, M and N tails),
//! strided and transposed operands, bf16 and f32 operands, one thread and the pool; and
//! the fp8 linear on every path.

use half::bf16;
use headroom_tensor::kernels::cpu::pack::Operand;
use headroom_tensor::kernels::cpu::CpuPath;
use headroom_tensor::kernels::gemm::{gemm_on, gemm_scratch_len_on, Compute, MatRef, Threads};
use headroom_tensor::{DType, Device, Tensor};

/// Held by the tests that run tensor ops (which read the process-wide CPU path) while
/// one of them switches it.
static PATH_SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn run(
    path: CpuPath,
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Operand<'_>,
    compute: Compute,
    threads: Threads,
    accumulate: bool,
    alpha: f32,
) -> Vec<f32> {
    let ldc = n + 3;
    let mut dst: Vec<f32> = (0..m * ldc).map(|i| (i % 7) as f32 * 0.25).collect();
    let len = gemm_scratch_len_on(path, m, n, k, compute, threads);
    let mut scratch = vec![0f32; len];
    headroom_tensor::parallel::run(|| {
        gemm_on(
            path,
            m,
            n,
            k,
            a,
            b,
            &mut dst,
            0,
            ldc,
            accumulate,
            alpha,
            compute,
            threads,
            &mut scratch,
        )
    });
    dst
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-30);
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

#[test]
fn every_supported_path_matches_the_scalar_gemm() {
    for &(m, n, k) in &[
        (1, 1, 1),
        (37, 50, 70),
        (64, 96, 128),
        (130, 33, 300),
        (5, 200, 31),
        // More packed B than one 32 MiB column block, in every precision (and, for
        // near-f32, more K than one packed A block).
        (1, 16_400, 1_100),
        // More K than one packed bf16 A block (2,048), with a K tail.
        (40, 70, 2_100),
    ] {
        let av = values(m * k, 1);
        let bv = values(k * n, 2);
        let bt: Vec<f32> = (0..n * k).map(|i| bv[(i % k) * n + i / k]).collect();
        let a = Operand::F32(MatRef::row_major(&av, 0, k));
        let b_n = Operand::F32(MatRef::row_major(&bv, 0, n));
        let b_k = Operand::F32(MatRef::row_major(&bt, 0, k).t());
        let bb: Vec<bf16> = bv.iter().map(|&x| bf16::from_f32(x)).collect();
        let b_bf = Operand::Bf16(MatRef::row_major(&bb, 0, n));
        for compute in [Compute::F32, Compute::NearF32, Compute::Bf16] {
            for (accumulate, alpha) in [(false, 1.0), (true, 1.0), (false, 0.5)] {
                let want = run(
                    CpuPath::Scalar,
                    m,
                    n,
                    k,
                    a,
                    b_n,
                    compute,
                    Threads::One,
                    accumulate,
                    alpha,
                );
                // The scalar path computes near-f32 exactly: the AMX path's split is
                // checked against exact products at its own tolerance.
                for path in CpuPath::ALL {
                    if let Some(why) = path.unsupported_reason() {
                        eprintln!("skipped {path}: {why}");
                        continue;
                    }
                    // Rounding differences of the summation order grow with K.
                    let grow = (k as f32 / 300.0).max(1.0);
                    let tol = grow
                        * match compute {
                            Compute::NearF32 if path.packs_bf16() => 1e-5,
                            Compute::F32 | Compute::NearF32 => 1e-6,
                            Compute::Bf16 => 1e-5,
                        };
                    for threads in [Threads::One, Threads::Pool] {
                        for b in [b_n, b_k] {
                            let got = run(path, m, n, k, a, b, compute, threads, accumulate, alpha);
                            let err = max_rel(&got, &want);
                            assert!(err <= tol, "{path} {compute:?} {m}x{n}x{k} acc {accumulate} alpha {alpha}: {err}");
                        }
                        if compute == Compute::Bf16
                            || path == CpuPath::Scalar
                            || (path.packs_bf16() && compute == Compute::NearF32)
                        {
                            let got =
                                run(path, m, n, k, a, b_bf, compute, threads, accumulate, alpha);
                            let want_bf = run(
                                CpuPath::Scalar,
                                m,
                                n,
                                k,
                                a,
                                b_bf,
                                compute,
                                Threads::One,
                                accumulate,
                                alpha,
                            );
                            let err = max_rel(&got, &want_bf);
                            assert!(
                                err <= tol,
                                "{path} bf16 operand {compute:?} {m}x{n}x{k}: {err}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_path_gives_the_same_bytes_on_every_call_and_thread_split() {
    // 200 rows split between threads by rows, 70 rows × 256 columns by columns (3 row
    // panels on 2 threads leave one thread idle a third of the time).
    for (m, n, k) in [(200, 96, 160), (70, 256, 160)] {
        let av = values(m * k, 5);
        let bv = values(k * n, 6);
        let a = Operand::F32(MatRef::row_major(&av, 0, k));
        let b = Operand::F32(MatRef::row_major(&bv, 0, n));
        for path in CpuPath::ALL.into_iter().filter(|p| p.supported()) {
            for compute in [Compute::F32, Compute::NearF32, Compute::Bf16] {
                let one = run(path, m, n, k, a, b, compute, Threads::One, false, 1.0);
                let pool = run(path, m, n, k, a, b, compute, Threads::Pool, false, 1.0);
                let again = run(path, m, n, k, a, b, compute, Threads::Pool, false, 1.0);
                assert_eq!(pool, again, "{path} {compute:?} {m}x{n} repeats");
                if path.packs_bf16() {
                    // Rows or columns are split between threads, never the sum over k.
                    assert_eq!(one, pool, "{path} {compute:?} {m}x{n} thread split");
                }
            }
        }
    }
}

#[test]
fn near_f32_packed_gemm_is_within_f32_rounding_of_the_exact_product() {
    for path in [CpuPath::Amx, CpuPath::Avx512Bf16] {
        if let Some(why) = path.unsupported_reason() {
            eprintln!("skipped {path}: {why}");
            continue;
        }
        near_f32_on(path);
    }
}

fn near_f32_on(path: CpuPath) {
    let (m, n, k) = (64, 64, 1536);
    let av = values(m * k, 7);
    let bv = values(k * n, 8);
    let a = Operand::F32(MatRef::row_major(&av, 0, k));
    let b = Operand::F32(MatRef::row_major(&bv, 0, n));
    let exact: Vec<f32> = {
        let mut d: Vec<f32> = (0..m * (n + 3)).map(|i| (i % 7) as f32 * 0.25).collect();
        for r in 0..m {
            for c in 0..n {
                d[r * (n + 3) + c] = (0..k)
                    .map(|i| av[r * k + i] as f64 * bv[i * n + c] as f64)
                    .sum::<f64>() as f32;
            }
        }
        d
    };
    let x3 = run(
        path,
        m,
        n,
        k,
        a,
        b,
        Compute::NearF32,
        Threads::Pool,
        false,
        1.0,
    );
    let b16 = run(
        path,
        m,
        n,
        k,
        a,
        b,
        Compute::Bf16,
        Threads::Pool,
        false,
        1.0,
    );
    let (e3, e16) = (max_rel(&x3, &exact), max_rel(&b16, &exact));
    eprintln!("{path} vs f64: near-f32 {e3:.2e}, bf16 {e16:.2e}");
    assert!(e3 < 2e-5 && e3 * 50.0 < e16, "near-f32 {e3}, bf16 {e16}");
}

#[test]
fn a_packed_linear_weight_gives_the_bits_of_the_plain_one() {
    use headroom_tensor::kernels::activation::Activation;
    let _path = PATH_SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let device = Device::cpu().expect("cpu device");
    // Odd shapes: an N tail (out 70), a K tail (in 100), more K than one A block (2,100).
    for &(rows, inp, out) in &[(37, 100, 70), (300, 64, 96), (5, 2_100, 33)] {
        let w = Tensor::from_f32(&values(out * inp, 7), &[out, inp], DType::BF16, &device)
            .expect("weight");
        let Some(packed) = w.pack_linear().expect("pack") else {
            eprintln!("skipped: the selected CPU path does not run bf16 products on packed panels");
            return;
        };
        let bias = Tensor::from_f32(&values(out, 8), &[out], DType::F32, &device).expect("bias");
        for dtype in [DType::F32, DType::BF16] {
            let x = Tensor::from_f32(&values(rows * inp, 9), &[rows, inp], dtype, &device)
                .expect("input");
            let fused = x
                .linear_packed_then(&packed, Some(&bias), Some(Activation::GeluTanh))
                .expect("fused");
            let apart = x
                .linear(&w, Some(&bias))
                .and_then(|y| y.gelu_tanh())
                .expect("apart");
            assert_eq!(
                fused.to_vec::<f32>().expect("values"),
                apart.to_vec::<f32>().expect("values"),
                "{rows}x{inp}x{out} {dtype:?}: fused bias + GELU"
            );
            // Rounded to bf16 block by block (or after, past one K block): the bits of
            // rounding the f32 result, and what a next bf16 product reads from either.
            let rounded = x
                .linear_packed_as(
                    &packed,
                    Some(&bias),
                    Some(Activation::GeluTanh),
                    DType::BF16,
                )
                .expect("bf16 result");
            assert_eq!(rounded.dtype(), DType::BF16);
            let want = fused.to_dtype(DType::BF16).expect("round");
            let words = |t: &Tensor| {
                t.to_vec::<half::bf16>()
                    .expect("bf16")
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                words(&rounded),
                words(&want),
                "{rows}x{inp}x{out} {dtype:?}: bf16 result"
            );
            let plain = x.linear_packed(&packed, None).expect("plain");
            let plain16 = x
                .linear_packed_as(&packed, None, None, DType::BF16)
                .expect("bf16 plain");
            assert_eq!(
                words(&plain16),
                words(&plain.to_dtype(DType::BF16).expect("round"))
            );
            for b in [None, Some(&bias)] {
                let plain = x
                    .linear(&w, b)
                    .expect("plain")
                    .to_vec::<f32>()
                    .expect("values");
                let fast = x
                    .linear_packed(&packed, b)
                    .expect("packed")
                    .to_vec::<f32>()
                    .expect("values");
                assert_eq!(
                    plain,
                    fast,
                    "{rows}x{inp}x{out} {dtype:?} bias {}",
                    b.is_some()
                );
            }
        }
    }
}

/// An fp8 linear on every path is the bf16 linear of the weight's values `codes · scale`,
/// the way diffusers would hold the dequantized weight (exact here: a power-of-two
/// scale). It switches the process-wide path, under [`PATH_SWITCH`].
#[test]
fn an_fp8_linear_is_the_bf16_linear_of_its_values_on_every_path() {
    let _switching = PATH_SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let dev = Device::cpu().unwrap();
    let x = Tensor::randn(&[5, 70], 1, 0, DType::F32, &dev).unwrap();
    let w = Tensor::randn(&[40, 70], 2, 0, DType::F32, &dev).unwrap();
    let b = Tensor::randn(&[40], 3, 0, DType::F32, &dev).unwrap();
    for fmt in [DType::F8E4M3, DType::F8E5M2] {
        let codes = w.to_dtype(fmt).unwrap();
        let scale = Tensor::from_slice(&[0.25f32], &[1], &dev).unwrap();
        let values = codes
            .to_dtype(DType::F32)
            .unwrap()
            .mul_scalar(0.25)
            .unwrap();
        for path in CpuPath::ALL.into_iter().filter(|p| p.supported()) {
            headroom_tensor::kernels::cpu::set_path(Some(path)).unwrap();
            let got = x.linear_fp8(&codes, &scale, Some(&b)).unwrap();
            let want = x
                .to_dtype(DType::BF16)
                .unwrap()
                .linear(&values.to_dtype(DType::BF16).unwrap(), Some(&b))
                .unwrap();
            let err = headroom_tensor::compare::max_abs_error(&got, &want).unwrap();
            assert!(err < 1e-4, "{fmt} on {path}: {err}");
        }
        headroom_tensor::kernels::cpu::set_path(None).unwrap();
    }
}
