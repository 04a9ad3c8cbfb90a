//! W8A8 linear layers: a weight quantized to int8 per output channel once, at load, and
//! each call's input quantized per row (token) on the fly; the product in exact i32 sums
//! ([`crate::kernels::cpu::int8`]), scaled to f32 with the bias and the activation in the
//! epilogue, stored as f32 or bf16.
//!
//! The weight costs one byte per value plus 8 bytes per output channel (its scale and
//! the compensation of the input's unsigned shift), about half of bf16.
//!
//! On a GPU the weight is held as its codes `[out, in]` and cuBLASLt's int8 GEMM sums
//! exactly in i32 ([`crate::ops::dispatch::linear_8bit`]); the input is quantized per row
//! by a kernel with the host's rule. The bytes do not
//! depend on the CPU path or the thread count: the sums are exact integers and the
//! epilogue runs one fixed sequence of f32 operations. On a meta device the packed weight
//! and every buffer are allocated like any other and nothing is computed.

use half::bf16;

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::kernels::activation::{self, Activation};
use crate::kernels::cpu::int8::{self, Int8Kernel, PANEL};
use crate::kernels::cpu::pack::round_row;
use crate::tensor::Tensor;

/// A linear layer's `[out, in]` weight as int8 per output channel, packed for the int8
/// products.
#[derive(Debug, Clone)]
pub struct Int8Linear {
    /// On the host, [`int8::packed_len`] bytes (U8): the panels, then the compensations.
    /// On a GPU, the codes `[out, in]` (I8) as cuBLASLt's int8 GEMM reads them.
    packed: Tensor,
    /// One f32 scale per output channel.
    scales: Tensor,
    out_features: usize,
    in_features: usize,
}

impl Int8Linear {
    /// Rows of the weight (output features).
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Columns of the weight (input features).
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Bytes the quantized weight holds (values, scales and compensations).
    pub fn nbytes(&self) -> usize {
        self.packed.numel() + self.scales.numel() * 4
    }

    /// The weight as f32 `[out, in]`, each value its int8 times its channel's scale:
    /// what the products multiply by (for error measurements).
    pub fn dequantize(&self) -> Result<Tensor> {
        let (n, k) = (self.out_features, self.in_features);
        if self.packed.dtype() == DType::I8 {
            let codes = self.packed.to_dtype(DType::F32)?;
            return codes.mul(&self.scales.reshape(&[n, 1])?);
        }
        let mut out = Tensor::empty(&[n, k], DType::F32, self.packed.device())?;
        if self.packed.device().is_meta() {
            return Ok(out);
        }
        let (Some(packed), Some(scales), Some(dst)) = (
            self.packed.as_slice::<u8>(),
            self.scales.as_slice::<f32>(),
            out.data_mut::<f32>(),
        ) else {
            return Err(TensorError::Meta { op: "dequantize" });
        };
        for (c, row) in dst.chunks_exact_mut(k.max(1)).enumerate() {
            for (i, v) in row.iter_mut().enumerate() {
                *v = f32::from(int8::packed_value(packed, k, c, i)) * scales[c];
            }
        }
        Ok(out)
    }
}

impl Int8Linear {
    /// An int8 weight as a checkpoint ships it: `codes` (i8 `[out, in]`) and `scales`
    /// (f32, one value or one per output channel), packed for the products.
    pub fn from_codes(codes: &Tensor, scales: &Tensor) -> Result<Self> {
        let op = "int8_weight";
        if codes.dtype() != DType::I8 || codes.rank() != 2 {
            return Err(TensorError::shape(
                op,
                format!(
                    "the weight must be i8 [out, in], got {} {:?}",
                    codes.dtype(),
                    codes.shape()
                ),
            ));
        }
        let (n, k) = (codes.shape()[0], codes.shape()[1]);
        super::matmul::check_scales(op, scales, n)?;
        if codes.device().launcher().is_some() {
            return Ok(Int8Linear {
                packed: codes.contiguous()?,
                scales: scales
                    .to_f32_contiguous()?
                    .broadcast_to(&[n])?
                    .contiguous()?,
                out_features: n,
                in_features: k,
            });
        }
        let mut packed = Tensor::empty(&[int8::packed_len(n, k)], DType::U8, codes.device())?;
        let mut out_scales = Tensor::empty(&[n], DType::F32, codes.device())?;
        if !codes.device().is_meta() {
            let c = codes.contiguous()?;
            let s = scales.to_f32_contiguous()?;
            let (Some(c), Some(s), Some(dst), Some(ds)) = (
                c.as_slice::<i8>(),
                s.as_slice::<f32>(),
                packed.data_mut::<u8>(),
                out_scales.data_mut::<f32>(),
            ) else {
                return Err(TensorError::Meta { op });
            };
            int8::pack_weight(c, n, k, dst);
            for (j, d) in ds.iter_mut().enumerate() {
                *d = if s.len() == 1 { s[0] } else { s[j] };
            }
        }
        Ok(Int8Linear {
            packed,
            scales: out_scales,
            out_features: n,
            in_features: k,
        })
    }
}

impl Tensor {
    /// This `[out, in]` float weight quantized to int8 per output channel (symmetric,
    /// scale `max|w| / 127`) and packed for [`Tensor::linear_int8`].
    pub fn quantize_linear_int8(&self) -> Result<Int8Linear> {
        let op = "quantize_linear_int8";
        self.require_float(op)?;
        let (n, k) = super::matmul::weight_dims(op, self)?;
        if self.device().launcher().is_some() {
            let (codes, scales) = super::dispatch::quantize_weight(self, DType::I8)?;
            return Ok(Int8Linear {
                packed: codes,
                scales,
                out_features: n,
                in_features: k,
            });
        }
        let mut packed = Tensor::empty(&[int8::packed_len(n, k)], DType::U8, self.device())?;
        let mut scales = Tensor::empty(&[n], DType::F32, self.device())?;
        // Read as f32 on a meta device too: a plan allocates what a run does.
        let w = self.to_f32_contiguous()?;
        if !self.device().is_meta() {
            let (Some(w), Some(dst), Some(s)) = (
                w.as_slice::<f32>(),
                packed.data_mut::<u8>(),
                scales.data_mut::<f32>(),
            ) else {
                return Err(TensorError::Meta { op });
            };
            let (q, sc) = int8::quantize_weight(w, k);
            int8::pack_weight(&q, n, k, dst);
            s.copy_from_slice(&sc);
        }
        Ok(Int8Linear {
            packed,
            scales,
            out_features: n,
            in_features: k,
        })
    }

    /// `x @ weightᵀ + bias` over the last axis with an int8 weight, the input quantized
    /// per row: f32 out.
    pub fn linear_int8(&self, weight: &Int8Linear, bias: Option<&Tensor>) -> Result<Tensor> {
        self.linear_int8_as(weight, bias, None, DType::F32)
    }

    /// [`Tensor::linear_int8`] followed by `activation`, the result in `dtype` (f32, or
    /// bf16 rounded to nearest even), each block finished while it is in cache.
    pub fn linear_int8_as(
        &self,
        weight: &Int8Linear,
        bias: Option<&Tensor>,
        activation: Option<Activation>,
        dtype: DType,
    ) -> Result<Tensor> {
        crate::profile::op("linear_int8", &[self, &weight.packed], || {
            let op = "linear_int8";
            self.require_float(op)?;
            self.same_device(op, &weight.packed)?;
            super::matmul::check_result_dtype(op, dtype)?;
            let (n, k) = (weight.out_features, weight.in_features);
            let rows = super::matmul::check_linear(op, self, n, k, &[n, k], bias)?;
            let kp = int8::padded_k(k);
            let mut out_shape = self.shape().to_vec();
            *out_shape.last_mut().expect("rank checked above") = n;
            if let Some(l) = self.device().launcher() {
                let out = super::dispatch::linear_8bit_then(
                    l.as_ref(),
                    self,
                    &weight.packed,
                    &weight.scales,
                    bias,
                    &out_shape,
                    activation,
                )?;
                return if dtype == DType::F32 {
                    Ok(out)
                } else {
                    out.to_dtype(dtype)
                };
            }
            let mut out = Tensor::empty(&out_shape, dtype, self.device())?;
            let mut a = Tensor::empty(&[rows * kp], DType::U8, self.device())?;
            let mut a_scales = Tensor::empty(&[rows], DType::F32, self.device())?;
            let x = self.contiguous()?;
            let b = bias.map(|b| b.to_f32_contiguous()).transpose()?;
            if self.device().is_meta() {
                return Ok(out);
            }
            let (Some(qa), Some(sa)) = (a.data_mut::<u8>(), a_scales.data_mut::<f32>()) else {
                return Err(TensorError::Meta { op });
            };
            crate::parallel::run(|| match x.dtype() {
                DType::BF16 => x
                    .as_slice::<bf16>()
                    .map(|v| int8::quantize_rows(v, k, qa, sa)),
                DType::F16 => x
                    .as_slice::<half::f16>()
                    .map(|v| int8::quantize_rows(v, k, qa, sa)),
                _ => x
                    .as_slice::<f32>()
                    .map(|v| int8::quantize_rows(v, k, qa, sa)),
            })
            .ok_or(TensorError::Meta { op })?;
            let (Some(qa), Some(sa), Some(wp), Some(ws)) = (
                a.as_slice::<u8>(),
                a_scales.as_slice::<f32>(),
                weight.packed.as_slice::<u8>(),
                weight.scales.as_slice::<f32>(),
            ) else {
                return Err(TensorError::Meta { op });
            };
            let bias = b.as_ref().and_then(|b| b.as_slice::<f32>());
            let dst = match dtype {
                DType::BF16 => out
                    .data_mut::<bf16>()
                    .map(|d| Out::Bf16(d.as_mut_ptr().cast())),
                _ => out.data_mut::<f32>().map(|d| Out::F32(d.as_mut_ptr())),
            }
            .ok_or(TensorError::Meta { op })?;
            let dst = &dst;
            let sink = move |blk: int8::Block<'_>| {
                let (row, col, h, w) = (blk.row, blk.col, blk.h, blk.w);
                let bias = bias.map(|b| &b[col..col + w]);
                activation::bias_activation_rows(blk.data, PANEL, h, w, bias, activation);
                for r in 0..h {
                    let src = &blk.data[r * PANEL..r * PANEL + w];
                    let at = (row + r) * n + col;
                    // SAFETY: the block lies inside the `rows × n` output and only this
                    // sink call writes it (the GEMM hands each block out once).
                    unsafe {
                        match *dst {
                            Out::F32(p) => {
                                std::slice::from_raw_parts_mut(p.add(at), w).copy_from_slice(src)
                            }
                            Out::Bf16(p) => {
                                round_row(src, std::slice::from_raw_parts_mut(p.add(at), w))
                            }
                        }
                    }
                }
            };
            let threads = crate::parallel::num_threads();
            let kernel = Int8Kernel::selected();
            crate::parallel::run(|| int8::gemm(rows, n, k, qa, sa, wp, ws, threads, kernel, &sink));
            Ok(out)
        })
    }
}

/// The output of [`Tensor::linear_int8_as`], written block by block from the GEMM's
/// threads.
#[derive(Clone, Copy)]
enum Out {
    F32(*mut f32),
    Bf16(*mut u16),
}
// SAFETY: every block of the output is written by exactly one sink call, and the blocks
// are disjoint, so threads never touch the same element.
unsafe impl Sync for Out {}
// SAFETY: as for `Sync`: the pointer is only written through disjoint blocks.
unsafe impl Send for Out {}

#[cfg(test)]
mod tests {
    use crate::device::Device;
    use crate::dtype::DType;
    use crate::kernels::activation::Activation;
    use crate::tensor::Tensor;

    #[test]
    fn the_int8_linear_is_the_f32_linear_of_its_dequantized_weight_within_input_rounding() {
        let dev = Device::cpu().unwrap();
        let x = Tensor::randn(&[3, 7, 70], 1, 0, DType::F32, &dev).unwrap();
        let w = Tensor::randn(&[45, 70], 2, 0, DType::F32, &dev).unwrap();
        let b = Tensor::randn(&[45], 3, 0, DType::F32, &dev).unwrap();
        let q = w.quantize_linear_int8().unwrap();
        let got = x.linear_int8(&q, Some(&b)).unwrap();
        assert_eq!(got.shape(), &[3, 7, 45]);
        let exact = x.linear(&w, Some(&b)).unwrap();
        let rel = crate::compare::relative_l2(&got, &exact).unwrap();
        assert!(rel < 0.02, "relative L2 {rel}");
        // The dequantized weight is what the product multiplied by: closer still.
        let deq = x.linear(&q.dequantize().unwrap(), Some(&b)).unwrap();
        let rel_deq = crate::compare::relative_l2(&got, &deq).unwrap();
        assert!(rel_deq < rel, "{rel_deq} vs {rel}");
        // GELU and bf16 in the epilogue: the bits of the f32 result through both.
        let gelu = x
            .linear_int8_as(&q, Some(&b), Some(Activation::GeluTanh), DType::BF16)
            .unwrap();
        let twice = got.gelu_tanh().unwrap().to_dtype(DType::BF16).unwrap();
        assert_eq!(gelu.to_f32_vec().unwrap(), twice.to_f32_vec().unwrap());
    }

    #[test]
    fn a_weight_that_is_not_a_matrix_is_refused_by_name() {
        let dev = Device::cpu().unwrap();
        let w = Tensor::zeros(&[4], DType::F32, &dev).unwrap();
        let err = w.quantize_linear_int8().unwrap_err().to_string();
        assert!(err.contains("[out, in]"), "{err}");
    }
}
