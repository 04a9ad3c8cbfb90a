//! Reductions along one axis (sum, mean, max) and softmax over the last axis.

use rayon::prelude::*;

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::dispatch;
use crate::tensor::Tensor;

/// Splits `shape` around `axis` into (outer, axis length, inner).
pub(crate) fn split_at_axis(
    op: &'static str,
    shape: &[usize],
    axis: usize,
) -> Result<(usize, usize, usize)> {
    if axis >= shape.len() {
        return Err(TensorError::shape(
            op,
            format!("axis {axis} out of range for shape {shape:?}"),
        ));
    }
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    Ok((outer, shape[axis], inner))
}

#[derive(Clone, Copy)]
enum Reduce {
    Sum,
    Mean,
    Max,
}

fn reduce(
    op: &'static str,
    x: &Tensor,
    axis: usize,
    keepdim: bool,
    kind: Reduce,
) -> Result<Tensor> {
    let (_, len, inner) = split_at_axis(op, x.shape(), axis)?;
    if len == 0 && matches!(kind, Reduce::Max | Reduce::Mean) {
        return Err(TensorError::shape(
            op,
            format!("axis {axis} of shape {:?} is empty", x.shape()),
        ));
    }
    let mut shape = x.shape().to_vec();
    if keepdim {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    let input = x.to_f32_contiguous()?;
    let mut out = Tensor::empty(&shape, DType::F32, x.device())?;
    if let Some(l) = x.device().launcher() {
        let outer = x.numel().checked_div(len * inner).unwrap_or(0);
        let scale = match kind {
            Reduce::Mean => 1.0 / len as f64,
            _ => 1.0,
        };
        if out.numel() > 0 {
            let dims = [outer, len, inner];
            dispatch::reduce(
                l.as_ref(),
                &input,
                &out,
                dims,
                matches!(kind, Reduce::Max),
                scale,
            )?;
        }
    } else if let (Some(src), Some(dst)) = (input.as_slice::<f32>(), out.data_mut::<f32>()) {
        crate::parallel::run(|| {
            dst.par_chunks_mut(inner.max(1))
                .enumerate()
                .for_each(|(o, row)| {
                    for (i, slot) in row.iter_mut().enumerate() {
                        let at = |k: usize| src[(o * len + k) * inner + i];
                        *slot = match kind {
                            // f64 accumulation keeps long sums exact to f32 rounding.
                            Reduce::Sum => (0..len).map(|k| f64::from(at(k))).sum::<f64>() as f32,
                            Reduce::Mean => {
                                ((0..len).map(|k| f64::from(at(k))).sum::<f64>() / len as f64)
                                    as f32
                            }
                            Reduce::Max => (0..len).map(at).fold(f32::NEG_INFINITY, f32::max),
                        };
                    }
                });
        });
    }
    if x.dtype().is_float() {
        out.to_dtype(x.dtype())
    } else {
        Ok(out)
    }
}

impl Tensor {
    /// Sum along `axis`.
    pub fn sum(&self, axis: usize, keepdim: bool) -> Result<Tensor> {
        reduce("sum", self, axis, keepdim, Reduce::Sum)
    }
    /// Mean along `axis`.
    pub fn mean(&self, axis: usize, keepdim: bool) -> Result<Tensor> {
        reduce("mean", self, axis, keepdim, Reduce::Mean)
    }
    /// Maximum along `axis`.
    pub fn max(&self, axis: usize, keepdim: bool) -> Result<Tensor> {
        reduce("max", self, axis, keepdim, Reduce::Max)
    }
    /// Softmax over the last axis (numerically stable).
    pub fn softmax(&self) -> Result<Tensor> {
        crate::profile::op("softmax", &[self], || {
            let cols = *self
                .shape()
                .last()
                .ok_or_else(|| TensorError::shape("softmax", "a scalar has no axis"))?;
            let input = self.to_f32_contiguous()?;
            let mut out = Tensor::empty(self.shape(), DType::F32, self.device())?;
            if let Some(l) = self.device().launcher() {
                dispatch::softmax(l.as_ref(), &input, &out, cols)?;
            } else if let (Some(src), Some(dst)) = (input.as_slice::<f32>(), out.data_mut::<f32>())
            {
                if let Some(rows) = src.len().checked_div(cols) {
                    crate::kernels::softmax::softmax_rows_into(src, dst, rows, cols);
                }
            }
            out.to_dtype(self.dtype())
        })
    }
}
