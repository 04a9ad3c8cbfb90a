//! Layout ops the VAE needs: concat/stack (any dtype, byte copies), padding, nearest ×2
//! upsampling and pixel (un)shuffle (computed in f32, dtype kept).

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::kernels::resample::{self as k, PadMode, ShuffleParams};
use crate::ops::dispatch;
use crate::tensor::Tensor;

fn float_op(op: &'static str, x: &Tensor) -> Result<Tensor> {
    x.require_float(op)?;
    x.to_f32_contiguous()
}

impl Tensor {
    /// Concatenates tensors of one dtype along `axis` (all other axes equal).
    pub fn cat(tensors: &[&Tensor], axis: usize) -> Result<Tensor> {
        crate::profile::op("cat", tensors, || {
            let op = "cat";
            let first = tensors
                .first()
                .ok_or_else(|| TensorError::shape(op, "needs at least one tensor"))?;
            let rank = first.rank();
            if axis >= rank {
                return Err(TensorError::shape(
                    op,
                    format!("axis {axis} out of range for shape {:?}", first.shape()),
                ));
            }
            let mut shape = first.shape().to_vec();
            shape[axis] = 0;
            for t in tensors {
                first.same_device(op, t)?;
                let same_rest = t.rank() == rank
                    && (0..rank).all(|a| a == axis || t.shape()[a] == first.shape()[a]);
                if !same_rest || t.dtype() != first.dtype() {
                    return Err(TensorError::shape(
                        op,
                        format!(
                            "{:?} {} does not concatenate with {:?} {} along axis {axis}",
                            t.shape(),
                            t.dtype(),
                            first.shape(),
                            first.dtype()
                        ),
                    ));
                }
                shape[axis] += t.shape()[axis];
            }
            let dense = tensors
                .iter()
                .map(|t| t.contiguous())
                .collect::<Result<Vec<_>>>()?;
            let mut out = Tensor::empty(&shape, first.dtype(), first.device())?;
            if let Some(l) = first.device().launcher() {
                dispatch::cat(l.as_ref(), &dense, &out, axis)?;
                return Ok(out);
            }
            let size = first.dtype().size();
            let outer: usize = shape[..axis].iter().product();
            let inner: usize = shape[axis + 1..].iter().product::<usize>() * size;
            let out_row = shape[axis] * inner;
            if let Some(dst) = out.bytes_mut() {
                let mut at = 0;
                for t in &dense {
                    let bytes = t.storage_data().unwrap_or(&[]);
                    let start = t.layout().offset() * size;
                    let row = t.shape()[axis] * inner;
                    for o in 0..outer {
                        dst[o * out_row + at..o * out_row + at + row]
                            .copy_from_slice(&bytes[start + o * row..start + (o + 1) * row]);
                    }
                    at += row;
                }
            }
            Ok(out)
        })
    }

    /// Stacks tensors of one shape and dtype along a new axis `axis`.
    pub fn stack(tensors: &[&Tensor], axis: usize) -> Result<Tensor> {
        let expanded = tensors
            .iter()
            .map(|t| t.unsqueeze(axis))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = expanded.iter().collect();
        Tensor::cat(&refs, axis)
    }

    /// Pads every axis by `pads[axis] = (before, after)` with zeros or edge values.
    pub fn pad(&self, pads: &[(usize, usize)], mode: PadMode) -> Result<Tensor> {
        crate::profile::op("pad", &[self], || {
            if pads.len() != self.rank() {
                return Err(TensorError::shape(
                    "pad",
                    format!(
                        "{} (before, after) pairs for shape {:?}; give one per axis",
                        pads.len(),
                        self.shape()
                    ),
                ));
            }
            if mode == PadMode::Replicate
                && self
                    .shape()
                    .iter()
                    .zip(pads)
                    .any(|(&d, &(b, a))| d == 0 && b + a > 0)
            {
                return Err(TensorError::shape(
                    "pad",
                    format!("cannot replicate an empty axis of {:?}", self.shape()),
                ));
            }
            let input = float_op("pad", self)?;
            let shape: Vec<usize> = self
                .shape()
                .iter()
                .zip(pads)
                .map(|(&d, &(b, a))| d + b + a)
                .collect();
            let mut out = Tensor::empty(&shape, DType::F32, self.device())?;
            if let Some(l) = self.device().launcher() {
                dispatch::pad(l.as_ref(), &input, &out, pads, mode == PadMode::Replicate)?;
            } else if let (Some(src), Some(dst)) = (input.as_slice::<f32>(), out.data_mut::<f32>())
            {
                crate::parallel::run(|| k::pad(src, self.shape(), pads, mode, dst));
            }
            out.to_dtype(self.dtype())
        })
    }

    /// Nearest-neighbour ×2 upsampling of the last two axes.
    pub fn upsample_nearest2x(&self) -> Result<Tensor> {
        crate::profile::op("upsample_nearest2x", &[self], || {
            if self.rank() < 2 {
                return Err(TensorError::shape(
                    "upsample_nearest2x",
                    format!("shape {:?} has no [h, w] axes", self.shape()),
                ));
            }
            let r = self.rank();
            let (h, w) = (self.shape()[r - 2], self.shape()[r - 1]);
            let planes: usize = self.shape()[..r - 2].iter().product();
            let input = float_op("upsample_nearest2x", self)?;
            let mut shape = self.shape().to_vec();
            shape[r - 2] *= 2;
            shape[r - 1] *= 2;
            let mut out = Tensor::empty(&shape, DType::F32, self.device())?;
            if let Some(l) = self.device().launcher() {
                dispatch::upsample_nearest2x(l.as_ref(), &input, &out, [planes, h, w])?;
            } else if let (Some(src), Some(dst)) = (input.as_slice::<f32>(), out.data_mut::<f32>())
            {
                crate::parallel::run(|| k::upsample_nearest2x(src, dst, planes, h, w));
            }
            out.to_dtype(self.dtype())
        })
    }

    /// `F.pixel_shuffle`: `[B, C·r², H, W]` → `[B, C, H·r, W·r]`.
    pub fn pixel_shuffle(&self, factor: usize) -> Result<Tensor> {
        crate::profile::op("pixel_shuffle", &[self], || {
            let op = "pixel_shuffle";
            let [b, c, h, w] = *self.shape() else {
                return Err(TensorError::shape(
                    op,
                    format!("expects [B, C, H, W], got {:?}", self.shape()),
                ));
            };
            let rr = factor * factor;
            if factor == 0 || c % rr != 0 {
                return Err(TensorError::shape(
                    op,
                    format!(
                        "channels {c} are not divisible by {factor}² (shape {:?})",
                        self.shape()
                    ),
                ));
            }
            let p = ShuffleParams {
                batch: b,
                channels: c / rr,
                h,
                w,
                factor,
            };
            let input = float_op(op, self)?;
            let mut out = Tensor::empty(
                &[b, c / rr, h * factor, w * factor],
                DType::F32,
                self.device(),
            )?;
            if let Some(l) = self.device().launcher() {
                let dims = [b * (c / rr), h, w, factor];
                dispatch::pixel_shuffle(l.as_ref(), &input, &out, dims, false)?;
            } else if let (Some(src), Some(dst)) = (input.as_slice::<f32>(), out.data_mut::<f32>())
            {
                crate::parallel::run(|| k::pixel_shuffle(&p, src, dst));
            }
            out.to_dtype(self.dtype())
        })
    }

    /// `F.pixel_unshuffle`: `[B, C, H·r, W·r]` → `[B, C·r², H, W]`.
    pub fn pixel_unshuffle(&self, factor: usize) -> Result<Tensor> {
        let op = "pixel_unshuffle";
        let [b, c, hr, wr] = *self.shape() else {
            return Err(TensorError::shape(
                op,
                format!("expects [B, C, H, W], got {:?}", self.shape()),
            ));
        };
        if factor == 0 || hr % factor != 0 || wr % factor != 0 {
            return Err(TensorError::shape(
                op,
                format!(
                    "height and width of {:?} are not divisible by {factor}",
                    self.shape()
                ),
            ));
        }
        let p = ShuffleParams {
            batch: b,
            channels: c,
            h: hr / factor,
            w: wr / factor,
            factor,
        };
        let input = float_op(op, self)?;
        let mut out = Tensor::empty(
            &[b, c * factor * factor, hr / factor, wr / factor],
            DType::F32,
            self.device(),
        )?;
        if let Some(l) = self.device().launcher() {
            let dims = [b * c, hr / factor, wr / factor, factor];
            dispatch::pixel_shuffle(l.as_ref(), &input, &out, dims, true)?;
        } else if let (Some(src), Some(dst)) = (input.as_slice::<f32>(), out.data_mut::<f32>()) {
            crate::parallel::run(|| k::pixel_unshuffle(&p, src, dst));
        }
        out.to_dtype(self.dtype())
    }
}
