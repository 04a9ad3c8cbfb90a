//! Seeded normal noise from a counter-based generator: element `i` of a stream depends
//! only on `(seed, offset + i)`, so the numbers are the same on any thread count and any
//! chunking of the stream.

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

/// The standard normal value at position `counter` of stream `seed` (Box–Muller over a
/// hashed counter pair, computed in f64).
pub fn normal_at(seed: u64, counter: u64) -> f32 {
    let pair = counter / 2;
    let bits = splitmix64(splitmix64(seed) ^ pair.wrapping_mul(0xD1B5_4A32_D192_ED03));
    let u1 = ((bits >> 32) as f64 + 1.0) / 4_294_967_296.0; // (0, 1]: ln is finite
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
        if let Some(dst) = out.data_mut::<f32>() {
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

    #[test]
    fn seeds_give_different_streams() {
        assert_ne!(normal_at(1, 0), normal_at(2, 0));
        assert_ne!(normal_at(1, 0), normal_at(1, 1));
    }
}
