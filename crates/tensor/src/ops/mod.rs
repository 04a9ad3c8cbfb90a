//! Tensor operations: shape checks, output allocation from the device's allocator, and
//! calls into the kernels. On a meta device every op checks shapes and allocates the
//! same sizes in the same order, and computes nothing.

pub mod attention;
pub mod conv;
pub(crate) mod copy;
pub mod dispatch;
pub mod elementwise;
pub mod fp8;
pub mod fused;
pub mod int8;
pub mod matmul;
pub mod norm;
pub mod packed;
pub mod pixels;
pub mod random;
pub mod reduce;
pub mod resample;
pub mod selftest;

use rayon::prelude::*;

use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::cpu::pack::round_row;
use crate::tensor::Tensor;

/// Rows of `n` per parallel task of [`write_rows`].
const ROWS_PER_TASK: usize = 16;

/// Every `n`-long row of the host tensor `out` (f32 or bf16) made by `f(row, values)` in
/// f32, on the pool: written as is in f32, or rounded to nearest even as the packers round
/// (each row made in one reused f32 line) in bf16, the bits a bf16 product reading the
/// f32 values would round to. Nothing is written on a meta device.
pub(crate) fn write_rows(out: &mut Tensor, n: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let chunk = n.max(1) * ROWS_PER_TASK;
    if out.dtype() == DType::BF16 {
        if let Some(dst) = out.data_mut::<half::bf16>() {
            let dst = packed::bits_mut(dst);
            crate::parallel::run(|| {
                dst.par_chunks_mut(chunk).enumerate().for_each(|(task, o)| {
                    let mut line = vec![0f32; n];
                    for (r, o) in o.chunks_mut(n.max(1)).enumerate() {
                        f(task * ROWS_PER_TASK + r, &mut line);
                        round_row(&line, o);
                    }
                });
            });
        }
    } else if let Some(dst) = out.data_mut::<f32>() {
        crate::parallel::run(|| {
            dst.par_chunks_mut(chunk).enumerate().for_each(|(task, o)| {
                for (r, o) in o.chunks_mut(n.max(1)).enumerate() {
                    f(task * ROWS_PER_TASK + r, o);
                }
            });
        });
    }
}

/// The f32 form of a float tensor (itself when already f32; strides kept), or a dtype
/// error naming `op`: how ops read their float inputs.
pub(crate) fn float_f32(op: &'static str, t: &Tensor) -> Result<Tensor> {
    t.require_float(op)?;
    t.to_dtype(DType::F32)
}
