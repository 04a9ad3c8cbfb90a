//! SiLU over f32 slices without libm, built on the branch-free [`fast_exp`], so the loops
//! auto-vectorise; they are compiled for AVX-512 and AVX2 as well as the baseline and
//! picked at run time. The tanh-GELU is [`super::gelu`]'s (re-exported here). Every
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

#[inline(always)]
fn map_impl(dst: &mut [f32], src: &[f32], f: impl Fn(f32) -> f32) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f(s);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn map_avx512(dst: &mut [f32], src: &[f32], f: impl Fn(f32) -> f32) {
    map_impl(dst, src, f);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn map_avx2(dst: &mut [f32], src: &[f32], f: impl Fn(f32) -> f32) {
    map_impl(dst, src, f);
}

/// `dst[i] = f(src[i])` over the shorter of the two, at the widest SIMD the CPU has.
#[inline]
pub fn map(dst: &mut [f32], src: &[f32], f: impl Fn(f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked at run time just above.
            return unsafe { map_avx512(dst, src, f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked at run time just above.
            return unsafe { map_avx2(dst, src, f) };
        }
    }
    map_impl(dst, src, f);
}

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
            map_in_place(&mut data[r * ldc..r * ldc + w], silu);
        }
    }
}

#[inline(always)]
fn map_in_place_impl(buf: &mut [f32], f: impl Fn(f32) -> f32) {
    for x in buf.iter_mut() {
        *x = f(*x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn map_in_place_avx512(buf: &mut [f32], f: impl Fn(f32) -> f32) {
    map_in_place_impl(buf, f);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn map_in_place_avx2(buf: &mut [f32], f: impl Fn(f32) -> f32) {
    map_in_place_impl(buf, f);
}

/// `buf[i] = f(buf[i])` at the widest SIMD the CPU has (the bits of [`map`]).
#[inline]
pub fn map_in_place(buf: &mut [f32], f: impl Fn(f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked at run time just above.
            return unsafe { map_in_place_avx512(buf, f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked at run time just above.
            return unsafe { map_in_place_avx2(buf, f) };
        }
    }
    map_in_place_impl(buf, f);
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

    #[test]
    fn every_simd_path_gives_the_baseline_bits() {
        let src: Vec<f32> = (0..1037).map(|i| (i as f32 - 500.0) * 0.037).collect();
        let mut base = vec![0.0; src.len()];
        map_impl(&mut base, &src, gelu_tanh);
        let mut fast = vec![0.0; src.len()];
        map(&mut fast, &src, gelu_tanh);
        assert_eq!(
            base.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            fast.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}
