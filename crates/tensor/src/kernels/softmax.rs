//! Row-wise softmax over a row-major `[rows, cols]` f32 buffer, and the vectorisable
//! `exp` that attention shares.
//!
//! Each row is computed by exactly one task as `exp(x − max) / Σ exp(x − max)`:
//! subtracting the row maximum keeps every exponent ≤ 0, so nothing overflows whatever
//! the magnitude of the inputs. Reductions use a fixed number of lanes combined in a
//! fixed order, so the bytes are identical whatever thread runs the row. The hot loop is
//! also compiled for AVX2 and picked at run time; it performs the same IEEE operations,
//! so both versions give the same bits. A row that is entirely `−∞` (fully masked)
//! becomes zeros rather than NaN. No heap memory is used; the output is the only buffer.

use rayon::prelude::*;

use crate::parallel;

/// Independent accumulators in reductions: wide enough for 512-bit vectors, and a
/// fixed count so the summation order does not depend on the machine.
const LANES: usize = 16;

/// Inputs below this make `exp` return exactly 0 (the true value is < 1.2e-38, below
/// the smallest normal f32, and flushing keeps masked `−∞` entries at exact zeros).
const EXP_LOW: f32 = -87.3;
/// Inputs are clamped to this so `2^n` stays a finite normal float (n ≤ 127).
const EXP_HIGH: f32 = 88.3;

/// `exp(x)` to about 1 ulp, written with plain arithmetic and bit operations (no libm
/// call, no branches) so that loops over it auto-vectorise.
///
/// Cody–Waite range reduction `x = n·ln2 + r`, |r| ≤ ln2/2, then the Cephes degree-6
/// polynomial for `exp(r)`, scaled by `2^n` built directly in the exponent bits.
#[inline(always)]
pub(crate) fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n·LN2_HI is exact for |n| < 2^9.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5·2^23: adding it rounds to an integer and leaves that integer in the low
    // mantissa bits, avoiding a (slow, saturating) float→int conversion.
    const ROUND: f32 = 12_582_912.0;
    const P0: f32 = 1.987_569_1e-4;
    const P1: f32 = 1.398_199_9e-3;
    const P2: f32 = 8.333_452e-3;
    const P3: f32 = 4.166_579_6e-2;
    const P4: f32 = 1.666_666_5e-1;
    const P5: f32 = 0.5;

    let xc = x.clamp(EXP_LOW, EXP_HIGH);
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = P0;
    p = p * r + P1;
    p = p * r + P2;
    p = p * r + P3;
    p = p * r + P4;
    p = p * r + P5;
    let y = p * (r * r) + r + 1.0;
    // The low bits of t hold n (two's complement); shifting them into the exponent
    // field and adding the bias gives the bits of 2^n.
    let scale = f32::from_bits(t.to_bits().wrapping_shl(23).wrapping_add(127 << 23));
    let v = y * scale;
    if x < EXP_LOW {
        0.0
    } else {
        v
    }
}

/// Largest element of `row` and `floor` (`floor` for an empty row); NaNs are ignored.
#[inline(always)]
fn row_max(row: &[f32], floor: f32) -> f32 {
    let mut lanes = [floor; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            // A plain comparison (not f32::max) compiles to one vector max instruction.
            *m = if x > *m { x } else { *m };
        }
    }
    for (m, &x) in lanes.iter_mut().zip(chunks.remainder()) {
        *m = if x > *m { x } else { *m };
    }
    lanes.iter().fold(floor, |a, &b| if b > a { b } else { a })
}

/// The portable body of [`exp_with_max`].
#[inline(always)]
fn exp_with_max_impl(row: &mut [f32], floor: f32) -> (f32, f32) {
    let max = row_max(row, floor);
    if max == f32::NEG_INFINITY {
        return (max, 0.0);
    }
    let mut lanes = [0.0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (s, x) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *x = fast_exp(*x - max);
            *s += *x;
        }
    }
    for (s, x) in lanes.iter_mut().zip(chunks.into_remainder().iter_mut()) {
        *x = fast_exp(*x - max);
        *s += *x;
    }
    (max, lanes.iter().sum())
}

/// [`exp_with_max_impl`] compiled for AVX2: 8-wide instead of the 4-wide SSE2 baseline,
/// which makes the exponentials ~2× cheaper. It runs the same IEEE operations in the
/// same order (Rust never fuses a multiply and an add on its own, and the lane count is
/// fixed), so its bits equal the baseline's; only the speed differs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_with_max_avx2(row: &mut [f32], floor: f32) -> (f32, f32) {
    exp_with_max_impl(row, floor)
}

/// [`exp_with_max_impl`] compiled for AVX-512: 16-wide, the same bits again.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_with_max_avx512(row: &mut [f32], floor: f32) -> (f32, f32) {
    exp_with_max_impl(row, floor)
}

/// Replaces every `x` of `row` by `exp(x − m)`, `m = max(floor, max(row))`, and returns
/// `(m, Σ exp(x − m))`; a row with `m = −∞` is left as is and gives `(−∞, 0)`.
///
/// `floor` lets attention's online softmax shift by its running maximum in one pass.
#[inline]
pub(crate) fn exp_with_max(row: &mut [f32], floor: f32) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked at run time just above.
            return unsafe { exp_with_max_avx512(row, floor) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked at run time just above.
            return unsafe { exp_with_max_avx2(row, floor) };
        }
    }
    exp_with_max_impl(row, floor)
}

/// Multiplies every element of `row` by `factor`.
#[inline]
pub(crate) fn scale_in_place(row: &mut [f32], factor: f32) {
    for x in row.iter_mut() {
        *x *= factor;
    }
}

/// Softmax of one row in place; an all-`−∞` row becomes zeros.
#[inline]
fn softmax_row(row: &mut [f32]) {
    let (max, sum) = exp_with_max(row, f32::NEG_INFINITY);
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    // sum ≥ 1 because the maximum contributes exp(0) = 1, so the reciprocal is finite.
    scale_in_place(row, 1.0 / sum);
}

/// Rows handed to one rayon task at least, so short rows do not drown in scheduling.
fn min_rows_per_task(cols: usize) -> usize {
    (16 * 1024 / cols.max(1)).max(1)
}

/// Softmax of every row of the row-major `[rows, cols]` buffer `data`, in place.
pub fn softmax_rows(data: &mut [f32], rows: usize, cols: usize) {
    assert_eq!(data.len(), rows * cols, "softmax buffer length");
    if rows == 0 || cols == 0 {
        return;
    }
    parallel::run(|| {
        data.par_chunks_mut(cols)
            .with_min_len(min_rows_per_task(cols))
            .for_each(softmax_row);
    });
}

/// Softmax of every row of the row-major `[rows, cols]` buffer `input`, written to `out`.
pub fn softmax_rows_into(input: &[f32], out: &mut [f32], rows: usize, cols: usize) {
    assert_eq!(input.len(), rows * cols, "softmax input length");
    assert_eq!(out.len(), rows * cols, "softmax output length");
    if rows == 0 || cols == 0 {
        return;
    }
    parallel::run(|| {
        out.par_chunks_mut(cols)
            .zip(input.par_chunks(cols))
            .with_min_len(min_rows_per_task(cols))
            .for_each(|(out_row, in_row)| {
                out_row.copy_from_slice(in_row);
                softmax_row(out_row);
            });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::test_rng::TestRng as Rng;

    fn reference(row: &[f32]) -> Vec<f64> {
        let max = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
        let e: Vec<f64> = row.iter().map(|&x| (x as f64 - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        e.iter().map(|x| x / sum).collect()
    }

    #[test]
    fn fast_exp_matches_f64_exp_to_a_few_ulp_over_the_useful_range() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let got = fast_exp(x) as f64;
            let want = (x as f64).exp();
            assert!(
                ((got - want) / want).abs() < 2.5e-7,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.001_37;
        }
        assert_eq!(fast_exp(0.0), 1.0);
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(-100.0), 0.0);
        assert!(fast_exp(100.0).is_finite());
    }

    #[test]
    fn softmax_rows_sum_to_one_and_match_the_f64_reference() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for &(rows, cols, range) in &[(7, 1, 1.0), (5, 33, 3.0), (3, 1000, 60.0), (64, 17, 0.1)] {
            let input: Vec<f32> = (0..rows * cols)
                .map(|_| rng.uniform(-range, range))
                .collect();
            let mut in_place = input.clone();
            softmax_rows(&mut in_place, rows, cols);
            let mut out = vec![f32::NAN; rows * cols];
            softmax_rows_into(&input, &mut out, rows, cols);
            assert_eq!(in_place, out, "in place and out of place differ");
            for r in 0..rows {
                let row = &out[r * cols..(r + 1) * cols];
                let sum: f64 = row.iter().map(|&x| x as f64).sum();
                assert!((sum - 1.0).abs() < 1e-5, "row {r} sums to {sum}");
                let want = reference(&input[r * cols..(r + 1) * cols]);
                for (g, w) in row.iter().zip(&want) {
                    assert!((*g as f64 - w).abs() < 1e-6, "{g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn softmax_is_stable_for_huge_inputs_and_zeroes_fully_masked_rows() {
        let ninf = f32::NEG_INFINITY;
        let mut data = vec![1e30, 1e30, -1e30, ninf, ninf, ninf, 0.0, ninf, 0.0];
        softmax_rows(&mut data, 3, 3);
        assert_eq!(&data[..3], &[0.5, 0.5, 0.0]);
        assert_eq!(&data[3..6], &[0.0, 0.0, 0.0]);
        assert_eq!(&data[6..], &[0.5, 0.0, 0.5]);
    }

    #[test]
    fn vectorised_and_portable_exp_give_identical_bits() {
        let mut rng = Rng(42);
        for len in [0, 1, 7, 16, 17, 255, 256, 1000] {
            for floor in [f32::NEG_INFINITY, 0.5, 30.0] {
                let row: Vec<f32> = (0..len).map(|_| rng.uniform(-40.0, 40.0)).collect();
                let (mut a, mut b) = (row.clone(), row);
                let ra = exp_with_max(&mut a, floor);
                let rb = exp_with_max_impl(&mut b, floor);
                assert_eq!(ra.0.to_bits(), rb.0.to_bits());
                assert_eq!(ra.1.to_bits(), rb.1.to_bits());
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b));
            }
        }
    }
}
