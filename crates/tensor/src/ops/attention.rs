//! Scaled dot-product attention (flash-style, bounded scratch) and Wan's 3-axis rotary
//! embedding, on tensors in the transformer's `[B, L, H, D]` layout.

use crate::dtype::DType;
use crate::error::{Result, TensorError};
pub use crate::kernels::attention::Mask;
use crate::kernels::attention::{self as k, AttentionParams};
use crate::kernels::gemm::Compute;
use crate::kernels::rope::{apply_rope, RopeTable};
use crate::tensor::Tensor;

/// f32 with a unit stride on the last axis (the kernels' one layout requirement).
fn f32_rows(t: &Tensor) -> Result<Tensor> {
    let t = t.to_dtype(DType::F32)?;
    if t.layout().strides().last() == Some(&1) {
        Ok(t)
    } else {
        t.contiguous()
    }
}

impl Tensor {
    /// Attention of `q [B, Lq, H, D]` over `k, v [B, Lk, H, D]` with an optional
    /// block-causal mask; `scale` defaults to `1/√D`. Scratch is bounded by the tile size,
    /// whatever `Lk`. Result f32 `[B, Lq, H, D]`.
    pub fn scaled_dot_product_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Mask,
        scale: Option<f32>,
    ) -> Result<Tensor> {
        let bf16 = [q, k, v].iter().any(|t| t.dtype() == DType::BF16);
        let compute = if bf16 {
            Compute::Bf16
        } else {
            crate::kernels::gemm::f32_compute()
        };
        Self::scaled_dot_product_attention_in(q, k, v, mask, scale, compute)
    }

    /// [`Tensor::scaled_dot_product_attention`] with both products computed in `compute`
    /// whatever the inputs' dtypes (a bf16 model passes its f32 activations with
    /// [`Compute::Bf16`]; the softmax statistics stay f32).
    pub fn scaled_dot_product_attention_in(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Mask,
        scale: Option<f32>,
        compute: Compute,
    ) -> Result<Tensor> {
        crate::profile::op("attention", &[q, k, v], || {
            let op = "attention";
            q.same_device(op, k)?;
            q.same_device(op, v)?;
            let [b, lq, h, d] = *q.shape() else {
                return Err(TensorError::shape(
                    op,
                    format!("q must be [B, Lq, H, D], got {:?}", q.shape()),
                ));
            };
            let kv_ok = |t: &Tensor| {
                t.rank() == 4 && t.shape()[0] == b && t.shape()[2] == h && t.shape()[3] == d
            };
            if !kv_ok(k) || !kv_ok(v) || k.shape()[1] != v.shape()[1] {
                return Err(TensorError::shape(
                    op,
                    format!(
                        "k {:?} and v {:?} must be [{b}, Lk, {h}, {d}] for q {:?}",
                        k.shape(),
                        v.shape(),
                        q.shape()
                    ),
                ));
            }
            if let Mask::BlockCausal { block_len: 0, .. } = mask {
                return Err(TensorError::shape(
                    op,
                    "block-causal mask needs block_len ≥ 1",
                ));
            }
            let lk = k.shape()[1];
            let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
            if let Some(l) = q.device().launcher() {
                // bf16 operands go to the tensor-core kernels (head_dim 64 / 128), else f32.
                let dt = if compute == Compute::Bf16 && (d == 64 || d == 128) {
                    DType::BF16
                } else {
                    DType::F32
                };
                let rows = |t: &Tensor| -> Result<Tensor> {
                    let t = t.to_dtype(dt)?;
                    let s = t.layout().strides();
                    // Unit head stride, even strides and an even offset: the bf16 kernels load
                    // pairs as 32-bit words, which must be 4-byte aligned.
                    let aligned =
                        s.iter().take(3).all(|&x| x % 2 == 0) && t.layout().offset() % 2 == 0;
                    if s[3] == 1 && (dt == DType::F32 || aligned) {
                        Ok(t)
                    } else {
                        t.copy_as(dt)
                    }
                };
                if d > 256 && mask == Mask::None {
                    // Wider heads than the kernels hold in registers (the VAE's one head of
                    // 384): scores through the GEMM, softmax, then the GEMM again.
                    let heads = |t: &Tensor| t.to_dtype(DType::F32)?.permute(&[0, 2, 1, 3]);
                    let (qh, kh, vh) = (heads(q)?, heads(k)?, heads(v)?);
                    let scores = qh.matmul(&kh.transpose(2, 3)?)?.mul_scalar(scale)?;
                    let out = scores.softmax()?.matmul(&vh)?;
                    return out.permute(&[0, 2, 1, 3])?.contiguous();
                }
                let (qd, kd, vd) = (rows(q)?, rows(k)?, rows(v)?);
                let out = Tensor::empty(&[b, lq, h, d], DType::F32, q.device())?;
                if out.numel() > 0 {
                    crate::ops::dispatch::attention(l.as_ref(), &qd, &kd, &vd, &out, mask, scale)?;
                }
                return Ok(out);
            }
            let (qf, kf, vf) = (f32_rows(q)?, f32_rows(k)?, f32_rows(v)?);
            let mut out = Tensor::empty(&[b, lq, h, d], DType::F32, q.device())?;
            let params = AttentionParams {
                heads: h,
                q_len: lq,
                kv_len: lk,
                head_dim: d,
                scale,
                mask,
                q_head_stride: qf.layout().strides()[2],
                q_token_stride: qf.layout().strides()[1],
                k_head_stride: kf.layout().strides()[2],
                k_token_stride: kf.layout().strides()[1],
                v_head_stride: vf.layout().strides()[2],
                v_token_stride: vf.layout().strides()[1],
                out_head_stride: d,
                out_token_stride: h * d,
                compute,
            };
            let mut scratch =
                Tensor::empty(&[k::attention_scratch_len(&params)], DType::F32, q.device())?;
            if let (Some(qs), Some(ks), Some(vs)) = (
                qf.storage_as::<f32>(),
                kf.storage_as::<f32>(),
                vf.storage_as::<f32>(),
            ) {
                if let (Some(o), Some(sc)) = (out.data_mut::<f32>(), scratch.data_mut::<f32>()) {
                    let per_batch = lq * h * d;
                    for bi in 0..b {
                        let at = |t: &Tensor| t.layout().offset() + bi * t.layout().strides()[0];
                        let (q0, k0, v0) = (at(&qf), at(&kf), at(&vf));
                        let o = &mut o[bi * per_batch..(bi + 1) * per_batch];
                        crate::parallel::run(|| {
                            k::attention(&params, &qs[q0..], &ks[k0..], &vs[v0..], o, sc)
                        });
                    }
                }
            }
            drop(scratch);
            Ok(out)
        })
    }

    /// Wan's rotary embedding on `[B, L, H, D]` (or `[L, H, D]`): token `i` of every batch
    /// item sits at grid position `positions[i] = (frame, row, column)`. Result f32.
    pub fn rope(&self, table: &RopeTable, positions: &[[usize; 3]]) -> Result<Tensor> {
        crate::profile::op("rope", &[self], || {
            let op = "rope";
            let (batch, l, h, d) = match *self.shape() {
                [b, l, h, d] => (b, l, h, d),
                [l, h, d] => (1, l, h, d),
                _ => {
                    return Err(TensorError::shape(
                        op,
                        format!("expects [B, L, H, D] or [L, H, D], got {:?}", self.shape()),
                    ))
                }
            };
            if d != table.head_dim() {
                return Err(TensorError::shape(
                    op,
                    format!(
                        "head dim {d} of {:?} differs from the table's {}",
                        self.shape(),
                        table.head_dim()
                    ),
                ));
            }
            if positions.len() != l {
                return Err(TensorError::shape(
                    op,
                    format!("{} positions for {l} tokens", positions.len()),
                ));
            }
            let max = table.max_positions();
            if let Some(p) = positions.iter().find(|p| p.iter().any(|&c| c >= max)) {
                return Err(TensorError::shape(
                    op,
                    format!("position {p:?} is beyond the table's {max} positions per axis"),
                ));
            }
            let mut out = self.copy_as(DType::F32)?;
            if let Some(l) = self.device().launcher() {
                crate::ops::dispatch::rope(l.as_ref(), &out, table, positions, batch, h)?;
            } else if let Some(data) = out.data_mut::<f32>() {
                let per = l * h * d;
                for bi in 0..batch {
                    apply_rope(table, &mut data[bi * per..(bi + 1) * per], positions, h, d);
                }
            }
            Ok(out)
        })
    }
}
