//! Elementwise arithmetic with NumPy broadcasting, scalar ops and activations. Values are
//! computed in f32; float outputs keep the (promoted) input dtype.

use rayon::prelude::*;

use crate::cuda::launch::Launcher;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::kernels::{activation, simd};
use crate::layout::broadcast_shapes;
use crate::ops::dispatch;
use crate::tensor::Tensor;

/// Output rows per parallel task.
const ROWS_PER_TASK: usize = 64;

/// The dtype of a binary op's result: f32 unless both sides share a narrower float type.
pub fn promote(a: DType, b: DType) -> DType {
    if a == b && a.is_float() {
        a
    } else {
        DType::F32
    }
}

/// Applies `f` to broadcast pairs of `a` and `b`.
pub fn binary(
    op: &'static str,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Result<Tensor> {
    crate::profile::op(op, &[a, b], || {
        a.same_device(op, b)?;
        let shape = broadcast_shapes(op, a.shape(), b.shape())?;
        let dtype = promote(a.dtype(), b.dtype());
        let fa = super::float_f32(op, a)?;
        let fb = super::float_f32(op, b)?;
        let mut out = Tensor::empty(&shape, DType::F32, a.device())?;
        if let Some(l) = a.device().launcher() {
            dispatch::binary(l.as_ref(), op, &fa, &fb, &out)?;
        } else if let (Some(da), Some(db), Some(dst)) = (
            fa.storage_as::<f32>(),
            fb.storage_as::<f32>(),
            out.data_mut::<f32>(),
        ) {
            let la = fa.layout().broadcast_to(&shape)?;
            let lb = fb.layout().broadcast_to(&shape)?;
            let inner = shape.last().copied().unwrap_or(1).max(1);
            let sa = la.strides().last().copied().unwrap_or(0);
            let sb = lb.strides().last().copied().unwrap_or(0);
            crate::parallel::run(|| {
                dst.par_chunks_mut(inner * ROWS_PER_TASK)
                    .enumerate()
                    .for_each(|(task, chunk)| {
                        for (r, row) in chunk.chunks_mut(inner).enumerate() {
                            let index = task * ROWS_PER_TASK + r;
                            let (ba, bb) = (la.row_start(index), lb.row_start(index));
                            if sa == 1 && sb == 1 {
                                let (ra, rb) = (&da[ba..ba + inner], &db[bb..bb + inner]);
                                simd::zip_map(row, ra, rb, &f);
                            } else if sa == 1 && sb == 0 {
                                let y = db[bb];
                                simd::map(row, &da[ba..ba + inner], |x| f(x, y));
                            } else if sa == 0 && sb == 1 {
                                let x = da[ba];
                                simd::map(row, &db[bb..bb + inner], |y| f(x, y));
                            } else {
                                for (j, o) in row.iter_mut().enumerate() {
                                    *o = f(da[ba + j * sa], db[bb + j * sb]);
                                }
                            }
                        }
                    });
            });
        }
        out.to_dtype(dtype)
    })
}

/// Applies `f` to every element (SIMD-dispatched through [`simd::map`], the same
/// bits on every path); float dtypes are kept. On a GPU the elementwise kernel named `op`
/// runs.
pub fn unary(op: &'static str, x: &Tensor, f: impl Fn(f32) -> f32 + Sync) -> Result<Tensor> {
    unary_on(op, x, f, |l, input, out| dispatch::unary(l, op, input, out))
}

/// [`unary`] with the GPU side given as `gpu(launcher, f32 input, f32 output)`.
fn unary_on(
    op: &'static str,
    x: &Tensor,
    f: impl Fn(f32) -> f32 + Sync,
    gpu: impl FnOnce(&dyn Launcher, &Tensor, &Tensor) -> Result<()>,
) -> Result<Tensor> {
    unary_slices(op, x, |d, s| simd::map(d, s, &f), gpu)
}

/// [`unary_on`] with the host side as a kernel over slices, `kernel(dst, src)`.
fn unary_slices(
    op: &'static str,
    x: &Tensor,
    kernel: impl Fn(&mut [f32], &[f32]) + Sync,
    gpu: impl FnOnce(&dyn Launcher, &Tensor, &Tensor) -> Result<()>,
) -> Result<Tensor> {
    crate::profile::op(op, &[x], || {
        let input = super::float_f32(op, x)?.to_f32_contiguous()?;
        let mut out = Tensor::empty(x.shape(), DType::F32, x.device())?;
        if let Some(l) = x.device().launcher() {
            gpu(l.as_ref(), &input, &out)?;
        } else if let (Some(src), Some(dst)) = (input.as_slice::<f32>(), out.data_mut::<f32>()) {
            crate::parallel::run(|| {
                dst.par_chunks_mut(1 << 14)
                    .zip(src.par_chunks(1 << 14))
                    .for_each(|(d, s)| kernel(d, s));
            });
        }
        out.to_dtype(x.dtype())
    })
}

/// The GELU of PyTorch's `approximate="tanh"` (libm-free, see [`activation`]).
pub fn gelu_tanh_scalar(x: f32) -> f32 {
    activation::gelu_tanh(x)
}

/// The exact (erf) GELU.
pub fn gelu_erf_scalar(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// SiLU (x · sigmoid(x), libm-free, see [`activation`]).
pub fn silu_scalar(x: f32) -> f32 {
    activation::silu(x)
}

impl Tensor {
    /// `self + other` with broadcasting.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        binary("add", self, other, |a, b| a + b)
    }
    /// `self - other` with broadcasting.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        binary("sub", self, other, |a, b| a - b)
    }
    /// `self * other` with broadcasting.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        binary("mul", self, other, |a, b| a * b)
    }
    /// `self / other` with broadcasting.
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        binary("div", self, other, |a, b| a / b)
    }
    /// `self + value`.
    pub fn add_scalar(&self, value: f32) -> Result<Tensor> {
        unary_on(
            "add_scalar",
            self,
            move |x| x + value,
            |l, i, o| dispatch::map2(l, "affine_f32", i, o, 1.0, value),
        )
    }
    /// `self * value`.
    pub fn mul_scalar(&self, value: f32) -> Result<Tensor> {
        unary_on(
            "mul_scalar",
            self,
            move |x| x * value,
            |l, i, o| dispatch::map2(l, "affine_f32", i, o, value, 0.0),
        )
    }
    /// `self * scale + shift`.
    pub fn affine(&self, scale: f32, shift: f32) -> Result<Tensor> {
        unary_on(
            "affine",
            self,
            move |x| x * scale + shift,
            |l, i, o| dispatch::map2(l, "affine_f32", i, o, scale, shift),
        )
    }
    /// `e^x`.
    pub fn exp(&self) -> Result<Tensor> {
        unary("exp", self, f32::exp)
    }
    /// `sin x`.
    pub fn sin(&self) -> Result<Tensor> {
        unary("sin", self, f32::sin)
    }
    /// `cos x`.
    pub fn cos(&self) -> Result<Tensor> {
        unary("cos", self, f32::cos)
    }
    /// `√x`.
    pub fn sqrt(&self) -> Result<Tensor> {
        unary("sqrt", self, f32::sqrt)
    }
    /// `1/√x`.
    pub fn rsqrt(&self) -> Result<Tensor> {
        unary("rsqrt", self, |x| 1.0 / x.sqrt())
    }
    /// `x · sigmoid(x)`.
    pub fn silu(&self) -> Result<Tensor> {
        unary("silu", self, activation::silu)
    }
    /// `tanh x`.
    pub fn tanh(&self) -> Result<Tensor> {
        unary("tanh", self, f32::tanh)
    }
    /// `max(x, 0)` (NaN stays NaN, as in PyTorch).
    pub fn relu(&self) -> Result<Tensor> {
        self.clamp(0.0, f32::INFINITY)
    }
    /// GELU with the tanh approximation (PyTorch `approximate="tanh"`).
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        unary_slices("gelu_tanh", self, activation::gelu_tanh_into, |l, i, o| {
            dispatch::unary(l, "gelu_tanh", i, o)
        })
    }
    /// Exact GELU with erf.
    pub fn gelu_erf(&self) -> Result<Tensor> {
        unary("gelu_erf", self, gelu_erf_scalar)
    }
    /// Every element clamped to `[min, max]`.
    pub fn clamp(&self, min: f32, max: f32) -> Result<Tensor> {
        if min > max {
            return Err(TensorError::shape(
                "clamp",
                format!("min {min} is above max {max}"),
            ));
        }
        unary_on(
            "clamp",
            self,
            move |x| x.clamp(min, max),
            |l, i, o| dispatch::map2(l, "clamp_f32", i, o, min, max),
        )
    }
}
