//! Normalisations: layer norm and RMS norm over the last axis, and Wan's RMS norm over
//! the channel axis. Statistics accumulate in f64 so that long rows stay exact to f32.

use rayon::prelude::*;

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::kernels::simd;
use crate::ops::dispatch;
use crate::tensor::Tensor;

fn check_param(op: &'static str, p: Option<&Tensor>, len: usize) -> Result<Option<Tensor>> {
    match p {
        None => Ok(None),
        Some(p) if p.numel() == len => Ok(Some(p.to_f32_contiguous()?)),
        Some(p) => Err(TensorError::shape(
            op,
            format!(
                "parameter of shape {:?} does not match the normalised size {len}",
                p.shape()
            ),
        )),
    }
}

/// Length of `x`'s last axis, refused when it is missing or empty.
pub(crate) fn last_axis(op: &'static str, x: &Tensor) -> Result<usize> {
    x.shape().last().copied().filter(|&d| d > 0).ok_or_else(|| {
        TensorError::shape(
            op,
            format!("shape {:?} has no non-empty last axis", x.shape()),
        )
    })
}

/// Independent f64 accumulators of the row statistics: a fixed count, so the order of
/// summation (and the bytes) does not depend on the machine, wide enough to vectorise.
const STAT_LANES: usize = 8;

/// Sum of `f(v)` over `x` in f64, in [`STAT_LANES`] interleaved partial sums.
#[inline(always)]
fn lane_sum(x: &[f32], f: impl Fn(f64) -> f64) -> f64 {
    let mut lanes = [0f64; STAT_LANES];
    let mut chunks = x.chunks_exact(STAT_LANES);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f(f64::from(v));
        }
    }
    for (l, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *l += f(f64::from(v));
    }
    lanes.iter().sum()
}

/// Mean and `1/√(var + eps)` (biased variance) of a row, accumulated in f64.
#[inline]
pub(crate) fn mean_inv_std(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f64;
    let mean = lane_sum(x, |v| v) / n;
    let var = lane_sum(x, |v| (v - mean) * (v - mean)) / n;
    ((mean as f32), (1.0 / (var + f64::from(eps)).sqrt()) as f32)
}

impl Tensor {
    /// Layer norm over the last axis: `(x − mean) / √(var + eps) · weight + bias`
    /// (biased variance, like PyTorch).
    pub fn layer_norm(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f32,
    ) -> Result<Tensor> {
        self.layer_norm_as(weight, bias, eps, self.dtype())
    }

    /// [`Tensor::layer_norm`] with the result in `dtype`, computed in f32 and rounded
    /// once per value (bf16 on the host: each row rounded to nearest even as it is made,
    /// the bits a bf16 product reading it would round to itself).
    pub fn layer_norm_as(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f32,
        dtype: DType,
    ) -> Result<Tensor> {
        crate::profile::op("layer_norm", &[self], || {
            let n = last_axis("layer_norm", self)?;
            let wt = check_param("layer_norm", weight, n)?;
            let bt = check_param("layer_norm", bias, n)?;
            let input = self.to_f32_contiguous()?;
            let host_bf16 = dtype == DType::BF16 && self.device().launcher().is_none();
            // Made in bf16 on the host; a GPU norm makes f32, converted at the end.
            let made = if host_bf16 { DType::BF16 } else { DType::F32 };
            let mut out = Tensor::empty(self.shape(), made, self.device())?;
            let w = wt.as_ref().and_then(|t| t.as_slice::<f32>());
            let b = bt.as_ref().and_then(|t| t.as_slice::<f32>());
            let row = move |o: &mut [f32], x: &[f32]| {
                let (mean, inv) = mean_inv_std(x, eps);
                match (w, b) {
                    (Some(w), Some(b)) => {
                        simd::zip3_map(o, x, w, b, |v, w, b| (v - mean) * inv * w + b)
                    }
                    (Some(w), None) => simd::zip_map(o, x, w, |v, w| (v - mean) * inv * w),
                    (None, Some(b)) => simd::zip_map(o, x, b, |v, b| (v - mean) * inv + b),
                    (None, None) => simd::map(o, x, |v| (v - mean) * inv),
                }
            };
            if let Some(l) = self.device().launcher() {
                let params = [wt.as_ref(), bt.as_ref()];
                dispatch::row_norm(l.as_ref(), "layer_norm_f32", &input, &params, &out, n, eps)?;
            } else if let Some(src) = input.as_slice::<f32>() {
                super::write_rows(&mut out, n, |r, o| row(o, &src[r * n..(r + 1) * n]));
            }
            out.to_dtype(dtype)
        })
    }

    /// RMS norm over the last axis: `x / √(mean(x²) + eps) · weight`.
    pub fn rms_norm(&self, weight: Option<&Tensor>, eps: f32) -> Result<Tensor> {
        crate::profile::op("rms_norm", &[self], || {
            let n = last_axis("rms_norm", self)?;
            let w = check_param("rms_norm", weight, n)?;
            let input = self.to_f32_contiguous()?;
            let mut out = Tensor::empty(self.shape(), DType::F32, self.device())?;
            if let Some(l) = self.device().launcher() {
                let params = [w.as_ref()];
                dispatch::row_norm(l.as_ref(), "rms_norm_f32", &input, &params, &out, n, eps)?;
            } else if let (Some(src), Some(dst)) = (input.as_slice::<f32>(), out.data_mut::<f32>())
            {
                let w = w.as_ref().and_then(|t| t.as_slice::<f32>());
                crate::parallel::run(|| {
                    dst.par_chunks_mut(n)
                        .zip(src.par_chunks(n))
                        .for_each(|(o, x)| {
                            let ms = lane_sum(x, |v| v * v) / n as f64;
                            let inv = (1.0 / (ms + f64::from(eps)).sqrt()) as f32;
                            match w {
                                Some(w) => simd::zip_map(o, x, w, |v, w| v * inv * w),
                                None => simd::map(o, x, |v| v * inv),
                            }
                        });
                });
            }
            out.to_dtype(self.dtype())
        })
    }

    /// Wan's VAE RMS norm over axis 1 of `[B, C, …]`: `x / max(‖x‖₂, 1e-12) · √C · gamma`,
    /// at every position separately (WAN.md §2.4).
    pub fn rms_norm_channels(&self, gamma: &Tensor) -> Result<Tensor> {
        self.rms_norm_channels_then(gamma, false)
    }

    /// `silu(rms_norm_channels(self, gamma))` in one pass over the output: the bits of
    /// the two ops one after the other (the Wan VAE's norm → SiLU before each conv).
    pub fn rms_norm_channels_silu(&self, gamma: &Tensor) -> Result<Tensor> {
        self.rms_norm_channels_then(gamma, true)
    }

    /// [`Tensor::rms_norm_channels`], then SiLU on each value when `silu`.
    fn rms_norm_channels_then(&self, gamma: &Tensor, silu: bool) -> Result<Tensor> {
        if silu && self.dtype() != DType::F32 {
            // The chain rounds the norm to this dtype before the SiLU: keep its bits.
            return self.rms_norm_channels(gamma)?.silu();
        }
        let kind = if silu {
            "rms_norm_channels_silu"
        } else {
            "rms_norm_channels"
        };
        crate::profile::op(kind, &[self], || {
            let op = "rms_norm_channels";
            if self.rank() < 2 {
                return Err(TensorError::shape(
                    op,
                    format!("shape {:?} has no channel axis 1", self.shape()),
                ));
            }
            let channels = self.shape()[1];
            let inner: usize = self.shape()[2..].iter().product();
            let gamma = check_param(op, Some(gamma), channels)?
                .ok_or_else(|| TensorError::shape(op, "missing gamma"))?;
            let input = self.to_f32_contiguous()?;
            let batch = self.shape()[0];
            let mut out = Tensor::empty(self.shape(), DType::F32, self.device())?;
            if let Some(l) = self.device().launcher() {
                let dims = [batch, channels, inner];
                dispatch::rms_norm_channels(l.as_ref(), &input, &gamma, &out, dims)?;
                let out = if silu { out.silu()? } else { out };
                return out.to_dtype(self.dtype());
            }
            // Per-position inverse norms, from the allocator like every other buffer.
            let mut norms = Tensor::empty(&[batch, inner], DType::F32, self.device())?;
            if let (Some(src), Some(g)) = (input.as_slice::<f32>(), gamma.as_slice::<f32>()) {
                let scale = (channels as f64).sqrt() as f32;
                let plane = channels * inner;
                if let Some(n) = norms.data_mut::<f32>() {
                    // Pass 1, parallel over position tiles: ‖x‖₂ over channels, in f64.
                    const TILE: usize = 256;
                    crate::parallel::run(|| {
                        let tiles = n.par_chunks_mut(inner.max(1)).enumerate().flat_map(
                            |(b, per_batch)| {
                                per_batch
                                    .par_chunks_mut(TILE)
                                    .enumerate()
                                    .map(move |(t, out)| (b, t * TILE, out))
                            },
                        );
                        tiles.for_each(|(b, start, out)| {
                            let mut acc = [0f64; TILE];
                            for c in 0..channels {
                                let row = &src[b * plane + c * inner + start..][..out.len()];
                                simd::add_squares_f64(&mut acc[..row.len()], row);
                            }
                            for (o, a) in out.iter_mut().zip(acc) {
                                *o = (a.sqrt() as f32).max(1e-12);
                            }
                        });
                    });
                }
                if let (Some(dst), Some(n)) = (out.data_mut::<f32>(), norms.as_slice::<f32>()) {
                    // Pass 2, parallel over (batch, channel) rows: x / ‖x‖ · √C · γ_c.
                    crate::parallel::run(|| {
                        dst.par_chunks_mut(inner).enumerate().for_each(|(row, o)| {
                            let (b, c) = (row / channels, row % channels);
                            let x = &src[row * inner..][..inner];
                            let n = &n[b * inner..][..inner];
                            let gc = g[c];
                            if silu {
                                simd::zip_map(o, x, n, |v, norm| {
                                    crate::kernels::activation::silu(v / norm * scale * gc)
                                });
                            } else {
                                simd::zip_map(o, x, n, |v, norm| v / norm * scale * gc);
                            }
                        });
                    });
                }
            }
            drop(norms);
            out.to_dtype(self.dtype())
        })
    }
}
