//! Turning decoded video into 8-bit pixels.

use rayon::prelude::*;

use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// One value in [−1, 1] as a pixel: `round(clamp((x + 1) / 2, 0, 1) · 255)`, ties to even
/// as `torch.round` does.
pub fn to_pixel(x: f32) -> u8 {
    (((x + 1.0) / 2.0).clamp(0.0, 1.0) * 255.0).round_ties_even() as u8
}

impl Tensor {
    /// Quantises values in [−1, 1] to u8 pixels (same shape).
    pub fn to_pixels(&self) -> Result<Tensor> {
        let input = self.to_f32_contiguous()?;
        let mut out = Tensor::empty(self.shape(), DType::U8, self.device())?;
        if let Some(l) = self.device().launcher() {
            crate::ops::dispatch::to_pixels(l.as_ref(), &input, &out)?;
        } else if let (Some(src), Some(dst)) = (input.as_slice::<f32>(), out.data_mut::<u8>()) {
            crate::parallel::run(|| {
                dst.par_chunks_mut(1 << 14)
                    .zip(src.par_chunks(1 << 14))
                    .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, &s)| *d = to_pixel(s)));
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixels_clamp_and_round_half_to_even() {
        assert_eq!(to_pixel(-2.0), 0);
        assert_eq!(to_pixel(1.5), 255);
        assert_eq!(to_pixel(0.0), 128); // 127.5 → 128 (even)
        assert_eq!(to_pixel(-1.0), 0);
        assert_eq!(to_pixel(1.0), 255);
    }
}
