//! Normalisations: layer norm and RMS norm over the last axis, and Wan's RMS norm over
//! the channel axis. Statistics accumulate in f64 so that long rows stay exact to f32.

use rayon::prelude::*;

use crate::dtype::DType;
use crate::error::{Result, TensorError};
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

fn last_axis(op: &'static str, x: &Tensor) -> Result<usize> {
    x.shape().last().copied().filter(|&d| d > 0).ok_or_else(|| {
        TensorError::shape(
            op,
            format!("shape {:?} has no non-empty last axis", x.shape()),
        )
    })
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
        let n = last_axis("layer_norm", self)?;
        let w = check_param("layer_norm", weight, n)?;
        let b = check_param("layer_norm", bias, n)?;
        let input = self.to_f32_contiguous()?;
        let mut out = Tensor::empty(self.shape(), DType::F32, self.device())?;
        if let (Some(src), Some(dst)) = (input.as_slice::<f32>(), out.data_mut::<f32>()) {
            let w = w.as_ref().and_then(|t| t.as_slice::<f32>());
            let b = b.as_ref().and_then(|t| t.as_slice::<f32>());
            crate::parallel::run(|| {
                dst.par_chunks_mut(n)
                    .zip(src.par_chunks(n))
                    .for_each(|(o, x)| {
                        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
                        let var = x
                            .iter()
                            .map(|&v| (f64::from(v) - mean).powi(2))
                            .sum::<f64>()
                            / n as f64;
                        let inv = (1.0 / (var + f64::from(eps)).sqrt()) as f32;
                        let mean = mean as f32;
                        for (j, (o, &v)) in o.iter_mut().zip(x).enumerate() {
                            let mut y = (v - mean) * inv;
                            if let Some(w) = w {
                                y *= w[j];
                            }
                            if let Some(b) = b {
                                y += b[j];
                            }
                            *o = y;
                        }
                    });
            });
        }
        out.to_dtype(self.dtype())
    }

    /// RMS norm over the last axis: `x / √(mean(x²) + eps) · weight`.
    pub fn rms_norm(&self, weight: Option<&Tensor>, eps: f32) -> Result<Tensor> {
        let n = last_axis("rms_norm", self)?;
        let w = check_param("rms_norm", weight, n)?;
        let input = self.to_f32_contiguous()?;
        let mut out = Tensor::empty(self.shape(), DType::F32, self.device())?;
        if let (Some(src), Some(dst)) = (input.as_slice::<f32>(), out.data_mut::<f32>()) {
            let w = w.as_ref().and_then(|t| t.as_slice::<f32>());
            crate::parallel::run(|| {
                dst.par_chunks_mut(n)
                    .zip(src.par_chunks(n))
                    .for_each(|(o, x)| {
                        let ms =
                            x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / n as f64;
                        let inv = (1.0 / (ms + f64::from(eps)).sqrt()) as f32;
                        for (j, (o, &v)) in o.iter_mut().zip(x).enumerate() {
                            *o = match w {
                                Some(w) => v * inv * w[j],
                                None => v * inv,
                            };
                        }
                    });
            });
        }
        out.to_dtype(self.dtype())
    }

    /// Wan's VAE RMS norm over axis 1 of `[B, C, …]`: `x / max(‖x‖₂, 1e-12) · √C · gamma`,
    /// at every position separately (WAN.md §2.4).
    pub fn rms_norm_channels(&self, gamma: &Tensor) -> Result<Tensor> {
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
        let mut out = Tensor::empty(self.shape(), DType::F32, self.device())?;
        if let (Some(src), Some(dst), Some(g)) = (
            input.as_slice::<f32>(),
            out.data_mut::<f32>(),
            gamma.as_slice::<f32>(),
        ) {
            let scale = (channels as f64).sqrt() as f32;
            let plane = channels * inner;
            crate::parallel::run(|| {
                dst.par_chunks_mut(plane)
                    .zip(src.par_chunks(plane))
                    .for_each(|(o, x)| {
                        // Positions in tiles with a stack buffer for their norms: no heap
                        // scratch outside the allocator.
                        const TILE: usize = 256;
                        let mut start = 0;
                        while start < inner {
                            let len = TILE.min(inner - start);
                            let mut norms = [0f64; TILE];
                            for c in 0..channels {
                                let row = &x[c * inner + start..c * inner + start + len];
                                for (n, &v) in norms.iter_mut().zip(row) {
                                    *n += f64::from(v) * f64::from(v);
                                }
                            }
                            for (c, &gc) in g.iter().enumerate() {
                                let at = c * inner + start;
                                for (j, norm) in norms[..len].iter().enumerate() {
                                    let n = (norm.sqrt() as f32).max(1e-12);
                                    o[at + j] = x[at + j] / n * scale * gc;
                                }
                            }
                            start += len;
                        }
                    });
            });
        }
        out.to_dtype(self.dtype())
    }
}
