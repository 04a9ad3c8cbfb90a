//! Test support: a deterministic random source, f64 reference helpers and one tolerance
//! check used by every op test.
#![allow(dead_code)]

use headroom_tensor::{DType, Device, Tensor};

/// A tiny xorshift generator: reproducible inputs without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale).collect()
    }
}

pub fn cpu() -> Device {
    Device::cpu().expect("cpu device")
}

/// A random f32 tensor of `shape` in [−scale, scale].
pub fn rand(rng: &mut Rng, shape: &[usize], scale: f32, device: &Device) -> (Tensor, Vec<f64>) {
    let n: usize = shape.iter().product();
    let v = rng.vec(n, scale);
    let t = Tensor::from_slice(&v, shape, device).unwrap();
    (t, v.into_iter().map(f64::from).collect())
}

/// Per-dtype tolerance: |actual − expected| ≤ tol · (1 + |expected|).
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::BF16 => 1e-2,
        DType::F16 => 2e-3,
        DType::U8 | DType::I64 | DType::I8 => 0.0,
        DType::F8E4M3 | DType::F8E5M2 => 0.125,
    }
}

#[track_caller]
pub fn assert_close(actual: &Tensor, expected: &[f64], tol: f64) {
    let got = actual.to_f32_vec().unwrap();
    assert_eq!(got.len(), expected.len(), "length");
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        let err = (f64::from(g) - e).abs();
        assert!(
            err <= tol * (1.0 + e.abs()),
            "element {i}: got {g}, expected {e} (tol {tol})"
        );
    }
}

/// Row-major index → multi-index.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        idx[a] = i % shape[a];
        i /= shape[a];
    }
    idx
}

/// Multi-index → row-major index.
pub fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}
