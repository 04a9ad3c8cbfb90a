//! The tensor ops on a GPU device: each function here turns one op, whose shapes the
//! host-side op has already checked and whose inputs it has already converted (contiguous
//! f32 unless said otherwise), into launches of the embedded kernels or a cuBLASLt GEMM on
//! the device's [`Launcher`](crate::cuda::launch::Launcher). Outputs are fresh tensors
//! from the device's allocator.
//!
//! Always built: without a GPU the same code runs against the
//! [`CheckedLauncher`](crate::cuda::check::CheckedLauncher), which validates every launch.
//!
//! One file per op family (`copy`, `elementwise`, `reduce`, `resample`, `attention`,
//! `conv`, `matmul`, `quant`), all re-exported here; this module keeps the helpers they share.

mod attention;
mod conv;
mod copy;
mod elementwise;
mod matmul;
mod quant;
mod reduce;
mod resample;

pub use attention::{attention, rope};
pub use conv::{conv, ConvDims};
pub use copy::{cat, copy_into};
pub use elementwise::{binary, map2, randn, to_pixels, unary};
pub use matmul::{gemm_input, linear, matmul};
pub use quant::{
    dense_bf16_or_f32, eight_bit_gemm, linear_8bit, linear_8bit_then, quantize_rows,
    quantize_weight,
};
pub use reduce::{reduce, rms_norm_channels, row_norm, softmax};
pub use resample::{pad, pixel_shuffle, upsample_nearest2x};

use crate::cuda::error::CudaError;
use crate::cuda::launch::{Arg, DeviceView, MAX_RANK};
use crate::error::Result;

/// The error for an op this backend does not run, naming the op and why.
fn unsupported(op: &'static str, reason: impl Into<String>) -> crate::TensorError {
    CudaError::Unsupported {
        op,
        reason: reason.into(),
    }
    .into()
}

/// `shape` with every pair of neighbouring axes merged that is contiguous in all `strides`
/// (so a view of any rank whose irregular axes are few fits a [`DeviceView`]).
fn collapse(shape: &[usize], strides: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut out_shape: Vec<usize> = Vec::new();
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for (axis, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let merges = !out_shape.is_empty()
            && strides.iter().zip(&out_strides).all(|(s, o)| {
                o.last().copied() == Some(s[axis] * n) || (s[axis] == 0 && o.last() == Some(&0))
            });
        if merges {
            *out_shape.last_mut().expect("non-empty") *= n;
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                *o.last_mut().expect("non-empty") = s[axis];
            }
        } else {
            out_shape.push(n);
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                o.push(s[axis]);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        for o in &mut out_strides {
            o.push(1);
        }
    }
    (out_shape, out_strides)
}

/// Views of `shape` with each of `strides`, collapsed to at most [`MAX_RANK`] axes.
fn views(op: &'static str, shape: &[usize], strides: &[&[usize]]) -> Result<Vec<DeviceView>> {
    let (shape, strides) = collapse(shape, strides);
    if shape.len() > MAX_RANK {
        return Err(unsupported(
            op,
            format!(
                "a strided view of {} irregular axes (at most {MAX_RANK})",
                shape.len()
            ),
        ));
    }
    Ok(strides
        .iter()
        .map(|s| DeviceView::new(&shape, s).expect("rank checked"))
        .collect())
}

/// A size as an `i64` kernel argument.
fn n64(n: usize) -> Arg {
    Arg::i64(n as i64)
}

/// A null pointer argument (an absent optional parameter).
fn null() -> Arg {
    Arg::u64(0)
}
