//! Fused passes over activations where separate ops would each read and write the whole
//! tensor: a layer norm with its modulation (`LN(x)·(1 + scale) + shift`, the DiT's
//! adaLN) and a gated residual (`x + a·b`). Each performs, per element, exactly the
//! operations of the unfused chain in the same order, so the bytes are the same.

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::kernels::simd;
use crate::layout::Layout;
use crate::tensor::Tensor;

/// `t` as contiguous f32 with its layout broadcast to `shape` (`op` names errors).
fn broadcast_operand(op: &'static str, t: &Tensor, shape: &[usize]) -> Result<(Tensor, Layout)> {
    let t = super::float_f32(op, t)?.to_f32_contiguous()?;
    let layout = t.layout().broadcast_to(shape)?;
    let inner = layout.strides().last().copied().unwrap_or(1);
    if shape.last().copied().unwrap_or(1) > 1 && inner != 1 {
        return Err(TensorError::shape(
            op,
            format!(
                "operand of shape {:?} must span the last axis of {shape:?}",
                t.shape()
            ),
        ));
    }
    Ok((t, layout))
}

/// `f(out_row, x_row, a_row, b_row)` for every row of `x` (contiguous f32, rows of `n`)
/// into a new tensor of `dtype` (f32, or bf16: each f32 row rounded to nearest even as
/// it is made), with `a` and `b` broadcast to `x`'s shape (`op` names errors).
#[allow(clippy::too_many_arguments)]
fn rows_with_two(
    op: &'static str,
    x: &Tensor,
    a: &Tensor,
    b: &Tensor,
    n: usize,
    dtype: DType,
    f: impl Fn(&mut [f32], &[f32], &[f32], &[f32]) + Sync,
) -> Result<Tensor> {
    let shape = x.shape().to_vec();
    let (ta, la) = broadcast_operand(op, a, &shape)?;
    let (tb, lb) = broadcast_operand(op, b, &shape)?;
    let input = super::float_f32(op, x)?.to_f32_contiguous()?;
    let mut out = Tensor::empty(&shape, dtype, x.device())?;
    if let (Some(src), Some(da), Some(db)) = (
        input.as_slice::<f32>(),
        ta.storage_as::<f32>(),
        tb.storage_as::<f32>(),
    ) {
        super::write_rows(&mut out, n, |row, o| {
            let (ba, bb) = (la.row_start(row), lb.row_start(row));
            f(
                o,
                &src[row * n..(row + 1) * n],
                &da[ba..ba + n],
                &db[bb..bb + n],
            );
        });
    }
    Ok(out)
}

impl Tensor {
    /// `layer_norm(self) · (1 + scale) + shift` over the last axis (no affine weights),
    /// `shift` and `scale` broadcast to `self`'s shape: adaLN modulation in one pass.
    pub fn layer_norm_modulate(&self, shift: &Tensor, scale: &Tensor, eps: f32) -> Result<Tensor> {
        self.layer_norm_modulate_as(shift, scale, eps, self.dtype())
    }

    /// [`Tensor::layer_norm_modulate`] with the result in `dtype`, computed in f32 and
    /// rounded once per value. For a result that only bf16 products read, bf16 gives
    /// them the bits they would round to themselves, in half the bytes.
    pub fn layer_norm_modulate_as(
        &self,
        shift: &Tensor,
        scale: &Tensor,
        eps: f32,
        dtype: DType,
    ) -> Result<Tensor> {
        crate::profile::op("layer_norm_modulate", &[self, shift, scale], || {
            const OP: &str = "layer_norm_modulate";
            let n = super::norm::last_axis(OP, self)?;
            if self.device().launcher().is_some() {
                // The op chain whose bytes the fused pass gives (see the test below).
                broadcast_operand(OP, shift, self.shape())?;
                broadcast_operand(OP, scale, self.shape())?;
                // In f32 throughout, rounded once at the end as the fused pass does.
                let normed = self.to_dtype(DType::F32)?.layer_norm(None, None, eps)?;
                let out = normed.mul(&scale.to_dtype(DType::F32)?.add_scalar(1.0)?)?;
                return out.add(&shift.to_dtype(DType::F32)?)?.to_dtype(dtype);
            }
            let direct = if dtype == DType::BF16 {
                DType::BF16
            } else {
                DType::F32
            };
            let out = rows_with_two(OP, self, shift, scale, n, direct, |o, x, shift, scale| {
                let (mean, inv) = super::norm::mean_inv_std(x, eps);
                simd::zip3_map(o, x, shift, scale, |v, s, c| {
                    (v - mean) * inv * (c + 1.0) + s
                });
            })?;
            out.to_dtype(dtype)
        })
    }

    /// `self + a · b`, `a` and `b` broadcast to `self`'s shape: a gated residual in one
    /// pass.
    pub fn add_mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        crate::profile::op("add_mul", &[self, a, b], || {
            let n = self.shape().last().copied().unwrap_or(1).max(1);
            if self.device().launcher().is_some() {
                broadcast_operand("add_mul", a, self.shape())?;
                broadcast_operand("add_mul", b, self.shape())?;
                let f = |t: &Tensor| t.to_dtype(DType::F32);
                let out = f(self)?.add(&f(a)?.mul(&f(b)?)?)?;
                let promote = super::elementwise::promote;
                return out.to_dtype(promote(promote(self.dtype(), a.dtype()), b.dtype()));
            }
            let out = rows_with_two("add_mul", self, a, b, n, DType::F32, |o, x, a, b| {
                simd::zip3_map(o, x, a, b, |v, p, q| v + p * q);
            })?;
            let promote = super::elementwise::promote;
            out.to_dtype(promote(promote(self.dtype(), a.dtype()), b.dtype()))
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor};

    fn device() -> Device {
        static DEVICE: std::sync::OnceLock<Device> = std::sync::OnceLock::new();
        DEVICE.get_or_init(|| Device::cpu().unwrap()).clone()
    }

    fn t(shape: &[usize], seed: u32) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000) as f32 / 250.0
                    - 2.0
            })
            .collect();
        Tensor::from_slice(&v, shape, &device()).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// The bf16 words of a bf16 tensor.
    fn words(t: &Tensor) -> Vec<u16> {
        t.to_vec::<half::bf16>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    }

    #[test]
    fn fused_passes_give_the_bytes_of_the_op_chains() {
        let x = t(&[2, 37, 24], 1);
        for (shift, scale) in [
            (t(&[1, 1, 24], 2), t(&[1, 1, 24], 3)),
            (t(&[2, 37, 24], 4), t(&[1, 37, 24], 5)),
        ] {
            let fused = x.layer_norm_modulate(&shift, &scale, 1e-6).unwrap();
            let chain = x
                .layer_norm(None, None, 1e-6)
                .unwrap()
                .mul(&scale.add_scalar(1.0).unwrap())
                .unwrap()
                .add(&shift)
                .unwrap();
            assert_eq!(bits(&fused), bits(&chain));
            let rounded = x
                .layer_norm_modulate_as(&shift, &scale, 1e-6, DType::BF16)
                .unwrap();
            assert_eq!(
                words(&rounded),
                words(&fused.to_dtype(DType::BF16).unwrap())
            );
            let gated = x.add_mul(&shift, &scale).unwrap();
            assert_eq!(
                bits(&gated),
                bits(&x.add(&shift.mul(&scale).unwrap()).unwrap())
            );
        }
        // A layer norm made in bf16: the bits of rounding the f32 one.
        let (w, b) = (t(&[24], 6), t(&[24], 7));
        for (w, b) in [(Some(&w), Some(&b)), (None, None), (Some(&w), None)] {
            let f32_norm = x.layer_norm(w, b, 1e-6).unwrap();
            let made = x.layer_norm_as(w, b, 1e-6, DType::BF16).unwrap();
            assert_eq!(
                words(&made),
                words(&f32_norm.to_dtype(DType::BF16).unwrap())
            );
        }
        // The VAE's channel RMS norm with its SiLU in one pass: the chain's bits.
        let v = t(&[2, 5, 3, 7], 8);
        let gamma = t(&[5, 1, 1], 9);
        for v in [v.clone(), v.to_dtype(DType::BF16).unwrap()] {
            let chain = v.rms_norm_channels(&gamma).unwrap().silu().unwrap();
            let fused = v.rms_norm_channels_silu(&gamma).unwrap();
            assert_eq!(fused.dtype(), v.dtype());
            assert_eq!(
                bits(&fused.to_dtype(DType::F32).unwrap()),
                bits(&chain.to_dtype(DType::F32).unwrap())
            );
        }
        let bf = x.to_dtype(DType::BF16).unwrap();
        assert_eq!(bf.add_mul(&bf, &bf).unwrap().dtype(), DType::BF16);
        assert!(x
            .layer_norm_modulate(&t(&[1, 1, 5], 0), &t(&[1, 1, 24], 0), 1e-6)
            .is_err());
        assert!(x.add_mul(&t(&[3, 1, 24], 0), &t(&[1, 1, 24], 0)).is_err());
    }
}
