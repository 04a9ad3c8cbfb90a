//! SiLU over f32 slices without libm, built on the branch-free `fast_exp`, so the loops
//! auto-vectorise; they run through [`super::simd`]'s builds for the selected path. The
//! tanh-GELU is [`super::gelu`]'s (re-exported here). Every
//! version performs the same IEEE operations in the same order (Rust never fuses a
//! multiply and an add on its own), so the bits do not depend on the CPU path, only the
//! speed does.

use super::softmax::fast_exp;

/// SiLU, `x · sigmoid(x) = x / (1 + e^−x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + fast_exp(-x))
}

pub use super::gelu::{gelu_tanh, gelu_tanh_into};

/// An activation a producer can apply to its output as it writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// [`gelu_tanh`].
    GeluTanh,
    /// [`silu`].
    Silu,
}

/// `x += bias` (per column) then `activation`, on each of `h` rows of `w` values that
/// start `ldc` apart in `data`: a GEMM epilogue over one finished block, with the bits of
/// the bias add followed by the activation's own function ([`gelu_tanh`], [`silu`]).
pub fn bias_activation_rows(
    data: &mut [f32],
    ldc: usize,
    h: usize,
    w: usize,
    bias: Option<&[f32]>,
    activation: Option<Activation>,
) {
    let gelu = activation == Some(Activation::GeluTanh);
    super::gelu::bias_gelu_rows(data, ldc, h, w, bias, gelu);
    if activation == Some(Activation::Silu) {
        for r in 0..h {
            super::simd::map_in_place(&mut data[r * ldc..r * ldc + w], silu);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_match_f64_references() {
        let (mut worst_silu, mut worst_gelu) = (0f64, 0f64);
        for i in -40_000..=40_000 {
            let x = i as f32 * 1e-3;
            let xd = f64::from(x);
            let silu_ref = xd / (1.0 + (-xd).exp());
            let u = 0.797_884_560_802_865_4 * (xd + 0.044_715 * xd * xd * xd);
            let gelu_ref = 0.5 * xd * (1.0 + u.tanh());
            worst_silu = worst_silu.max((f64::from(silu(x)) - silu_ref).abs());
            worst_gelu = worst_gelu.max((f64::from(gelu_tanh(x)) - gelu_ref).abs());
        }
        assert!(worst_silu < 2e-6, "silu {worst_silu}");
        assert!(worst_gelu < 2e-6, "gelu {worst_gelu}");
        assert!(silu(-1e4).abs() < 1e-30);
        assert_eq!(gelu_tanh(1e4), 1e4);
    }
}
