//! Matrix products: batched `matmul` with broadcast batch axes and `linear` (PyTorch's
//! `x @ W.T + b`), all through the `gemm` crate with f32 accumulation. Strided f32
//! operands go to GEMM as they are; other dtypes are widened to f32 first.

use rayon::prelude::*;

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::kernels::gemm::{sgemm, MatRef, Threads};
use crate::layout::{broadcast_shapes, Layout};
use crate::tensor::Tensor;

/// Storage offset of batch element `index` in a layout whose last two axes are the matrix.
fn batch_offset(layout: &Layout, mut index: usize) -> usize {
    let shape = layout.shape();
    let strides = layout.strides();
    let mut offset = layout.offset();
    for axis in (0..shape.len() - 2).rev() {
        offset += (index % shape[axis]) * strides[axis];
        index /= shape[axis];
    }
    offset
}

fn mat<'a>(data: &'a [f32], layout: &Layout, offset: usize) -> MatRef<'a> {
    let r = layout.strides().len();
    MatRef {
        data,
        offset,
        row_stride: layout.strides()[r - 2] as isize,
        col_stride: layout.strides()[r - 1] as isize,
    }
}

impl Tensor {
    /// Matrix product over the last two axes, batch axes broadcast: `[…, m, k] @ […, k, n]`.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        let op = "matmul";
        self.same_device(op, other)?;
        if self.rank() < 2 || other.rank() < 2 {
            return Err(TensorError::shape(
                op,
                format!(
                    "operands need at least 2 axes, got {:?} and {:?}",
                    self.shape(),
                    other.shape()
                ),
            ));
        }
        let (ra, rb) = (self.rank(), other.rank());
        let (m, k) = (self.shape()[ra - 2], self.shape()[ra - 1]);
        let (k2, n) = (other.shape()[rb - 2], other.shape()[rb - 1]);
        if k != k2 {
            return Err(TensorError::shape(
                op,
                format!(
                    "inner sizes differ: {:?} @ {:?} ({k} vs {k2})",
                    self.shape(),
                    other.shape()
                ),
            ));
        }
        let batch = broadcast_shapes(op, &self.shape()[..ra - 2], &other.shape()[..rb - 2])?;
        let a = super::float_f32(op, self)?;
        let b = super::float_f32(op, other)?;
        let mut out_shape = batch.clone();
        out_shape.extend([m, n]);
        let mut out = Tensor::empty(&out_shape, DType::F32, self.device())?;
        let batches: usize = batch.iter().product();
        let mut full_a = batch.clone();
        full_a.extend([m, k]);
        let mut full_b = batch;
        full_b.extend([k, n]);
        let la = a.layout().broadcast_to(&full_a)?;
        let lb = b.layout().broadcast_to(&full_b)?;
        if let (Some(da), Some(db), Some(dst)) = (
            a.storage_as::<f32>(),
            b.storage_as::<f32>(),
            out.data_mut::<f32>(),
        ) {
            let per = m * n;
            crate::parallel::run(|| {
                if batches >= crate::parallel::num_threads() * 2 && per > 0 {
                    // Many small products: one per task, each single-threaded.
                    dst.par_chunks_mut(per).enumerate().for_each(|(i, d)| {
                        let ma = mat(da, &la, batch_offset(&la, i));
                        let mb = mat(db, &lb, batch_offset(&lb, i));
                        sgemm(m, n, k, ma, mb, d, 0, n, false, 1.0, Threads::One);
                    });
                } else {
                    for i in 0..batches {
                        let ma = mat(da, &la, batch_offset(&la, i));
                        let mb = mat(db, &lb, batch_offset(&lb, i));
                        sgemm(m, n, k, ma, mb, dst, i * per, n, false, 1.0, Threads::Pool);
                    }
                }
            });
        }
        Ok(out)
    }

    /// `x @ weightᵀ + bias` over the last axis: weight is `[out, in]` (PyTorch layout),
    /// bias `[out]`; the result is f32 `[…, out]`.
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let op = "linear";
        self.same_device(op, weight)?;
        if weight.rank() != 2 {
            return Err(TensorError::shape(
                op,
                format!("weight must be [out, in], got {:?}", weight.shape()),
            ));
        }
        let (out_features, in_features) = (weight.shape()[0], weight.shape()[1]);
        let last = self.shape().last().copied().unwrap_or(0);
        if self.rank() == 0 || last != in_features {
            return Err(TensorError::shape(
                op,
                format!(
                    "input {:?} does not end in {in_features} features (weight {:?})",
                    self.shape(),
                    weight.shape()
                ),
            ));
        }
        if let Some(b) = bias {
            if b.shape() != [out_features] {
                return Err(TensorError::shape(
                    op,
                    format!("bias {:?} is not [{out_features}]", b.shape()),
                ));
            }
        }
        let rows = self.numel() / in_features.max(1);
        let x = super::float_f32(op, self)?.to_f32_contiguous()?;
        let w = super::float_f32(op, weight)?;
        let b = bias.map(|b| b.to_f32_contiguous()).transpose()?;
        let mut out_shape = self.shape().to_vec();
        *out_shape.last_mut().expect("rank checked above") = out_features;
        let mut out = Tensor::empty(&out_shape, DType::F32, self.device())?;
        if let (Some(dx), Some(dw), Some(dst)) = (
            x.as_slice::<f32>(),
            w.storage_as::<f32>(),
            out.data_mut::<f32>(),
        ) {
            let wl = w.layout();
            let wt = MatRef {
                data: dw,
                offset: wl.offset(),
                row_stride: wl.strides()[0] as isize,
                col_stride: wl.strides()[1] as isize,
            }
            .t();
            let bias = b.as_ref().and_then(|b| b.as_slice::<f32>());
            crate::parallel::run(|| {
                sgemm(
                    rows,
                    out_features,
                    in_features,
                    MatRef::row_major(dx, 0, in_features),
                    wt,
                    dst,
                    0,
                    out_features,
                    false,
                    1.0,
                    Threads::Pool,
                );
                if let Some(bias) = bias {
                    dst.par_chunks_mut(out_features).for_each(|row| {
                        row.iter_mut().zip(bias).for_each(|(o, &b)| *o += b);
                    });
                }
            });
        }
        Ok(out)
    }
}
