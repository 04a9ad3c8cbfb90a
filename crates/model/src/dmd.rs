//! The few-step DMD schedule with shift (STEPWISE.md B2): `labels = 1000·(1 − k/steps)`,
//! `σ_k = s·b_k / ((1 − b_k) + s·b_k)` with `b_k = label/1000`, timestep `t_k = 1000·σ_k`.
//! A step turns a velocity into `x0 = x_t − σ·v` and re-noises to the next σ with fresh
//! noise: `x = (1 − σ')·x0 + σ'·ε`.

use headroom_tensor::Tensor;

use crate::error::{ModelError, Result};

/// Sigmas and timesteps of one block's denoising steps.
#[derive(Debug, Clone, PartialEq)]
pub struct DmdSchedule {
    /// σ per step, from 1 down.
    pub sigmas: Vec<f64>,
    /// Model timestep per step (`1000·σ`).
    pub timesteps: Vec<f32>,
}

impl DmdSchedule {
    /// The schedule of `steps` steps shifted by `shift` (> 0).
    pub fn shifted(steps: usize, shift: f64) -> Result<Self> {
        if steps == 0 {
            return Err(ModelError::input(
                "dmd schedule",
                "steps must be at least 1",
            ));
        }
        if let Some(rule) = flow_shift_error(shift) {
            return Err(ModelError::input(
                "dmd schedule",
                format!("flow_shift {rule}"),
            ));
        }
        let sigmas: Vec<f64> = (0..steps)
            .map(|k| {
                let b = 1.0 - k as f64 / steps as f64;
                shift * b / ((1.0 - b) + shift * b)
            })
            .collect();
        let timesteps = sigmas.iter().map(|s| (1000.0 * s) as f32).collect();
        Ok(Self { sigmas, timesteps })
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.sigmas.len()
    }

    /// Whether the schedule has no steps (never, by construction).
    pub fn is_empty(&self) -> bool {
        self.sigmas.is_empty()
    }
}

/// `x0 = x_t − σ·v`.
pub fn x0_from_velocity(x: &Tensor, v: &Tensor, sigma: f64) -> Result<Tensor> {
    Ok(x.sub(&v.mul_scalar(sigma as f32)?)?)
}

/// The rule a flow shift breaks, if any (it must be finite and > 0): the one check of a
/// config's, a request's and a client's shift.
pub fn flow_shift_error(shift: f64) -> Option<String> {
    (!(shift.is_finite() && shift > 0.0))
        .then(|| format!("must be a finite number > 0, got {shift}"))
}

/// The rule a camera guidance scale breaks, if any (it must be finite and ≥ 0): the one
/// check of a config's, a request's and a client's scale.
pub fn guidance_scale_error(scale: f64) -> Option<String> {
    (!(scale.is_finite() && scale >= 0.0))
        .then(|| format!("must be a finite number ≥ 0, got {scale}"))
}

/// Camera guidance: `v_still + g·(v_keys − v_still)`, the velocity pushed away from the
/// still camera's by scale `g` (1 gives `v_keys`).
pub fn guided_velocity(v_keys: &Tensor, v_still: &Tensor, scale: f64) -> Result<Tensor> {
    Ok(v_still.add(&v_keys.sub(v_still)?.mul_scalar(scale as f32)?)?)
}

/// `(1 − σ)·x0 + σ·ε`.
pub fn renoise(x0: &Tensor, noise: &Tensor, sigma: f64) -> Result<Tensor> {
    Ok(x0
        .mul_scalar((1.0 - sigma) as f32)?
        .add(&noise.mul_scalar(sigma as f32)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shift_five_gives_the_reference_timesteps() {
        let s = DmdSchedule::shifted(4, 5.0).unwrap();
        let expected = [1000.0, 937.5, 833.333_3, 625.0];
        for (t, e) in s.timesteps.iter().zip(expected) {
            assert!((t - e).abs() < 1e-3, "{t} vs {e}");
        }
        let s = DmdSchedule::shifted(4, 3.0).unwrap();
        assert_eq!(s.timesteps, [1000.0, 900.0, 750.0, 500.0]);
        let s = DmdSchedule::shifted(4, 10.0).unwrap();
        assert!((s.sigmas[1] - 0.967_74).abs() < 1e-5 && (s.sigmas[3] - 0.769_23).abs() < 1e-5);
    }

    #[test]
    fn bad_schedules_are_refused() {
        assert!(DmdSchedule::shifted(0, 5.0).is_err());
        assert!(DmdSchedule::shifted(4, 0.0)
            .unwrap_err()
            .to_string()
            .contains("flow_shift"));
        assert!(DmdSchedule::shifted(4, f64::NAN).is_err());
    }

    #[test]
    fn guidance_scales_the_velocity_away_from_the_still_cameras() {
        let cpu = headroom_tensor::Device::cpu().unwrap();
        let t = |v: &[f32]| Tensor::from_slice(v, &[2], &cpu).unwrap();
        let (keys, still) = (t(&[1.0, -2.0]), t(&[0.5, 1.0]));
        let at = |g| {
            guided_velocity(&keys, &still, g)
                .unwrap()
                .to_f32_vec()
                .unwrap()
        };
        assert_eq!(at(1.0), [1.0, -2.0]);
        assert_eq!(at(0.0), [0.5, 1.0]);
        assert_eq!(at(2.0), [1.5, -5.0]);
    }
}
