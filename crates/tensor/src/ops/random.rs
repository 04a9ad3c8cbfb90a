//! Seeded normal noise from a counter-based generator: element `i` of a stream depends
//! only on `(seed, offset + i)`, so the numbers are the same on any thread count and any
//! chunking of the stream.
//!
//! The f64 math calls no library function: `ln`, `sin` and `cos` are the polynomial code
//! below ([`portable_ln`], [`portable_sincos_turns`]) built from `+ − × ÷ √` only, each
//! IEEE correctly rounded, in a fixed order with no fused multiply-add. So the numbers
//! do not depend on the platform's libm, and the CUDA kernel (`cuda/kernels/noise.cu`,
//! the same code compiled with `--fmad=false`) reproduces them bit for bit.

use rayon::prelude::*;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::layout::numel;
use crate::tensor::Tensor;

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// ln 2 split in a high part with trailing zero bits (so `k · LN2_HI` is exact for
/// |k| < 2^11) and the rest.
const LN2_HI: f64 = 0.693_147_180_369_123_8;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;

/// The polynomial with coefficients `c` (lowest power first) at `z` by Horner: innermost
/// first, each step one multiply and
/// one add (no fused multiply-add): the same operations in the same order as the nested
/// expression the CUDA kernel writes out.
fn horner(z: f64, c: &[f64]) -> f64 {
    c.iter()
        .rev()
        .copied()
        .reduce(|acc, ci| ci + z * acc)
        .unwrap_or_default()
}

/// Natural log of a finite `x > 0` to within an ulp, from basic operations only.
///
/// `x = 2^k · m` with `m` in `[√½, √2)`; with `f = m − 1` and `s = f / (2 + f)`,
/// `ln m = 2·atanh(s) = f − f²/2 + s·(f²/2 + R)` where `R = Σ 2 s^(2i) / (2i + 1)`
/// (`|s| ≤ 0.1716`, so ten terms leave a truncation far below an ulp). The `k · ln 2`
/// part is added in two pieces so that it rounds once.
pub fn portable_ln(x: f64) -> f64 {
    let mut x = x;
    let mut bits = x.to_bits() as i64;
    let mut k: i64 = 0;
    if (bits >> 52) == 0 {
        // Subnormal: scale into the normal range first.
        x *= 18_014_398_509_481_984.0; // 2^54
        bits = x.to_bits() as i64;
        k = -54;
    }
    k += ((bits >> 52) & 0x7ff) - 1023;
    bits = (bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000;
    let mut m = f64::from_bits(bits as u64);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        k += 1;
    }
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    const LN_R: &[f64] = &[
        0.666_666_666_666_666_6,
        0.4,
        0.285_714_285_714_285_7,
        0.222_222_222_222_222_2,
        0.181_818_181_818_181_82,
        0.153_846_153_846_153_85,
        0.133_333_333_333_333_33,
        0.117_647_058_823_529_41,
        0.105_263_157_894_736_84,
        0.095_238_095_238_095_23,
    ];
    let r = z * horner(z, LN_R);
    let hfsq = 0.5 * f * f;
    let dk = k as f64;
    dk * LN2_HI + (f - (hfsq - (s * (hfsq + r) + dk * LN2_LO)))
}

/// `(sin, cos)` of `2π·t` for `|t| ≤ 1/8` (so `|x| ≤ π/4`): Taylor series to `x^21`.
fn sincos_small(t: f64) -> (f64, f64) {
    const TWO_PI_HI: f64 = std::f64::consts::TAU;
    const TWO_PI_LO: f64 = 2.449_293_598_294_706_4e-16;
    let x = t * TWO_PI_HI + t * TWO_PI_LO;
    let z = x * x;
    const SIN: &[f64] = &[
        -1.0 / 6.0,
        1.0 / 120.0,
        -1.0 / 5040.0,
        1.0 / 362_880.0,
        -1.0 / 39_916_800.0,
        1.0 / 6_227_020_800.0,
        -1.0 / 1_307_674_368_000.0,
        1.0 / 355_687_428_096_000.0,
        -1.0 / 121_645_100_408_832_000.0,
        1.0 / 51_090_942_171_709_440_000.0,
    ];
    const COS: &[f64] = &[
        1.0 / 24.0,
        -1.0 / 720.0,
        1.0 / 40_320.0,
        -1.0 / 3_628_800.0,
        1.0 / 479_001_600.0,
        -1.0 / 87_178_291_200.0,
        1.0 / 20_922_789_888_000.0,
        -1.0 / 6_402_373_705_728_000.0,
        1.0 / 2_432_902_008_176_640_000.0,
        -1.0 / 1_124_000_727_777_607_680_000.0,
    ];
    let (ps, pc) = (horner(z, SIN), horner(z, COS));
    (x + x * (z * ps), 1.0 - (0.5 * z - z * (z * pc)))
}

/// `(sin, cos)` of `2π·n/2^32`: the quadrant comes exactly from the top bits of `n`, the
/// rest is folded into `[−1/8, 1/8]` of a turn.
pub fn portable_sincos_turns(n: u32) -> (f64, f64) {
    let mut q = n >> 30;
    let rem = n & 0x3fff_ffff;
    let mut t = f64::from(rem) / 4_294_967_296.0;
    if rem >= 0x2000_0000 {
        t -= 0.25;
        q += 1;
    }
    let (s, c) = sincos_small(t);
    match q & 3 {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
}

/// The standard normal value at position `counter` of stream `seed` (Box–Muller over a
/// hashed counter pair, computed in f64 with [`portable_ln`] and
/// [`portable_sincos_turns`]).
pub fn normal_at(seed: u64, counter: u64) -> f32 {
    let pair = counter / 2;
    let bits = splitmix64(splitmix64(seed) ^ pair.wrapping_mul(0xD1B5_4A32_D192_ED03));
    let u1 = ((bits >> 32) as f64 + 1.0) / 4_294_967_296.0; // (0, 1]: ln is finite
    let r = (-2.0 * portable_ln(u1)).sqrt();
    let (s, c) = portable_sincos_turns((bits & 0xFFFF_FFFF) as u32);
    let z = if counter.is_multiple_of(2) {
        r * c
    } else {
        r * s
    };
    z as f32
}

impl Tensor {
    /// Standard normal noise of `shape`: element `i` is [`normal_at`]`(seed, offset + i)`.
    pub fn randn(
        shape: &[usize],
        seed: u64,
        offset: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let mut out = Tensor::empty(shape, DType::F32, device)?;
        if let Some(l) = device.launcher() {
            crate::ops::dispatch::randn(l.as_ref(), &out, seed, offset)?;
        } else if let Some(dst) = out.data_mut::<f32>() {
            crate::parallel::run(|| {
                dst.par_chunks_mut(1 << 14)
                    .enumerate()
                    .for_each(|(c, chunk)| {
                        let base = offset + (c << 14) as u64;
                        for (i, v) in chunk.iter_mut().enumerate() {
                            *v = normal_at(seed, base + i as u64);
                        }
                    });
            });
        }
        debug_assert_eq!(out.numel(), numel(shape));
        out.to_dtype(dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_has_unit_moments() {
        let n = 200_000u64;
        let values: Vec<f64> = (0..n).map(|i| f64::from(normal_at(42, i))).collect();
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    /// The value the generator had when it called the platform's libm (f64 `ln`,
    /// `cos`, `sin` of `2π·u2`).
    fn libm_normal_at(seed: u64, counter: u64) -> f32 {
        let pair = counter / 2;
        let bits = splitmix64(splitmix64(seed) ^ pair.wrapping_mul(0xD1B5_4A32_D192_ED03));
        let u1 = ((bits >> 32) as f64 + 1.0) / 4_294_967_296.0;
        let u2 = (bits & 0xFFFF_FFFF) as f64 / 4_294_967_296.0;
        let r = (-2.0 * u1.ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * u2;
        let z = if counter.is_multiple_of(2) {
            r * angle.cos()
        } else {
            r * angle.sin()
        };
        z as f32
    }

    #[test]
    fn portable_math_is_within_an_ulp_of_libm() {
        let ulps = |a: f64, b: f64| (a.to_bits() as i64 - b.to_bits() as i64).abs();
        let mut worst = 0;
        for i in 0..200_000u64 {
            let x = splitmix64(i);
            let u1 = ((x >> 32) as f64 + 1.0) / 4_294_967_296.0;
            worst = worst.max(ulps(portable_ln(u1), u1.ln()));
            let n = x as u32;
            let angle = 2.0 * std::f64::consts::PI * (f64::from(n) / 4_294_967_296.0);
            let (s, c) = portable_sincos_turns(n);
            // Absolute: the libm path rounds 2π·u first, an error of up to half an ulp
            // of 2π (4.4e-16) that the exact quadrant reduction does not make.
            assert!((s - angle.sin()).abs() < 1e-15, "sin {n}");
            assert!((c - angle.cos()).abs() < 1e-15, "cos {n}");
        }
        assert!(worst <= 1, "ln differs from libm by {worst} ulps");
        assert_eq!(portable_ln(1.0), 0.0);
        let tiny = f64::from_bits(1); // subnormal
        assert!(ulps(portable_ln(tiny), tiny.ln()) <= 1);
    }

    #[test]
    fn portable_noise_equals_the_libm_noise_on_a_million_values() {
        let differ = (0..1_000_000u64)
            .filter(|&i| normal_at(7, i).to_bits() != libm_normal_at(7, i).to_bits())
            .count();
        assert_eq!(differ, 0);
    }

    #[test]
    fn seeds_give_different_streams() {
        assert_ne!(normal_at(1, 0), normal_at(2, 0));
        assert_ne!(normal_at(1, 0), normal_at(1, 1));
    }
}
