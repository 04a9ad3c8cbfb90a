//! The one deterministic random source of the kernel unit tests (xorshift64*), so every
//! kernel test draws inputs the same way without a dependency.

/// xorshift64*: uniform floats from a 64-bit state (which must not be 0).
pub(crate) struct TestRng(pub u64);

impl TestRng {
    fn next_bits(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40
    }

    /// A uniform float in [lo, hi).
    pub(crate) fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * (self.next_bits() as f32 / (1u64 << 24) as f32)
    }

    /// A uniform float in [−1, 1).
    pub(crate) fn next_f32(&mut self) -> f32 {
        self.uniform(-1.0, 1.0)
    }

    /// `n` uniform floats in [−1, 1).
    pub(crate) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
    }
}

/// `n` uniform floats in [−1, 1) from `seed`.
pub(crate) fn random(n: usize, seed: u64) -> Vec<f32> {
    TestRng(seed.max(1)).vec(n)
}
