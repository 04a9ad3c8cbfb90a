//! Wan's 3-axis rotary position embedding (WAN.md §3.4) with interleaved adjacent pairs.
//!
//! A head vector of `head_dim` elements is `head_dim / 2` pairs `(2j, 2j+1)`. The pairs
//! are split over three axes: the first `t/2` pairs rotate by the frame index f, the
//! next `h/2` by the row y and the last `w/2` by the column x, with
//! `h = w = 2·floor(head_dim/6)` and `t = head_dim − h − w`. Within an axis of `d` dims,
//! pair `j` rotates by `p · theta^(−2j/d)`; angles and their cos/sin are computed in f64
//! and rounded to f32 once, when the table is built. Applying the rotation is then a
//! streaming pass over `[tokens, heads, head_dim]`, parallel over tokens, touching no
//! memory but the input and the table.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;

use crate::parallel;

/// Precomputed cos/sin of every (position, pair) for each of the three axes.
///
/// This is the one kernel-side object that owns heap memory: it is small
/// (`max_positions · head_dim` floats), built once per model and read-only afterwards.
/// On a GPU device its tables (and the last positions used) are uploaded once and kept
/// with it ([`RopeCache`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTable {
    head_dim: usize,
    max_positions: usize,
    /// Dims of the t, h and w axes (each even; they sum to `head_dim`).
    axis_dims: [usize; 3],
    /// Per axis a `[max_positions, axis_dim/2]` block of cosines, axes concatenated.
    cos: Vec<f32>,
    /// Same layout as `cos`, for sines.
    sin: Vec<f32>,
    /// The tables and positions on the GPU device last used (not part of the value).
    device_copies: RopeCache,
}

impl RopeTable {
    /// Tables for `head_dim` (split t/h/w per WAN.md) for positions `0..max_positions` per axis.
    pub fn new(head_dim: usize, max_positions: usize, theta: f64) -> Self {
        debug_assert!(head_dim.is_multiple_of(2), "head_dim must be even");
        debug_assert!(theta > 0.0, "theta must be positive");
        let hw = 2 * (head_dim / 6);
        let axis_dims = [head_dim - 2 * hw, hw, hw];
        let len = max_positions * (head_dim / 2);
        let mut cos = Vec::with_capacity(len);
        let mut sin = Vec::with_capacity(len);
        for dim in axis_dims {
            let pairs = dim / 2;
            for pos in 0..max_positions {
                for j in 0..pairs {
                    // diffusers: freqs = 1 / theta^(arange(0, dim, 2) / dim) in float64,
                    // angle = pos · freq in float64, cos/sin in float64, then .float().
                    let freq = 1.0 / theta.powf((2 * j) as f64 / dim as f64);
                    let angle = pos as f64 * freq;
                    cos.push(angle.cos() as f32);
                    sin.push(angle.sin() as f32);
                }
            }
        }
        Self {
            head_dim,
            max_positions,
            axis_dims,
            cos,
            sin,
            device_copies: Default::default(),
        }
    }

    /// Dims of the t, h and w axes, in pair order.
    pub fn axis_dims(&self) -> [usize; 3] {
        self.axis_dims
    }

    /// The head dim the table was built for.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Positions per axis the table covers (`0..max_positions`).
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// The (cos, sin) of pair `j` of axis `axis` at position `pos`.
    pub fn cos_sin(&self, axis: usize, pos: usize, j: usize) -> (f32, f32) {
        let (cos, sin) = self.axis_rows(axis, pos);
        (cos[j], sin[j])
    }

    /// The whole cosine and sine tables (per axis `[max_positions, pairs]`, axes in order).
    pub(crate) fn tables(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }

    /// The copies of the tables on GPU devices.
    pub(crate) fn device_copies(&self) -> &RopeCache {
        &self.device_copies
    }

    /// On a GPU device, keeps the tables and the last positions uploaded while the scope
    /// lives (one upload for every rotation of a forward) and frees them when it closes.
    pub fn device_scope(&self) -> RopeScope<'_> {
        self.device_copies.scope()
    }

    /// The cosines and sines of all pairs of axis `axis` at position `pos`.
    fn axis_rows(&self, axis: usize, pos: usize) -> (&[f32], &[f32]) {
        assert!(pos < self.max_positions, "rope position beyond the table");
        let before: usize = self.axis_dims[..axis].iter().sum::<usize>() / 2;
        let pairs = self.axis_dims[axis] / 2;
        let start = before * self.max_positions + pos * pairs;
        (
            &self.cos[start..start + pairs],
            &self.sin[start..start + pairs],
        )
    }
}

/// Rotates `x` (`[tokens, heads, head_dim]`, contiguous) in place by each token's `(f, y, x)`.
pub fn apply_rope(
    table: &RopeTable,
    x: &mut [f32],
    positions: &[[usize; 3]],
    heads: usize,
    head_dim: usize,
) {
    assert_eq!(
        head_dim, table.head_dim,
        "rope table built for another head_dim"
    );
    let token_len = heads * head_dim;
    assert_eq!(x.len(), positions.len() * token_len, "rope input length");
    if token_len == 0 {
        return;
    }
    parallel::run(|| {
        x.par_chunks_mut(token_len)
            .zip(positions.par_iter())
            .with_min_len((4096 / token_len).max(1))
            .for_each(|(token, pos)| rotate_token(table, token, pos, head_dim));
    });
}

/// Rotates every head vector of one token.
fn rotate_token(table: &RopeTable, token: &mut [f32], pos: &[usize; 3], head_dim: usize) {
    // Slices per axis, looked up once per token rather than once per head.
    let rows = [
        table.axis_rows(0, pos[0]),
        table.axis_rows(1, pos[1]),
        table.axis_rows(2, pos[2]),
    ];
    for head in token.chunks_exact_mut(head_dim) {
        let mut pairs = head.chunks_exact_mut(2);
        for (cos, sin) in rows {
            // The table side leads the zip so it stops before consuming an extra pair.
            for ((&c, &s), pair) in cos.iter().zip(sin).zip(&mut pairs) {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c - b * s;
                pair[1] = a * s + b * c;
            }
        }
    }
}

/// A RoPE table's copies on the GPU device it was last used on (its cos/sin tables and
/// the last positions uploaded, held by the GPU dispatch as it sees fit), kept only while a [`RopeScope`] is open: a DiT forward rotates q
/// and k of every block with the same table and positions, so inside its scope they are
/// uploaded (and the stream waited for) once, not per call; when the scope closes they
/// are freed, so nothing stays resident between forwards or sessions. Clones start
/// empty and every cache compares equal: it is not part of the table's value.
#[derive(Default)]
pub struct RopeCache {
    copies: Mutex<Option<Box<dyn Any + Send>>>,
    scopes: AtomicUsize,
}

/// While it lives, a [`RopeCache`] keeps what it uploaded; the last scope to close frees it.
#[derive(Debug)]
pub struct RopeScope<'a>(&'a RopeCache);

impl Drop for RopeScope<'_> {
    fn drop(&mut self) {
        if self.0.scopes.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.0.copies.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

impl std::fmt::Debug for RopeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RopeCache")
    }
}

impl Clone for RopeCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for RopeCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl RopeCache {
    /// Opens a scope: uploads are kept until the last open scope closes.
    pub fn scope(&self) -> RopeScope<'_> {
        self.scopes.fetch_add(1, Ordering::AcqRel);
        RopeScope(self)
    }

    /// Runs `f` on the copies: inside a scope the ones kept, outside one an empty slot
    /// for this call only (so nothing stays resident).
    pub(crate) fn with_copies<R>(
        &self,
        f: impl FnOnce(&mut Option<Box<dyn Any + Send>>) -> R,
    ) -> R {
        let mut kept = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        let mut local = None;
        let slot = if self.scopes.load(Ordering::Acquire) > 0 {
            &mut *kept
        } else {
            &mut local
        };
        f(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::test_rng::TestRng as Rng;

    fn expected_angle(dim: usize, pos: usize, j: usize, theta: f64) -> f64 {
        pos as f64 / theta.powf((2 * j) as f64 / dim as f64)
    }

    #[test]
    fn head_dim_12_splits_4_4_4_and_128_splits_44_42_42() {
        assert_eq!(RopeTable::new(12, 4, 10_000.0).axis_dims(), [4, 4, 4]);
        assert_eq!(RopeTable::new(128, 4, 10_000.0).axis_dims(), [44, 42, 42]);
        assert_eq!(RopeTable::new(64, 4, 10_000.0).axis_dims(), [24, 20, 20]);
    }

    #[test]
    fn table_holds_f64_cos_sin_rounded_to_f32_exactly() {
        let theta = 10_000.0;
        for head_dim in [12, 128] {
            let table = RopeTable::new(head_dim, 1024, theta);
            for (axis, &dim) in table.axis_dims().iter().enumerate() {
                for pos in [0, 1, 2, 17, 511, 1023] {
                    for j in 0..dim / 2 {
                        let angle = expected_angle(dim, pos, j, theta);
                        let (c, s) = table.cos_sin(axis, pos, j);
                        assert_eq!(c, angle.cos() as f32, "cos axis {axis} pos {pos} j {j}");
                        assert_eq!(s, angle.sin() as f32, "sin axis {axis} pos {pos} j {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn apply_rope_matches_the_reference_interleaved_pair_rotation() {
        let theta = 10_000.0;
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for &(heads, head_dim) in &[(3, 12), (2, 128), (1, 8)] {
            let table = RopeTable::new(head_dim, 64, theta);
            let [t, h, _] = table.axis_dims();
            let positions: Vec<[usize; 3]> =
                (0..37).map(|i| [i % 5, (i * 7) % 64, 63 - i]).collect();
            let input: Vec<f32> = (0..positions.len() * heads * head_dim)
                .map(|_| rng.next_f32())
                .collect();
            let mut x = input.clone();
            apply_rope(&table, &mut x, &positions, heads, head_dim);
            for (tok, pos) in positions.iter().enumerate() {
                for hd in 0..heads {
                    let base = (tok * heads + hd) * head_dim;
                    for j in 0..head_dim / 2 {
                        let (axis, dim, jj) = if 2 * j < t {
                            (0, t, j)
                        } else if 2 * j < t + h {
                            (1, h, j - t / 2)
                        } else {
                            (2, head_dim - t - h, j - (t + h) / 2)
                        };
                        let angle = expected_angle(dim, pos[axis], jj, theta);
                        let (c, s) = (angle.cos() as f32 as f64, angle.sin() as f32 as f64);
                        let (a, b) = (input[base + 2 * j] as f64, input[base + 2 * j + 1] as f64);
                        let want = [a * c - b * s, a * s + b * c];
                        for (e, w) in want.iter().enumerate() {
                            let got = x[base + 2 * j + e] as f64;
                            assert!((got - w).abs() < 1e-6, "tok {tok} head {hd} pair {j}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn position_zero_leaves_vectors_unchanged() {
        let table = RopeTable::new(16, 8, 10_000.0);
        let input: Vec<f32> = (0..32).map(|i| i as f32 - 7.5).collect();
        let mut x = input.clone();
        apply_rope(&table, &mut x, &[[0, 0, 0]], 2, 16);
        assert_eq!(x, input);
    }

    #[test]
    #[should_panic(expected = "rope position beyond the table")]
    fn positions_beyond_the_table_panic() {
        let table = RopeTable::new(12, 4, 10_000.0);
        let mut x = vec![0.0; 12];
        apply_rope(&table, &mut x, &[[0, 4, 0]], 1, 12);
    }
}
