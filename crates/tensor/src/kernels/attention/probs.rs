//! The online softmax step of the bf16 AMX path, fused with packing: the scores of a key
//! tile become probabilities written straight into the packed bf16 P tile (the A
//! operand of `P · V`), with no f32 probability pass and no separate packing pass.
//!
//! The exponential is the same Cephes reduction and polynomial as
//! [`crate::kernels::softmax`]'s, evaluated with fused multiply-adds and `vscalefps`
//! (AVX-512 is always there when the tiles are), so it is ~1 ulp like the shared one but
//! not bit-equal to it; the products are bf16 anyway. Sums and maxima are f32, per row in
//! a fixed order, so the bits depend only on the inputs.

use super::{AttentionParams, BLOCK_KV};
use crate::kernels::cpu::pack::{bf16_words, KSTEP_LEN, PANEL, TILE_K, TILE_ROWS};

/// The running state of one query tile: maxima, sums and the output accumulator.
pub(super) struct Running<'a> {
    /// Running maximum per row.
    pub(super) m: &'a mut [f32],
    /// Running sum of exponentials per row.
    pub(super) l: &'a mut [f32],
    /// `rows × head_dim` accumulator of `P · V`.
    pub(super) acc: &'a mut [f32],
}

/// For query rows `rows` against key tile `c0..c0 + cols`: `exp(scale · s − m_new)` of
/// every visible raw product of `s` (rows [`BLOCK_KV`] apart; the attention's `scale`,
/// which must be positive, is applied here by the exponential's first FMA instead of by
/// a pass of the product over its output) as bf16 into `p_packed` (packed A layout of
/// `n_rows × cols`, zeros for masked keys, the K tail and rows past the tile), the
/// running maxima and sums updated and the accumulator rows rescaled where a maximum
/// grew.
pub(super) fn softmax_into_packed(
    p: &AttentionParams,
    rows: &std::ops::Range<usize>,
    c0: usize,
    cols: usize,
    s: &[f32],
    run: &mut Running<'_>,
    p_packed: &mut [u16],
) {
    let n_rows = rows.len();
    let ks = cols.div_ceil(TILE_K);
    let padded = n_rows.div_ceil(PANEL) * PANEL;
    assert!(
        p_packed.len() >= padded / PANEL * ks * KSTEP_LEN,
        "packed P too short"
    );
    assert!(
        s.len() >= (n_rows.max(1) - 1) * BLOCK_KV + cols,
        "score tile too short"
    );
    let d = p.head_dim;
    let bf16_convert = crate::kernels::cpu::features().avx512_bf16;
    for i in 0..padded {
        // Where row i's 32 values of k-step `st` go in the packed A layout.
        let (ib, t, r) = (i / PANEL, (i % PANEL) / TILE_ROWS, i % TILE_ROWS);
        let at = |st: usize| (ib * ks + st) * KSTEP_LEN + t * 512 + r * TILE_K;
        let visible = if i < n_rows {
            p.visible_keys(rows.start + i).saturating_sub(c0).min(cols)
        } else {
            0
        };
        if visible == 0 {
            for st in 0..ks {
                p_packed[at(st)..at(st) + TILE_K].fill(0);
            }
            continue;
        }
        let row = &s[i * BLOCK_KV..i * BLOCK_KV + visible];
        let m_old = run.m[i];
        // SAFETY: the AMX path runs only where AVX-512 F/BW and FMA are present (its
        // packers need them), AVX512_BF16 is used only when detected; `row` holds
        // `visible` values and every destination range lies inside `p_packed` (asserted
        // above: k-steps < ks, rows < padded).
        let (m_new, sum) = unsafe { exp_row(row, p.scale, m_old, p_packed, ks, &at, bf16_convert) };
        if m_new > m_old && m_old != f32::NEG_INFINITY {
            // The running max grew: earlier terms shrink by exp(m_old − m_new) ≤ 1.
            let correction = (m_old - m_new).exp();
            run.acc[i * d..(i + 1) * d]
                .iter_mut()
                .for_each(|a| *a *= correction);
            run.l[i] *= correction;
        }
        run.l[i] += sum;
        run.m[i] = m_new;
    }
}

/// One row: `max`, the larger of `floor` and `scale` times the row's largest value (the
/// largest scaled value: rounding is monotonic and `scale` > 0), then `exp(scale · x −
/// max)` of every value (one FMA) into the packed k-steps `at(0..ks)` as bf16 (zeros past
/// the row), and their f32 sum.
///
/// # Safety
/// AVX-512 F/BW and FMA present, and AVX512_BF16 when `bf16_convert`; `at(st)..at(st) +
/// 32` inside `out` for `st < ks`, `row.len() <= 32 · ks`, and `row` is not empty.
#[target_feature(enable = "avx512f,avx512bw,fma")]
unsafe fn exp_row(
    row: &[f32],
    scale: f32,
    floor: f32,
    out: &mut [u16],
    ks: usize,
    at: &dyn Fn(usize) -> usize,
    bf16_convert: bool,
) -> (f32, f32) {
    use std::arch::x86_64::*;
    let n = row.len();
    debug_assert!(n <= ks * TILE_K);
    let lane_mask = |c: usize| -> __mmask16 {
        let left = n.saturating_sub(c).min(16);
        ((1u32 << left) - 1) as __mmask16
    };
    // SAFETY (whole body): loads are masked to the row's `n` values, stores go to the
    // 64-byte destinations the caller guarantees.
    unsafe {
        let mut vmax = _mm512_set1_ps(f32::NEG_INFINITY);
        for c in (0..n).step_by(16) {
            let v = _mm512_maskz_loadu_ps(lane_mask(c), row.as_ptr().add(c));
            let v = _mm512_mask_blend_ps(lane_mask(c), _mm512_set1_ps(f32::NEG_INFINITY), v);
            vmax = _mm512_max_ps(vmax, v);
        }
        let max = (scale * _mm512_reduce_max_ps(vmax)).max(floor);
        let shift = _mm512_set1_ps(-max);
        let factor = _mm512_set1_ps(scale);
        let mut sum = _mm512_setzero_ps();
        for st in 0..ks {
            let mut halves = [_mm512_setzero_ps(); 2];
            for (hf, half) in halves.iter_mut().enumerate() {
                let c = st * TILE_K + hf * 16;
                let k = lane_mask(c);
                if k == 0 {
                    continue;
                }
                let x = _mm512_maskz_loadu_ps(k, row.as_ptr().add(c));
                let e = _mm512_maskz_mov_ps(k, exp512(_mm512_fmadd_ps(x, factor, shift)));
                sum = _mm512_add_ps(sum, e);
                *half = e;
            }
            let words = if bf16_convert {
                // One instruction rounds both halves to nearest even (the inputs are
                // finite, where it equals the packers' rounding).
                let w: __m512i;
                std::arch::asm!(
                    "vcvtne2ps2bf16 {w}, {hi}, {lo}",
                    w = lateout(zmm_reg) w,
                    hi = in(zmm_reg) halves[1],
                    lo = in(zmm_reg) halves[0],
                    options(pure, nomem, nostack),
                );
                w
            } else {
                bf16_words(halves[0], halves[1])
            };
            _mm512_storeu_si512(out.as_mut_ptr().add(at(st)).cast(), words);
        }
        (max, _mm512_reduce_add_ps(sum))
    }
}

/// `exp(x)` for `x ≤ 0` lanes (larger inputs are not met here: the shift is the row
/// maximum), ~1 ulp: Cody–Waite reduction and the Cephes polynomial with FMA, `2^n`
/// applied by `vscalefps`; inputs below −100 give 0 or a denormal.
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn exp512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let x = _mm512_max_ps(x, _mm512_set1_ps(-100.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut q = _mm512_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(c));
    }
    let y = _mm512_fmadd_ps(
        q,
        _mm512_mul_ps(r, r),
        _mm512_add_ps(r, _mm512_set1_ps(1.0)),
    );
    _mm512_scalef_ps(y, n)
}
