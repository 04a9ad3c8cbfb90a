//! Matrix products: batched `matmul` with broadcast batch axes and `linear` (PyTorch's
//! `x @ W.T + b`), through [`crate::kernels::gemm::gemm`] with f32 accumulation. The
//! compute follows the operands: a bf16 operand (a bf16 weight) makes the product bf16
//! (f32 operands rounded to bf16 as they are packed), f32 operands compute in f32. Strided
//! operands go to GEMM as they are; f16 is widened to f32 first, and so is bf16 where the
//! path's f32 GEMM reads only f32. Packing scratch comes from the allocator.

use half::bf16;
use rayon::prelude::*;

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::kernels::cpu::pack::Operand;
use crate::kernels::gemm::{gemm, gemm_scratch_len, Compute, MatRef, Threads};
use crate::layout::{broadcast_shapes, Layout};
use crate::ops::dispatch;
use crate::tensor::Tensor;

/// The compute of a product of `a` and `b`: bf16 when either is bf16.
fn compute_of(a: &Tensor, b: &Tensor) -> Compute {
    if a.dtype() == DType::BF16 || b.dtype() == DType::BF16 {
        Compute::Bf16
    } else {
        crate::kernels::gemm::f32_compute()
    }
}

/// `t` in a dtype [`gemm`] reads for `compute` on the selected path.
pub(super) fn gemm_input(op: &'static str, t: &Tensor, compute: Compute) -> Result<Tensor> {
    t.require_float(op)?;
    let path = crate::kernels::cpu::selected();
    let keep_bf16 = compute == Compute::Bf16
        || crate::kernels::gemm::f32_uses_amx(path, compute)
        || path == crate::kernels::cpu::CpuPath::Scalar;
    match t.dtype() {
        DType::F32 => Ok(t.clone()),
        DType::BF16 if keep_bf16 => Ok(t.clone()),
        _ => t.to_dtype(DType::F32),
    }
}

/// The strided matrix view of `t`'s storage with `layout` (last two axes the matrix).
pub(super) fn operand<'a>(t: &'a Tensor, layout: &Layout, offset: usize) -> Option<Operand<'a>> {
    let r = layout.strides().len();
    let (rs, cs) = (
        layout.strides()[r - 2] as isize,
        layout.strides()[r - 1] as isize,
    );
    match t.dtype() {
        DType::F32 => t.storage_as::<f32>().map(|data| {
            Operand::F32(MatRef {
                data,
                offset,
                row_stride: rs,
                col_stride: cs,
            })
        }),
        DType::BF16 => t.storage_as::<bf16>().map(|data| {
            Operand::Bf16(MatRef {
                data,
                offset,
                row_stride: rs,
                col_stride: cs,
            })
        }),
        DType::F8E4M3 | DType::F8E5M2 => {
            let table = crate::kernels::cpu::fp8::table(t.dtype())?;
            t.storage_data().map(|data| {
                Operand::Fp8(
                    MatRef {
                        data,
                        offset,
                        row_stride: rs,
                        col_stride: cs,
                    },
                    table,
                )
            })
        }
        _ => None,
    }
}

/// f32 scratch for `count` GEMMs of these shapes (none when the path needs none).
pub(super) fn scratch(t: &Tensor, len: usize, count: usize) -> Result<Option<Tensor>> {
    if len == 0 {
        return Ok(None);
    }
    Ok(Some(Tensor::empty(&[len * count], DType::F32, t.device())?))
}

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

/// A linear weight's `(out, in)`, refusing one that is not `[out, in]`.
pub(super) fn weight_dims(op: &'static str, weight: &Tensor) -> Result<(usize, usize)> {
    match *weight.shape() {
        [out, inp] => Ok((out, inp)),
        _ => Err(TensorError::shape(
            op,
            format!("weight must be [out, in], got {:?}", weight.shape()),
        )),
    }
}

/// Refuses an 8-bit weight's scales that are neither one value nor one per output
/// channel of its `out` channels.
pub(super) fn check_scales(op: &'static str, scales: &Tensor, out: usize) -> Result<()> {
    if scales.numel() != 1 && scales.numel() != out {
        return Err(TensorError::shape(
            op,
            format!(
                "scale {:?} is neither one value nor one per output channel ({out})",
                scales.shape()
            ),
        ));
    }
    Ok(())
}

/// Refuses a linear's result dtype other than f32 or bf16.
pub(super) fn check_result_dtype(op: &'static str, dtype: DType) -> Result<()> {
    if dtype != DType::F32 && dtype != DType::BF16 {
        return Err(TensorError::DType {
            op,
            expected: "an f32 or bf16 result",
            got: dtype,
        });
    }
    Ok(())
}

/// Checks `x` ends in `in_features` and `bias` is `[out_features]`; the number of rows.
pub(super) fn check_linear(
    op: &'static str,
    x: &Tensor,
    out_features: usize,
    in_features: usize,
    weight_shape: &[usize],
    bias: Option<&Tensor>,
) -> Result<usize> {
    let last = x.shape().last().copied().unwrap_or(0);
    if x.rank() == 0 || last != in_features {
        return Err(TensorError::shape(
            op,
            format!(
                "input {:?} does not end in {in_features} features (weight {weight_shape:?})",
                x.shape(),
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
    Ok(x.numel() / in_features.max(1))
}

/// Adds `bias` to every `out_features`-long row of `dst` (on the pool).
pub(super) fn add_bias(dst: &mut [f32], out_features: usize, bias: Option<&[f32]>) {
    if let Some(bias) = bias {
        dst.par_chunks_mut(out_features).for_each(|row| {
            row.iter_mut().zip(bias).for_each(|(o, &b)| *o += b);
        });
    }
}

impl Tensor {
    /// Matrix product over the last two axes, batch axes broadcast: `[…, m, k] @ […, k, n]`.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        crate::profile::op("matmul", &[self, other], || {
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
            if let Some(l) = self.device().launcher() {
                self.require_float(op)?;
                other.require_float(op)?;
                let (input, dt) = dispatch::gemm_input(self.dtype(), other.dtype());
                let full = |last: [usize; 2]| batch.iter().copied().chain(last).collect::<Vec<_>>();
                let a = self
                    .to_dtype(dt)?
                    .broadcast_to(&full([m, k]))?
                    .contiguous()?;
                let b = other
                    .to_dtype(dt)?
                    .broadcast_to(&full([k, n]))?
                    .contiguous()?;
                let out = Tensor::empty(&full([m, n]), DType::F32, self.device())?;
                let batches = batch.iter().product();
                dispatch::matmul(l.as_ref(), &a, &b, &out, [batches, m, k, n], input)?;
                return Ok(out);
            }
            let compute = compute_of(self, other);
            let a = gemm_input(op, self, compute)?;
            let b = gemm_input(op, other, compute)?;
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
            let slots = crate::parallel::num_threads();
            let per = m * n;
            let many = batches >= slots * 2 && per > 0;
            let threads = if many { Threads::One } else { Threads::Pool };
            // At least one value per slot, so that every slot's chunk exists even when the
            // path needs no scratch (zipping with an empty slice would skip the products).
            let len = gemm_scratch_len(m, n, k, compute, threads).max(usize::from(many));
            let mut scratch = scratch(self, len, if many { slots } else { 1 })?;
            if self.device().is_meta() {
                return Ok(out);
            }
            let mut no_scratch: [f32; 0] = [];
            let scratch = match scratch.as_mut() {
                Some(t) => t.data_mut::<f32>().unwrap_or(&mut []),
                None => &mut no_scratch[..],
            };
            if let Some(dst) = out.data_mut::<f32>() {
                let at = |i: usize| {
                    let oa = operand(&a, &la, batch_offset(&la, i)).expect("float operand");
                    let ob = operand(&b, &lb, batch_offset(&lb, i)).expect("float operand");
                    (oa, ob)
                };
                crate::parallel::run(|| {
                    if many {
                        // Many small products: contiguous runs of them per thread slot, each
                        // product single-threaded with the slot's own scratch.
                        let run = batches.div_ceil(slots);
                        dst.par_chunks_mut(per * run)
                            .zip(scratch.par_chunks_mut(len))
                            .enumerate()
                            .for_each(|(c, (d, sc))| {
                                for (j, d) in d.chunks_mut(per).enumerate() {
                                    let (oa, ob) = at(c * run + j);
                                    gemm(
                                        m,
                                        n,
                                        k,
                                        oa,
                                        ob,
                                        d,
                                        0,
                                        n,
                                        false,
                                        1.0,
                                        compute,
                                        Threads::One,
                                        sc,
                                    );
                                }
                            });
                    } else {
                        for i in 0..batches {
                            let (oa, ob) = at(i);
                            gemm(
                                m,
                                n,
                                k,
                                oa,
                                ob,
                                dst,
                                i * per,
                                n,
                                false,
                                1.0,
                                compute,
                                Threads::Pool,
                                scratch,
                            );
                        }
                    }
                });
            }
            Ok(out)
        })
    }

    /// `gelu_tanh(x @ weightᵀ + bias)`: [`Tensor::linear`] then [`Tensor::gelu_tanh`] (the
    /// same bits) on the host; on a GPU one cuBLASLt call with its bias + GELU epilogue
    /// (cuBLASLt's tanh-GELU, within the self-test's tolerance of ours).
    pub fn linear_gelu_tanh(&self, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
        self.linear_then(weight, Some(bias), true)
    }

    /// [`Tensor::linear`] (then GELU when `gelu`) on a GPU device, shapes checked.
    fn linear_on_gpu(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        rows: usize,
        gelu: bool,
    ) -> Result<Tensor> {
        let l = self
            .device()
            .launcher()
            .expect("called on GPU devices only");
        self.require_float("linear")?;
        weight.require_float("linear")?;
        let out_features = weight.shape()[0];
        let (input, dt) = dispatch::gemm_input(self.dtype(), weight.dtype());
        let x = self.to_dtype(dt)?.contiguous()?;
        let w = weight.to_dtype(dt)?.contiguous()?;
        let b = bias.map(|b| b.to_f32_contiguous()).transpose()?;
        let mut out_shape = self.shape().to_vec();
        *out_shape.last_mut().expect("rank checked by check_linear") = out_features;
        let out = Tensor::empty(&out_shape, DType::F32, self.device())?;
        if rows > 0 && out_features > 0 {
            dispatch::linear(l.as_ref(), &x, &w, b.as_ref(), &out, input, gelu)?;
        }
        Ok(out)
    }

    /// `x @ weightᵀ + bias` over the last axis: weight is `[out, in]` (PyTorch layout),
    /// bias `[out]`; the result is f32 `[…, out]`.
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.linear_then(weight, bias, false)
    }

    /// [`Tensor::linear`], then the tanh-GELU when `gelu` (fused into the GEMM on a GPU).
    fn linear_then(&self, weight: &Tensor, bias: Option<&Tensor>, gelu: bool) -> Result<Tensor> {
        crate::profile::op("linear", &[self, weight], || {
            let op = "linear";
            self.same_device(op, weight)?;
            let (out_features, in_features) = weight_dims(op, weight)?;
            let rows = check_linear(op, self, out_features, in_features, weight.shape(), bias)?;
            if self.device().launcher().is_some() {
                return self.linear_on_gpu(weight, bias, rows, gelu);
            }
            let compute = compute_of(self, weight);
            let x = gemm_input(op, self, compute)?.contiguous()?;
            let w = gemm_input(op, weight, compute)?;
            let b = bias.map(|b| b.to_f32_contiguous()).transpose()?;
            let mut out_shape = self.shape().to_vec();
            *out_shape.last_mut().expect("rank checked above") = out_features;
            let mut out = Tensor::empty(&out_shape, DType::F32, self.device())?;
            let len = gemm_scratch_len(rows, out_features, in_features, compute, Threads::Pool);
            // On a meta device `data_mut` is None: the GEMM is skipped, the allocations kept.
            let mut scratch = scratch(self, len, 1)?;
            let x_layout = Layout::contiguous(&[rows, in_features]);
            if let (Some(ox), Some(ow), Some(dst)) = (
                operand(&x, &x_layout, x.layout().offset()),
                operand(&w, w.layout(), w.layout().offset()),
                out.data_mut::<f32>(),
            ) {
                let ow = match ow {
                    Operand::F32(m) => Operand::F32(m.t()),
                    Operand::Bf16(m) => Operand::Bf16(m.t()),
                    Operand::Fp8(m, table) => Operand::Fp8(m.t(), table),
                };
                let mut no_scratch: [f32; 0] = [];
                let scratch = match scratch.as_mut() {
                    Some(t) => t.data_mut::<f32>().unwrap_or(&mut []),
                    None => &mut no_scratch[..],
                };
                let bias = b.as_ref().and_then(|b| b.as_slice::<f32>());
                crate::parallel::run(|| {
                    gemm(
                        rows,
                        out_features,
                        in_features,
                        ox,
                        ow,
                        dst,
                        0,
                        out_features,
                        false,
                        1.0,
                        compute,
                        Threads::Pool,
                        scratch,
                    );
                    add_bias(dst, out_features, bias);
                });
            }
            if gelu {
                return out.gelu_tanh();
            }
            Ok(out)
        })
    }
}
