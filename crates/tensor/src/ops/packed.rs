//! Linear layers with their weight packed once: `x · Wᵀ + b` where `W` (bf16 `[out, in]`)
//! is held as the AMX tiles' packed B operand from load time on, so no call repacks it
//! (per call, packing a 1.3B FFN weight cost about as much as a tenth of its product).
//!
//! A packed weight replaces the plain one (the same bytes for dimensions that are
//! multiples of 32, zero padding otherwise), and [`Tensor::linear_packed`] gives exactly
//! the bits [`Tensor::linear`] gives with the plain weight: the same loops over the same
//! packed values. Packing happens only where the selected CPU path runs bf16 products
//! on AMX; elsewhere [`Tensor::pack_linear`] declines and the plain weight stays. On a
//! meta device the packed tensor is allocated like any other and nothing is computed.

use half::bf16;

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::kernels::activation::{self, Activation};
use crate::kernels::cpu;
use crate::kernels::cpu::amx::{self, Precision};
use crate::kernels::cpu::pack::{as_u16, round_row, Operand, PANEL};
use crate::kernels::gemm::{Compute, MatRef};
use crate::layout::Layout;
use crate::tensor::Tensor;

/// A linear layer's `[out, in]` bf16 weight packed as the B operand of `x · Wᵀ`.
#[derive(Debug, Clone)]
pub struct PackedLinear {
    /// The packed panels ([`amx::packed_b_len`] bf16 values).
    packed: Tensor,
    out_features: usize,
    in_features: usize,
}

impl PackedLinear {
    /// Rows of the weight (output features).
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Columns of the weight (input features).
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Bytes the packed weight holds.
    pub fn nbytes(&self) -> usize {
        self.packed.numel() * 2
    }
}

/// `bf16` storage read as the `u16` bits the packers and tiles use.
fn bits(v: &[bf16]) -> &[u16] {
    // SAFETY: bf16 is a transparent wrapper of u16: same size, alignment and validity.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u16>(), v.len()) }
}

/// As [`bits`], mutably.
pub(crate) fn bits_mut(v: &mut [bf16]) -> &mut [u16] {
    // SAFETY: as in `bits`; the new slice borrows `v` exclusively.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u16>(), v.len()) }
}

impl Tensor {
    /// This `[out, in]` weight packed for [`Tensor::linear_packed`], or `None` where
    /// packing would not be used: a weight that is not bf16, or a CPU path that does not
    /// run bf16 products on AMX.
    pub fn pack_linear(&self) -> Result<Option<PackedLinear>> {
        let op = "pack_linear";
        // A GPU device multiplies through cuBLASLt, which takes the plain weight.
        let gpu = self.device().launcher().is_some();
        if gpu || self.dtype() != DType::BF16 || !cpu::selected().packs_bf16() {
            return Ok(None);
        }
        let (out_features, in_features) = super::matmul::weight_dims(op, self)?;
        let len = amx::packed_b_len(out_features, in_features, Precision::Bf16);
        let mut packed = Tensor::empty(&[len], DType::BF16, self.device())?;
        if !self.device().is_meta() {
            let w = self.contiguous()?;
            let (Some(data), Some(out)) = (w.as_slice::<bf16>(), packed.data_mut::<bf16>()) else {
                return Err(TensorError::Meta { op });
            };
            // B = Wᵀ: element (in, out) of B is W[out][in], k-contiguous.
            let b = Operand::Bf16(MatRef::row_major(data, 0, in_features).t());
            let panels = 0..out_features.div_ceil(PANEL);
            let parts = Precision::Bf16.parts().1;
            let threads = crate::parallel::num_threads();
            crate::parallel::run(|| {
                amx::pack_b_panels(
                    &b,
                    in_features,
                    out_features,
                    panels,
                    parts,
                    bits_mut(out),
                    threads,
                )
            });
        }
        Ok(Some(PackedLinear {
            packed,
            out_features,
            in_features,
        }))
    }

    /// `x @ weightᵀ + bias` over the last axis with a weight from
    /// [`Tensor::pack_linear`]: the bits of [`Tensor::linear`] with the plain weight.
    pub fn linear_packed(&self, weight: &PackedLinear, bias: Option<&Tensor>) -> Result<Tensor> {
        self.linear_packed_then(weight, bias, None)
    }

    /// [`Tensor::linear_packed`] followed by `activation` on every element, applied to
    /// each block of the output while it is in cache (no pass over the whole output):
    /// the bits of the two ops one after the other.
    pub fn linear_packed_then(
        &self,
        weight: &PackedLinear,
        bias: Option<&Tensor>,
        activation: Option<Activation>,
    ) -> Result<Tensor> {
        self.linear_packed_as(weight, bias, activation, DType::F32)
    }

    /// [`Tensor::linear_packed_then`] with the result in `dtype` (f32 or bf16). A bf16
    /// result is each f32 value rounded to nearest even, as a bf16 product rounds its
    /// operands: where the result only feeds another bf16 product, that product gets the
    /// same bits at half the bytes. Each finished block is rounded while it is in cache,
    /// so the f32 product is never stored (where K fits one block; else it is rounded
    /// after).
    pub fn linear_packed_as(
        &self,
        weight: &PackedLinear,
        bias: Option<&Tensor>,
        activation: Option<Activation>,
        dtype: DType,
    ) -> Result<Tensor> {
        crate::profile::op("linear", &[self, &weight.packed], || {
            let op = "linear";
            self.same_device(op, &weight.packed)?;
            super::matmul::check_result_dtype(op, dtype)?;
            let (out_features, in_features) = (weight.out_features, weight.in_features);
            let rows = super::matmul::check_linear(
                op,
                self,
                out_features,
                in_features,
                &[out_features, in_features],
                bias,
            )?;
            let in_blocks = dtype == DType::BF16 && amx::blocks_fit(in_features, Precision::Bf16);
            if dtype == DType::BF16 && !in_blocks {
                return self
                    .linear_packed_as(weight, bias, activation, DType::F32)?
                    .to_dtype(DType::BF16);
            }
            let x = super::matmul::gemm_input(op, self, Compute::Bf16)?.contiguous()?;
            let b = bias.map(|b| b.to_f32_contiguous()).transpose()?;
            let mut out_shape = self.shape().to_vec();
            *out_shape.last_mut().expect("rank checked above") = out_features;
            let mut out = Tensor::empty(&out_shape, dtype, self.device())?;
            let threads = crate::parallel::num_threads();
            let len = amx::prepacked_b_scratch_len(in_features, Precision::Bf16, threads);
            let mut scratch = Tensor::empty(&[len.div_ceil(2)], DType::F32, self.device())?;
            if self.device().is_meta() {
                return Ok(out);
            }
            let x_layout = Layout::contiguous(&[rows, in_features]);
            let (Some(a), Some(wb), Some(scratch)) = (
                super::matmul::operand(&x, &x_layout, x.layout().offset()),
                weight.packed.as_slice::<bf16>(),
                scratch.data_mut::<f32>(),
            ) else {
                return Err(TensorError::Meta { op });
            };
            let scratch = as_u16(scratch);
            let bias = b.as_ref().and_then(|b| b.as_slice::<f32>());
            let epilogue = move |blk: amx::Block<'_>| {
                let bias = bias.map(|b| &b[blk.col..blk.col + blk.w]);
                activation::bias_activation_rows(blk.data, blk.ldc, blk.h, blk.w, bias, activation);
            };
            if in_blocks {
                let Some(dst) = out.data_mut::<bf16>() else {
                    return Err(TensorError::Meta { op });
                };
                let dst = RowsOut(bits_mut(dst).as_mut_ptr());
                let dst = &dst;
                let sink = move |blk: amx::Block<'_>| {
                    let (ldc, w) = (blk.ldc, blk.w);
                    let (row, col, h) = (blk.row, blk.col, blk.h);
                    let bias = bias.map(|b| &b[col..col + w]);
                    activation::bias_activation_rows(blk.data, ldc, h, w, bias, activation);
                    for r in 0..h {
                        // SAFETY: the block lies inside the `rows × out_features` output (the
                        // GEMM's contract) and only this call writes it.
                        let d = unsafe {
                            std::slice::from_raw_parts_mut(
                                dst.0.add((row + r) * out_features + col),
                                w,
                            )
                        };
                        round_row(&blk.data[r * ldc..r * ldc + w], d);
                    }
                };
                crate::parallel::run(|| {
                    amx::gemm_prepacked_blocks(
                        rows,
                        out_features,
                        in_features,
                        &a,
                        bits(wb),
                        Precision::Bf16,
                        threads,
                        scratch,
                        &sink,
                    );
                });
                return Ok(out);
            }
            let Some(dst) = out.data_mut::<f32>() else {
                return Err(TensorError::Meta { op });
            };
            let fused = bias.is_some() || activation.is_some();
            crate::parallel::run(|| {
                let d = amx::Dst {
                    data: dst,
                    offset: 0,
                    ldc: out_features,
                };
                amx::gemm_prepacked_b(
                    rows,
                    out_features,
                    in_features,
                    &a,
                    bits(wb),
                    d,
                    false,
                    1.0,
                    Precision::Bf16,
                    threads,
                    scratch,
                    fused.then_some(&epilogue as &amx::Epilogue<'_>),
                );
            });
            Ok(out)
        })
    }
}

/// The bf16 output of [`Tensor::linear_packed_as`], written block by block from the
/// GEMM's threads.
struct RowsOut(*mut u16);
// SAFETY: every block of the output is written by exactly one sink call, and the blocks
// are disjoint (the GEMM's contract), so threads never touch the same element.
unsafe impl Sync for RowsOut {}
