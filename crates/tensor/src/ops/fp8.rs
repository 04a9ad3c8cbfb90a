//! Linear layers on 8-bit float weights (`float8_e4m3fn`, `float8_e5m2`) with their
//! scales, as fp8 checkpoints ship them: the weight stays one byte a value in memory and
//! is widened to bf16 (exactly) while the GEMM packs it, so no bf16 copy of it is ever
//! made; the product runs in bf16 compute, the scale applied to the f32 sums (one value
//! for the tensor through the GEMM's `alpha`, or one per output channel after it).
//!
//! On the CPU paths that multiply bf16 on packed panels (`amx`, `avx512bf16`) the
//! widening happens in the packing; the other paths widen as they do for bf16 weights.
//!
//! On a GPU with fp8 tensor cores (sm_89+) the input is quantized per row to e4m3 and
//! cuBLASLt multiplies the two sets of codes (W8A8); elsewhere the weight is widened to
//! bf16 one linear at a time ([`crate::ops::dispatch::linear_8bit`]).

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::float8::F8E4M3;
use crate::kernels::activation::{self, Activation};
use crate::kernels::gemm::{gemm, gemm_scratch_len, Compute, Threads};
use crate::layout::Layout;
use crate::tensor::Tensor;

/// Largest finite `float8_e4m3fn` value: a channel's largest magnitude maps to it.
pub const E4M3_MAX: f32 = 448.0;

impl Tensor {
    /// This float weight `[out, in]` quantized to `float8_e4m3fn` per output channel
    /// (symmetric: scale `max|w| / 448`, a zero row scale 1 on the host and 0 on a GPU,
    /// where the rows are quantized in place by the activations' kernel): the codes and
    /// the f32 scales `[out]`.
    pub fn quantize_fp8(&self) -> Result<(Tensor, Tensor)> {
        let op = "quantize_fp8";
        self.require_float(op)?;
        let (n, k) = super::matmul::weight_dims(op, self)?;
        if self.device().launcher().is_some() {
            return super::dispatch::quantize_weight(self, DType::F8E4M3);
        }
        let mut codes = Tensor::empty(&[n, k], DType::F8E4M3, self.device())?;
        let mut scales = Tensor::empty(&[n], DType::F32, self.device())?;
        // Read as f32 on a meta device too: a plan allocates what a run does.
        let w = self.to_f32_contiguous()?;
        if self.device().is_meta() {
            return Ok((codes, scales));
        }
        let (Some(w), Some(dst), Some(sc)) = (
            w.as_slice::<f32>(),
            codes.data_mut::<F8E4M3>(),
            scales.data_mut::<f32>(),
        ) else {
            return Err(TensorError::Meta { op });
        };
        for ((row, out), scale) in w
            .chunks_exact(k.max(1))
            .zip(dst.chunks_exact_mut(k.max(1)))
            .zip(sc.iter_mut())
        {
            let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            *scale = if amax > 0.0 && amax.is_finite() {
                amax / E4M3_MAX
            } else {
                1.0
            };
            for (o, &v) in out.iter_mut().zip(row) {
                *o = F8E4M3::from_f32(v / *scale);
            }
        }
        Ok((codes, scales))
    }

    /// `x @ (weight · scale)ᵀ + bias` over the last axis, `weight` an 8-bit float
    /// `[out, in]` and `scale` f32 with one value (the tensor's) or `out` (each output
    /// channel's): f32 out.
    pub fn linear_fp8(
        &self,
        weight: &Tensor,
        scale: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.linear_fp8_then(weight, scale, bias, None)
    }

    /// [`Tensor::linear_fp8`] followed by `activation` (on a GPU, tanh-GELU runs in the
    /// scales' epilogue).
    pub fn linear_fp8_then(
        &self,
        weight: &Tensor,
        scale: &Tensor,
        bias: Option<&Tensor>,
        activation: Option<Activation>,
    ) -> Result<Tensor> {
        crate::profile::op("linear_fp8", &[self, weight], || {
            let op = "linear_fp8";
            self.same_device(op, weight)?;
            if !matches!(weight.dtype(), DType::F8E4M3 | DType::F8E5M2) {
                return Err(TensorError::DType {
                    op,
                    expected: "an f8e4m3 or f8e5m2 weight",
                    got: weight.dtype(),
                });
            }
            let (n, k) = super::matmul::weight_dims(op, weight)?;
            super::matmul::check_scales(op, scale, n)?;
            let rows = super::matmul::check_linear(op, self, n, k, weight.shape(), bias)?;
            let mut out_shape = self.shape().to_vec();
            *out_shape.last_mut().expect("rank checked above") = n;
            if let Some(l) = self.device().launcher() {
                self.require_float(op)?;
                let (w, s) = (weight.contiguous()?, scale.to_f32_contiguous()?);
                return super::dispatch::linear_8bit_then(
                    l.as_ref(),
                    self,
                    &w,
                    &s,
                    bias,
                    &out_shape,
                    activation,
                );
            }
            let x = super::matmul::gemm_input(op, self, Compute::Bf16)?.contiguous()?;
            let w = weight.contiguous()?;
            let s = scale.to_f32_contiguous()?;
            let b = bias.map(|b| b.to_f32_contiguous()).transpose()?;
            let mut out = Tensor::empty(&out_shape, DType::F32, self.device())?;
            let len = gemm_scratch_len(rows, n, k, Compute::Bf16, Threads::Pool);
            let mut scratch = super::matmul::scratch(self, len, 1)?;
            if self.device().is_meta() {
                return Ok(out);
            }
            let x_layout = Layout::contiguous(&[rows, k]);
            let (Some(ox), Some(ow), Some(scales), Some(dst)) = (
                super::matmul::operand(&x, &x_layout, x.layout().offset()),
                super::matmul::operand(&w, w.layout(), w.layout().offset()),
                s.as_slice::<f32>(),
                out.data_mut::<f32>(),
            ) else {
                return Err(TensorError::Meta { op });
            };
            let ow = match ow {
                crate::kernels::cpu::pack::Operand::Fp8(m, table) => {
                    crate::kernels::cpu::pack::Operand::Fp8(m.t(), table)
                }
                _ => return Err(TensorError::Meta { op }),
            };
            let mut no_scratch: [f32; 0] = [];
            let scratch = match scratch.as_mut() {
                Some(t) => t.data_mut::<f32>().unwrap_or(&mut []),
                None => &mut no_scratch[..],
            };
            let per_tensor = (scales.len() == 1).then(|| scales[0]);
            let bias = b.as_ref().and_then(|b| b.as_slice::<f32>());
            crate::parallel::run(|| {
                gemm(
                    rows,
                    n,
                    k,
                    ox,
                    ow,
                    dst,
                    0,
                    n,
                    false,
                    per_tensor.unwrap_or(1.0),
                    Compute::Bf16,
                    Threads::Pool,
                    scratch,
                );
                if per_tensor.is_none() {
                    use rayon::prelude::*;
                    dst.par_chunks_mut(n.max(1)).for_each(|row| {
                        for (v, s) in row.iter_mut().zip(scales) {
                            *v *= s;
                        }
                    });
                }
                match activation {
                    Some(act) => {
                        use rayon::prelude::*;
                        dst.par_chunks_mut(n.max(1)).for_each(|row| {
                            activation::bias_activation_rows(row, n, 1, n, bias, Some(act));
                        });
                    }
                    None => super::matmul::add_bias(dst, n, bias),
                }
            });
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::device::Device;
    use crate::dtype::DType;
    use crate::tensor::Tensor;

    #[test]
    fn per_channel_scales_scale_each_output_and_quantizing_keeps_the_weight_close() {
        let dev = Device::cpu().unwrap();
        let x = Tensor::randn(&[3, 64], 4, 0, DType::F32, &dev).unwrap();
        let w = Tensor::randn(&[48, 64], 5, 0, DType::F32, &dev)
            .unwrap()
            .mul_scalar(0.02)
            .unwrap();
        let (codes, scales) = w.quantize_fp8().unwrap();
        assert_eq!(codes.dtype(), DType::F8E4M3);
        let got = x.linear_fp8(&codes, &scales, None).unwrap();
        let exact = x.linear(&w, None).unwrap();
        let rel = crate::compare::relative_l2(&got, &exact).unwrap();
        assert!(rel < 0.05, "relative L2 {rel}");
        let err = x
            .linear_fp8(
                &codes,
                &Tensor::zeros(&[7], DType::F32, &dev).unwrap(),
                None,
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("one per output channel"), "{err}");
    }
}
