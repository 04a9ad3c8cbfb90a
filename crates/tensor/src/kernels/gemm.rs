//! Matrix multiply on raw buffers: the one place kernels call GEMM, so thread use,
//! strides and the instruction-set path ([`crate::kernels::cpu`]) are handled once.
//! [`sgemm`] is exact f32 through the `gemm` crate; [`gemm()`] routes f32 or bf16 compute
//! to the selected path (AMX tiles, AVX-512, AVX2, scalar).

use gemm::Parallelism;

use crate::kernels::cpu::amx::{self, Dst, Precision};
use crate::kernels::cpu::pack::{Operand, Part};
use crate::kernels::cpu::{self, scalar, CpuPath};

pub use super::matrix::MatRef;

/// How many threads one GEMM may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// The calling thread only (inside an already parallel kernel).
    One,
    /// The kernel pool (call from inside [`crate::parallel::run`]).
    Pool,
}

/// `dst[m×n] (row-major, row stride dst_row_stride) = (accumulate ? dst : 0) + alpha · a[m×k] · b[k×n]`.
///
/// Panics if a matrix does not fit its buffer (an internal bug, never user input).
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_>,
    b: MatRef<'_>,
    dst: &mut [f32],
    dst_offset: usize,
    dst_row_stride: usize,
    accumulate: bool,
    alpha: f32,
    threads: Threads,
) {
    if m == 0 || n == 0 {
        return;
    }
    let a_end = a.max_index(m, k).expect("lhs indices are non-negative");
    let b_end = b.max_index(k, n).expect("rhs indices are non-negative");
    assert!(
        k == 0 || (a_end < a.data.len() && b_end < b.data.len()),
        "gemm operand out of bounds"
    );
    assert!(
        dst_offset + (m - 1) * dst_row_stride + n <= dst.len(),
        "gemm destination out of bounds"
    );
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                let row = dst_offset + r * dst_row_stride;
                dst[row..row + n].fill(0.0);
            }
        }
        return;
    }
    let parallelism = match threads {
        Threads::One => Parallelism::None,
        Threads::Pool => match crate::parallel::num_threads() {
            1 => Parallelism::None,
            n => Parallelism::Rayon(n),
        },
    };
    // SAFETY: the asserts above keep every index of a, b and dst inside its slice; dst is
    // borrowed mutably so it aliases neither operand.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr().add(dst_offset),
            1,
            dst_row_stride as isize,
            accumulate,
            a.data.as_ptr().add(a.offset),
            a.col_stride,
            a.row_stride,
            b.data.as_ptr().add(b.offset),
            b.col_stride,
            b.row_stride,
            1.0,
            alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// What a GEMM computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compute {
    /// Exact f32 products.
    F32,
    /// Near-f32: three bf16 part products on the AMX path (about 16 mantissa bits),
    /// exact f32 elsewhere.
    NearF32,
    /// bf16 operands (f32 ones rounded to nearest even), f32 accumulation.
    Bf16,
}

fn threads_of(threads: Threads) -> usize {
    match threads {
        Threads::One => 1,
        Threads::Pool => crate::parallel::num_threads(),
    }
}

/// The environment variable that picks the f32 GEMM on the AMX path: `exact` (default,
/// f32 products through the `gemm` crate) or `amx` (three bf16 part products on the
/// tiles: about 16 mantissa bits at ~2.5× the speed).
pub const F32_GEMM_ENV: &str = "HEADROOM_F32_GEMM";

/// Whether f32 compute on `path` runs on the AMX tiles (three part products).
pub fn f32_uses_amx(path: CpuPath, compute: Compute) -> bool {
    path.packs_bf16() && compute == Compute::NearF32
}

static NEAR_F32: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The compute ops give f32 operands: [`Compute::NearF32`] with `HEADROOM_F32_GEMM=amx`
/// (or after [`set_near_f32`]), else exact [`Compute::F32`]. Measured against diffusers and
/// transformers on the golden fixtures the near-f32 GEMM errs by up to 4.5e-5 (DiT),
/// 4.1e-5 (VAE) and 9.1e-5 (UMT5) where exact f32 errs by 1.5e-6..2.3e-6: too near the
/// 1e-4 bound to be the default.
pub fn f32_compute() -> Compute {
    use std::sync::atomic::Ordering;
    let mut v = NEAR_F32.load(Ordering::Relaxed);
    if v == 0 {
        let near = std::env::var(F32_GEMM_ENV).is_ok_and(|v| v.trim().eq_ignore_ascii_case("amx"));
        v = if near { 2 } else { 1 };
        NEAR_F32.store(v, Ordering::Relaxed);
    }
    if v == 2 {
        Compute::NearF32
    } else {
        Compute::F32
    }
}

/// Makes ops compute f32 products near-f32 (`true`) or exactly (`false`) from now on
/// (benchmarks comparing both in one run).
pub fn set_near_f32(near: bool) {
    NEAR_F32.store(
        if near { 2 } else { 1 },
        std::sync::atomic::Ordering::SeqCst,
    );
}

/// f32 scratch elements that [`gemm()`] needs for these shapes on the selected path.
pub fn gemm_scratch_len(m: usize, n: usize, k: usize, compute: Compute, threads: Threads) -> usize {
    gemm_scratch_len_on(cpu::selected(), m, n, k, compute, threads)
}

/// [`gemm_scratch_len`] for `path`.
pub fn gemm_scratch_len_on(
    path: CpuPath,
    m: usize,
    n: usize,
    k: usize,
    compute: Compute,
    threads: Threads,
) -> usize {
    match (compute, path) {
        (Compute::Bf16, CpuPath::Amx | CpuPath::Avx512Bf16) => {
            amx::scratch_len(n, k, Precision::Bf16, threads_of(threads)).div_ceil(2)
        }
        (Compute::NearF32, CpuPath::Amx | CpuPath::Avx512Bf16) => {
            amx::scratch_len(n, k, Precision::Bf16x3, threads_of(threads)).div_ceil(2)
        }
        // Rounded f32 copies of both operands.
        (Compute::Bf16, CpuPath::Avx512 | CpuPath::Avx2) => m * k + k * n,
        // f32 through the gemm crate: bf16 operands are widened by the caller.
        (Compute::F32 | Compute::NearF32, _) => 0,
        (Compute::Bf16, CpuPath::Scalar) => 0,
    }
}

/// The f32 values of a bf16-rounded copy of `op` laid out row-major `[rows, cols]`.
fn rounded(op: &Operand<'_>, rows: usize, cols: usize, out: &mut [f32]) {
    for r in 0..rows {
        for c in 0..cols {
            out[r * cols + c] = f32::from_bits(u32::from(op.get(r, c, Part::Hi)) << 16);
        }
    }
}

/// `dst[m×n] (row stride ldc) = (accumulate ? dst : 0) + alpha · a[m×k] · b[k×n]` in
/// `compute` on the selected CPU path, with `scratch` of [`gemm_scratch_len`] values.
///
/// f32 compute off the AMX path needs f32 operands (widen bf16 ones first). Panics on
/// out-of-bounds operands or short scratch (internal bugs, never user input).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Operand<'_>,
    dst: &mut [f32],
    dst_offset: usize,
    ldc: usize,
    accumulate: bool,
    alpha: f32,
    compute: Compute,
    threads: Threads,
    scratch: &mut [f32],
) {
    gemm_on(
        cpu::selected(),
        m,
        n,
        k,
        a,
        b,
        dst,
        dst_offset,
        ldc,
        accumulate,
        alpha,
        compute,
        threads,
        scratch,
    )
}

/// [`gemm()`] on `path` (which must be supported: see [`CpuPath::supported`]).
#[allow(clippy::too_many_arguments)]
pub fn gemm_on(
    path: CpuPath,
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Operand<'_>,
    dst: &mut [f32],
    dst_offset: usize,
    ldc: usize,
    accumulate: bool,
    alpha: f32,
    compute: Compute,
    threads: Threads,
    scratch: &mut [f32],
) {
    let packed = match (compute, amx::Kernel::of(path)) {
        (Compute::Bf16, Some(kernel)) => Some((kernel, Precision::Bf16)),
        (Compute::NearF32, Some(kernel)) => Some((kernel, Precision::Bf16x3)),
        _ => None,
    };
    if let Some((kernel, precision)) = packed {
        let dst = Dst {
            data: dst,
            offset: dst_offset,
            ldc,
        };
        let scratch = super::cpu::pack::as_u16(scratch);
        amx::gemm(
            kernel,
            m,
            n,
            k,
            &a,
            &b,
            dst,
            accumulate,
            alpha,
            precision,
            threads_of(threads),
            scratch,
        );
        return;
    }
    if path == CpuPath::Scalar {
        let precision = (compute == Compute::Bf16).then_some(Precision::Bf16);
        scalar::gemm(
            m, n, k, &a, &b, dst, dst_offset, ldc, accumulate, alpha, precision,
        );
        return;
    }
    match (compute, a, b) {
        (Compute::F32 | Compute::NearF32, Operand::F32(a), Operand::F32(b)) => sgemm(
            m, n, k, a, b, dst, dst_offset, ldc, accumulate, alpha, threads,
        ),
        (Compute::F32 | Compute::NearF32, _, _) => {
            panic!("f32 GEMM through the gemm crate needs f32 operands")
        }
        (Compute::Bf16, a, b) => {
            assert!(scratch.len() >= m * k + k * n, "gemm scratch too short");
            let (fa, fb) = scratch.split_at_mut(m * k);
            rounded(&a, m, k, fa);
            rounded(&b, k, n, &mut fb[..k * n]);
            sgemm(
                m,
                n,
                k,
                MatRef::row_major(fa, 0, k),
                MatRef::row_major(fb, 0, n),
                dst,
                dst_offset,
                ldc,
                accumulate,
                alpha,
                threads,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgemm_matches_a_naive_product_with_transposed_operands() {
        let (m, n, k) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 2.0).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| (i as f32).sin()).collect();
        let mut dst = vec![1.0f32; m * n];
        sgemm(
            m,
            n,
            k,
            MatRef::row_major(&a, 0, k),
            MatRef::row_major(&bt, 0, k).t(),
            &mut dst,
            0,
            n,
            true,
            2.0,
            Threads::One,
        );
        for r in 0..m {
            for c in 0..n {
                let expected: f32 =
                    1.0 + 2.0 * (0..k).map(|i| a[r * k + i] * bt[c * k + i]).sum::<f32>();
                assert!((dst[r * n + c] - expected).abs() < 1e-4);
            }
        }
    }
}
