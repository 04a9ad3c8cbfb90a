//! How far two tensors' values are apart: the one measure the golden tests, `vae decode
//! --compare` and the bf16 checks use (largest absolute difference, element by element),
//! and the relative L2 error quantized products are held to.

use crate::error::{Result, TensorError};
use crate::tensor::Tensor;

/// The largest |a − b| over two slices of one length (0 for empty ones); `None` when
/// their lengths differ.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> Option<f32> {
    (a.len() == b.len()).then(|| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    })
}

/// [`max_abs_diff`] over the reference's scale: divided by the largest |b|, or by 1 when
/// that is smaller (a tolerance for values far from 1); `None` when the lengths differ.
pub fn scaled_abs_diff(a: &[f32], b: &[f32]) -> Option<f32> {
    let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    max_abs_diff(a, b).map(|d| d / scale)
}

/// The largest |a − b| over two tensors of one shape, read as f32 (any dtype, any
/// device); an error naming both shapes when they differ.
pub fn max_abs_error(a: &Tensor, b: &Tensor) -> Result<f32> {
    if a.shape() != b.shape() {
        return Err(TensorError::shape(
            "max_abs_error",
            format!("shapes {:?} and {:?} differ", a.shape(), b.shape()),
        ));
    }
    let (x, y) = (a.to_f32_vec()?, b.to_f32_vec()?);
    Ok(max_abs_diff(&x, &y).unwrap_or(f32::INFINITY))
}

/// `‖a − b‖₂ / ‖b‖₂` over two slices of one length, in f64 (0 when both are zero);
/// `None` when their lengths differ: the measure quantization errors are stated in.
pub fn relative_l2_diff(a: &[f32], b: &[f32]) -> Option<f64> {
    (a.len() == b.len()).then(|| {
        let (mut err, mut norm) = (0f64, 0f64);
        for (x, y) in a.iter().zip(b) {
            err += (f64::from(*x) - f64::from(*y)).powi(2);
            norm += f64::from(*y).powi(2);
        }
        if err == 0.0 {
            0.0
        } else {
            (err / norm).sqrt()
        }
    })
}

/// [`relative_l2_diff`] over two tensors of one shape, read as f32; an error naming both
/// shapes when they differ.
pub fn relative_l2(a: &Tensor, b: &Tensor) -> Result<f64> {
    if a.shape() != b.shape() {
        return Err(TensorError::shape(
            "relative_l2",
            format!("shapes {:?} and {:?} differ", a.shape(), b.shape()),
        ));
    }
    let (x, y) = (a.to_f32_vec()?, b.to_f32_vec()?);
    Ok(relative_l2_diff(&x, &y).unwrap_or(f64::INFINITY))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;

    #[test]
    fn the_largest_difference_is_found_and_other_shapes_are_refused() {
        assert_eq!(
            max_abs_diff(&[1.0, -2.0, 3.0], &[1.5, -2.0, 0.0]),
            Some(3.0)
        );
        assert_eq!(max_abs_diff(&[], &[]), Some(0.0));
        assert_eq!(max_abs_diff(&[1.0], &[]), None);
        assert_eq!(scaled_abs_diff(&[4.0, 0.0], &[8.0, 0.0]), Some(0.5));
        assert_eq!(scaled_abs_diff(&[0.5], &[0.25]), Some(0.25));
        let dev = Device::cpu().unwrap();
        let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &dev).unwrap();
        let b = Tensor::from_slice(&[1.0f32, 2.5, 3.0, 4.0], &[2, 2], &dev).unwrap();
        assert_eq!(max_abs_error(&a, &b).unwrap(), 0.5);
        let c = Tensor::from_slice(&[1.0f32, 2.5, 3.0, 4.0], &[4], &dev).unwrap();
        assert!(max_abs_error(&a, &c)
            .unwrap_err()
            .to_string()
            .contains("[2, 2]"));
    }
}
