//! The AVX-512 packers: the same bytes as the scalar loops, 16 values at a time.

use std::arch::x86_64::*;

use super::{Operand, Part, TILE_ROWS};

/// 16 f32 → their bf16 part `part`, as bf16 bits in the high half of each 32-bit lane
/// (low half zero): exactly [`super::split`] per lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn split16(x: __m512, part: Part) -> __m512i {
    let hi = rne16(x);
    match part {
        Part::Hi => hi,
        Part::Lo => {
            let h = _mm512_castsi512_ps(hi);
            let exp = _mm512_set1_epi32(0x7f80_0000);
            let finite = _mm512_cmpneq_epi32_mask(_mm512_and_si512(hi, exp), exp);
            _mm512_maskz_mov_epi32(finite, rne16(_mm512_sub_ps(x, h)))
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn rne16(x: __m512) -> __m512i {
    let b = _mm512_castps_si512(x);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let r = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    let r = _mm512_and_si512(r, _mm512_set1_epi32(0xffff_0000_u32 as i32));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0_0000))
}

/// [`super::round_row`] over whole groups of 32 values.
///
/// # Safety
/// AVX-512 F/BW present; `src` holds `out.len()` values, a multiple of 32.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn round_words(src: &[f32], out: &mut [u16]) {
    assert!(out.len().is_multiple_of(32) && src.len() >= out.len());
    for (g, dst) in out.chunks_exact_mut(32).enumerate() {
        // SAFETY: 32 values from 32·g are inside `src` (asserted); `dst` holds 32.
        unsafe {
            let p = src.as_ptr().add(32 * g);
            let w = bf16_words(_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
            _mm512_storeu_si512(dst.as_mut_ptr().cast(), w);
        }
    }
}

/// [`super::pair_row`] over whole groups of 16 values.
///
/// # Safety
/// AVX-512 F/BW present; `even` (and `odd`) hold `out.len()` values, a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn pair_words(even: &[f32], odd: Option<&[f32]>, out: &mut [u32]) {
    assert!(out.len().is_multiple_of(16) && even.len() >= out.len());
    assert!(odd.is_none_or(|o| o.len() >= out.len()));
    for (g, dst) in out.chunks_exact_mut(16).enumerate() {
        // SAFETY: 16 values from 16·g are inside `even` and `odd` (asserted) and
        // `dst` holds 16 words.
        unsafe {
            let e = split16(_mm512_loadu_ps(even.as_ptr().add(16 * g)), Part::Hi);
            let o = match odd {
                Some(o) => split16(_mm512_loadu_ps(o.as_ptr().add(16 * g)), Part::Hi),
                None => _mm512_setzero_si512(),
            };
            let word = _mm512_or_si512(_mm512_srli_epi32::<16>(e), o);
            _mm512_storeu_si512(dst.as_mut_ptr().cast(), word);
        }
    }
}

/// 32 consecutive values of row `row` from column `k0`, as one 64-byte register of
/// bf16 bits in order.
///
/// # Safety
/// AVX-512 F/BW present; the 32 values exist with unit column stride.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load_row32(a: &Operand<'_>, row: usize, k0: usize, part: Part) -> __m512i {
    match a {
        Operand::F32(m) => {
            let i = m.index(row, k0);
            assert!(i + 32 <= m.data.len());
            // SAFETY: the 32 f32 at i.. are inside the slice (asserted).
            let (x0, x1) = unsafe {
                let p = m.data.as_ptr().add(i);
                (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
            };
            high_words(split16(x0, part), split16(x1, part))
        }
        Operand::Bf16(m) => match part {
            Part::Lo => _mm512_setzero_si512(),
            Part::Hi => {
                let i = m.index(row, k0);
                assert!(i + 32 <= m.data.len());
                // SAFETY: the 32 bf16 at i.. are inside the slice (asserted).
                unsafe { _mm512_loadu_si512(m.data.as_ptr().add(i).cast()) }
            }
        },
        Operand::Fp8(m, table) => match part {
            Part::Lo => _mm512_setzero_si512(),
            Part::Hi => {
                let i = m.index(row, k0);
                assert!(i + 32 <= m.data.len());
                // SAFETY: the 32 codes at i.. are inside the slice (asserted).
                let bytes = unsafe { _mm256_loadu_si256(m.data.as_ptr().add(i).cast()) };
                super::super::fp8::words32(bytes, table)
            }
        },
    }
}

/// The high halves of the 32-bit lanes of `lo` then `hi`: 32 bf16 words in order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn high_words(lo: __m512i, hi: __m512i) -> __m512i {
    let idx = _mm512_set_epi16(
        63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25, 23, 21, 19,
        17, 15, 13, 11, 9, 7, 5, 3, 1,
    );
    _mm512_permutex2var_epi16(lo, idx, hi)
}

/// 16 + 16 f32 rounded to bf16 as the packers round them, as 32 bf16 words in order
/// (`lo` first).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn bf16_words(lo: __m512, hi: __m512) -> __m512i {
    high_words(rne16(lo), rne16(hi))
}

/// The first `steps · 32` values of row `row`, part `part`, as `steps` runs of 32
/// bf16 words at `out[at + s · stride..]`.
///
/// # Safety
/// AVX-512 F/BW present; the values exist with unit column stride.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn row_steps(
    a: &Operand<'_>,
    row: usize,
    steps: usize,
    part: Part,
    out: &mut [u16],
    at: usize,
    stride: usize,
) {
    if steps == 0 {
        return;
    }
    assert!(at + (steps - 1) * stride + 32 <= out.len());
    let dst = out.as_mut_ptr();
    for s in 0..steps {
        // SAFETY: the caller's contract (unit column stride: step s is the 32 values
        // from column 32s, bounds-checked by `load_row32`); the 32 words at
        // at + s·stride are inside `out` (asserted).
        unsafe {
            let v = load_row32(a, row, 32 * s, part);
            _mm512_storeu_si512(dst.add(at + s * stride).cast(), v);
        }
    }
}

/// One B tile (16 columns × 32 k) from an operand whose k axis is contiguous: each
/// column's 32 values are 16 VNNI pair words, and a 16 × 16 transpose of 32-bit words
/// turns columns into tile rows.
///
/// # Safety
/// AVX-512 present; the tile lies inside the operand, row stride 1; `dst` holds 512.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub(super) unsafe fn b_tile_k_contiguous(
    b: &Operand<'_>,
    k0: usize,
    n0: usize,
    part: Part,
    dst: &mut [u16],
) {
    assert!(dst.len() >= 512);
    let t = b.transposed();
    let mut r = [_mm512_setzero_si512(); 16];
    for (c, reg) in r.iter_mut().enumerate() {
        // SAFETY: forwarded contract: column n0 + c has 32 contiguous values from k0.
        *reg = unsafe { load_row32(&t, n0 + c, k0, part) };
    }
    let r = transpose16(r);
    for (p, reg) in r.iter().enumerate() {
        // SAFETY: dst holds 512 values (asserted); row p is values p·32..p·32 + 32.
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(p * 32).cast(), *reg) };
    }
}

/// `steps` consecutive B tiles (k-steps 0..steps) of columns `n0..n0 + 16` of a
/// k-contiguous operand, tile `s` at `out[at + s · stride..]`.
///
/// # Safety
/// As [`b_tile_k_contiguous`] for every k-step.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn b_tiles_k_contiguous(
    b: &Operand<'_>,
    n0: usize,
    steps: usize,
    part: Part,
    out: &mut [u16],
    at: usize,
    stride: usize,
) {
    if steps == 0 {
        return;
    }
    assert!(at + (steps - 1) * stride + 512 <= out.len());
    for s in 0..steps {
        let o = at + s * stride;
        // SAFETY: forwarded contract; the 512 values at `o` are inside `out`.
        unsafe { b_tile_k_contiguous(b, 32 * s, n0, part, &mut out[o..o + 512]) };
    }
}

/// One B tile from an operand whose n axis is contiguous: pair row `p` interleaves
/// rows `k0 + 2p` and `k0 + 2p + 1`, 16 columns each.
///
/// # Safety
/// AVX-512 present; the tile lies inside the operand, column stride 1; `dst` holds 512.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn b_tile_n_contiguous(
    b: &Operand<'_>,
    k0: usize,
    n0: usize,
    part: Part,
    dst: &mut [u16],
) {
    assert!(dst.len() >= 512);
    for p in 0..TILE_ROWS {
        let (even, odd) = match b {
            Operand::F32(m) => {
                let (i0, i1) = (m.index(k0 + 2 * p, n0), m.index(k0 + 2 * p + 1, n0));
                assert!(i0.max(i1) + 16 <= m.data.len());
                // SAFETY: 16 f32 from i0 and from i1 are inside the slice (asserted).
                let (x0, x1) = unsafe {
                    (
                        _mm512_loadu_ps(m.data.as_ptr().add(i0)),
                        _mm512_loadu_ps(m.data.as_ptr().add(i1)),
                    )
                };
                (split16(x0, part), split16(x1, part))
            }
            Operand::Bf16(m) => {
                if part == Part::Lo {
                    (_mm512_setzero_si512(), _mm512_setzero_si512())
                } else {
                    let (i0, i1) = (m.index(k0 + 2 * p, n0), m.index(k0 + 2 * p + 1, n0));
                    assert!(i0.max(i1) + 16 <= m.data.len());
                    // SAFETY: 16 bf16 from i0 and from i1 are inside the slice.
                    let (x0, x1) = unsafe {
                        (
                            _mm256_loadu_si256(m.data.as_ptr().add(i0).cast()),
                            _mm256_loadu_si256(m.data.as_ptr().add(i1).cast()),
                        )
                    };
                    (
                        _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(x0)),
                        _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(x1)),
                    )
                }
            }
            Operand::Fp8(m, table) => {
                if part == Part::Lo {
                    (_mm512_setzero_si512(), _mm512_setzero_si512())
                } else {
                    let (i0, i1) = (m.index(k0 + 2 * p, n0), m.index(k0 + 2 * p + 1, n0));
                    assert!(i0.max(i1) + 16 <= m.data.len());
                    // SAFETY: 16 codes from i0 and from i1 are inside the slice; the
                    // loads fill the low halves of 256-bit registers.
                    let (x0, x1) = unsafe {
                        (
                            _mm256_castsi128_si256(_mm_loadu_si128(m.data.as_ptr().add(i0).cast())),
                            _mm256_castsi128_si256(_mm_loadu_si128(m.data.as_ptr().add(i1).cast())),
                        )
                    };
                    let lo16 = |x| {
                        let w = super::super::fp8::words32(x, table);
                        _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(w)))
                    };
                    (lo16(x0), lo16(x1))
                }
            }
        };
        let word = _mm512_or_si512(_mm512_srli_epi32::<16>(even), odd);
        // SAFETY: dst holds 512 values (asserted); pair row p is p·32..p·32 + 32.
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(p * 32).cast(), word) };
    }
}

/// Transposes a 16 × 16 matrix of 32-bit words held one row per register.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for h in 0..2 {
        for j in 0..4 {
            let (a, b) = (u[8 * h + j], u[8 * h + 4 + j]);
            t[8 * h + j] = _mm512_shuffle_i32x4::<0x88>(a, b);
            t[8 * h + 4 + j] = _mm512_shuffle_i32x4::<0xdd>(a, b);
        }
    }
    for j in 0..8 {
        u[j] = _mm512_shuffle_i32x4::<0x88>(t[j], t[8 + j]);
        u[8 + j] = _mm512_shuffle_i32x4::<0xdd>(t[j], t[8 + j]);
    }
    u
}

impl Operand<'_> {
    /// The same operand with rows and columns swapped (no copy).
    pub(super) fn transposed(&self) -> Self {
        match *self {
            Operand::F32(m) => Operand::F32(m.t()),
            Operand::Bf16(m) => Operand::Bf16(m.t()),
            Operand::Fp8(m, table) => Operand::Fp8(m.t(), table),
        }
    }
}
