//! Packing GEMM operands into the bf16 tile layouts the AMX and `vdpbf16ps` kernels read.
//!
//! A GEMM here is `C[m×n] = A[m×k] · B[k×n]`. K is cut into *k-steps* of [`TILE_K`] = 32
//! values (one AMX tile row of bf16); M and N into *panels* of 32 rows / 32 columns (two
//! tiles each). A packed panel is a run of k-steps, each 2 tiles × 16 rows × 64 bytes
//! (1,024 `u16`), so a micro-kernel streams a panel front to back:
//!
//! - A panel, tile `t`, row `r`, value `kk`: `u16` `t·512 + r·32 + kk` holds `A[32·ib + 16·t + r][32·s + kk]`.
//! - B panel (VNNI pairs), tile `t`, pair row `p`, column `c`, element `e`:
//!   `u16` `t·512 + p·32 + 2c + e` holds `B[32·s + 2p + e][32·jb + 16·t + c]`.
//!
//! Values outside the matrix are zeros, so the K, M and N tails need no special kernel.
//! An f32 value becomes bf16 by round-to-nearest-even ([`bf16_bits`]); for the near-f32
//! mode it is split into a high part and the rounded remainder ([`Part`]), each k-step
//! then holding one packed k-step per part. The AVX-512 packers and the scalar packers
//! write identical bytes (a test holds it).

use half::bf16;

use crate::kernels::matrix::MatRef;

/// bf16 values in one tile row (and per k-step).
pub const TILE_K: usize = 32;
/// Rows (A) or pair rows (B) of one tile.
pub const TILE_ROWS: usize = 16;
/// Rows of an A panel and columns of a B panel (two tiles).
pub const PANEL: usize = 32;
/// `u16` values of one packed k-step of one panel.
pub const KSTEP_LEN: usize = 2 * TILE_ROWS * TILE_K;

/// Which bf16 part of an f32 value a packed k-step holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The value rounded to bf16.
    Hi,
    /// The remainder `x − hi(x)` rounded to bf16 (zero for bf16 inputs and non-finite `hi`).
    Lo,
}

/// A GEMM operand: f32, bf16 or 8-bit float elements behind a strided view.
#[derive(Debug, Clone, Copy)]
pub enum Operand<'a> {
    /// f32 elements.
    F32(MatRef<'a, f32>),
    /// bf16 elements.
    Bf16(MatRef<'a, bf16>),
    /// 8-bit float codes and their format's bf16 table ([`super::fp8::table`]): packed
    /// as the bf16 values they are, exactly.
    Fp8(MatRef<'a, u8>, &'a super::fp8::Table),
}

impl Operand<'_> {
    /// The part `part` of element (r, c) as bf16 bits.
    #[inline]
    pub(crate) fn get(&self, r: usize, c: usize, part: Part) -> u16 {
        match self {
            Operand::F32(m) => split(m.data[m.index(r, c)], part),
            Operand::Bf16(m) => match part {
                Part::Hi => m.data[m.index(r, c)].to_bits(),
                Part::Lo => 0,
            },
            Operand::Fp8(m, table) => match part {
                Part::Hi => table[usize::from(m.data[m.index(r, c)])],
                Part::Lo => 0,
            },
        }
    }

    /// Element (r, c) as it is, widened to f32.
    #[inline]
    pub(crate) fn exact(&self, r: usize, c: usize) -> f32 {
        match self {
            Operand::F32(m) => m.data[m.index(r, c)],
            Operand::Bf16(m) => m.data[m.index(r, c)].to_f32(),
            Operand::Fp8(m, table) => {
                f32::from_bits(u32::from(table[usize::from(m.data[m.index(r, c)])]) << 16)
            }
        }
    }

    /// The same operand from column `c0` on (no copy).
    pub(crate) fn cols_from(&self, c0: usize) -> Self {
        match *self {
            Operand::F32(m) => Operand::F32(m.cols_from(c0)),
            Operand::Bf16(m) => Operand::Bf16(m.cols_from(c0)),
            Operand::Fp8(m, table) => Operand::Fp8(m.cols_from(c0), table),
        }
    }

    /// (row stride, column stride) in elements.
    fn strides(&self) -> (isize, isize) {
        match self {
            Operand::F32(m) => (m.row_stride, m.col_stride),
            Operand::Bf16(m) => (m.row_stride, m.col_stride),
            Operand::Fp8(m, _) => (m.row_stride, m.col_stride),
        }
    }
}

/// An f32 scratch buffer seen as twice as many `u16` values (the packed operands live in
/// f32 scratch from the allocator).
pub fn as_u16(buf: &mut [f32]) -> &mut [u16] {
    // SAFETY: u16 is smaller and no more aligned than f32, and every bit pattern is a
    // valid u16; the new slice covers exactly the same bytes and borrows `buf`.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u16>(), buf.len() * 2) }
}

/// f32 → bf16 bits, round to nearest even; every NaN becomes the canonical quiet NaN.
#[inline(always)]
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return 0x7fc0;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The bf16 part `part` of `x`.
#[inline(always)]
pub fn split(x: f32, part: Part) -> u16 {
    let hi = bf16_bits(x);
    match part {
        Part::Hi => hi,
        Part::Lo => {
            let h = f32::from_bits(u32::from(hi) << 16);
            if h.is_finite() {
                bf16_bits(x - h)
            } else {
                0
            }
        }
    }
}

/// `u16` length of `rows` rows (rounded up to panels) × `k` packed with `parts` parts.
pub fn packed_len(rows: usize, k: usize, parts: usize) -> usize {
    rows.div_ceil(PANEL) * k.div_ceil(TILE_K) * parts * KSTEP_LEN
}

/// Packs rows `r0..r0 + rows` of A (all of K) as A panels into `out`
/// (`packed_len(rows, k, parts.len())` values).
pub fn pack_a(a: &Operand<'_>, r0: usize, rows: usize, k: usize, parts: &[Part], out: &mut [u16]) {
    let np = parts.len();
    let ks = k.div_ceil(TILE_K);
    let len = packed_len(rows, k, np);
    let out = &mut out[..len];
    let fast = super::features().avx512 && a.strides().1 == 1;
    // Whole k-steps a row packs in one AVX-512 pass; the K tail goes value by value.
    let full = if fast { k / TILE_K } else { 0 };
    for row in 0..rows.div_ceil(PANEL) * PANEL {
        let (ib, t, r) = (row / PANEL, (row % PANEL) / TILE_ROWS, row % TILE_ROWS);
        let at = |s: usize, q: usize| ((ib * ks + s) * np + q) * KSTEP_LEN + t * 512 + r * TILE_K;
        if row >= rows {
            for s in 0..ks {
                for q in 0..np {
                    out[at(s, q)..at(s, q) + TILE_K].fill(0);
                }
            }
            continue;
        }
        if full > 0 {
            for (q, &part) in parts.iter().enumerate() {
                // SAFETY: AVX-512 is present (checked above); the row's first
                // `full · 32` values exist with unit column stride (full · 32 <= k), and
                // `row_steps` asserts its output and input bounds.
                unsafe {
                    avx512::row_steps(a, r0 + row, full, part, out, at(0, q), np * KSTEP_LEN)
                };
            }
        }
        for s in full..ks {
            for (q, &part) in parts.iter().enumerate() {
                let dst = &mut out[at(s, q)..at(s, q) + TILE_K];
                let k0 = s * TILE_K;
                for (kk, d) in dst.iter_mut().enumerate() {
                    *d = if k0 + kk < k {
                        a.get(r0 + row, k0 + kk, part)
                    } else {
                        0
                    };
                }
            }
        }
    }
}

/// Packs the B panels `panels` (each 32 columns, all of K) of the `k × n` operand into
/// `out`, panel `panels.start` first.
pub fn pack_b(
    b: &Operand<'_>,
    k: usize,
    n: usize,
    panels: std::ops::Range<usize>,
    parts: &[Part],
    out: &mut [u16],
) {
    let np = parts.len();
    let ks = k.div_ceil(TILE_K);
    let k_contiguous = super::features().avx512 && b.strides().0 == 1;
    for (i, jb) in panels.enumerate() {
        for t in 0..2 {
            let n0 = jb * PANEL + t * TILE_ROWS;
            let at = |s: usize, q: usize| ((i * ks + s) * np + q) * KSTEP_LEN + t * 512;
            // Whole tiles of a k-contiguous operand in one AVX-512 pass per part.
            let full = if k_contiguous && n0 + TILE_ROWS <= n {
                k / TILE_K
            } else {
                0
            };
            if full > 0 {
                for (q, &part) in parts.iter().enumerate() {
                    // SAFETY: AVX-512 is present; columns n0..n0 + 16 and rows
                    // 0..32·full are inside the operand (n0 + 16 <= n, 32·full <= k) with
                    // unit row stride; `b_tiles_k_contiguous` asserts the output bounds.
                    unsafe {
                        avx512::b_tiles_k_contiguous(
                            b,
                            n0,
                            full,
                            part,
                            out,
                            at(0, q),
                            np * KSTEP_LEN,
                        )
                    };
                }
            }
            for s in full..ks {
                for (q, &part) in parts.iter().enumerate() {
                    let at = at(s, q);
                    b_tile(b, k, n, s * TILE_K, n0, part, &mut out[at..at + 512]);
                }
            }
        }
    }
}

/// Packs k-step `s` of every panel of a `k × n` B (laid out as [`pack_b`] lays out panels
/// `0..` of the whole K) from `rows`: B's rows `32s..32s + 32` (fewer at the K tail),
/// row-major with `n` columns. Lets a producer (conv's im2col) pack B k-step by k-step
/// without ever holding all of it unpacked; the bytes equal [`pack_b`]'s.
pub fn pack_b_kstep(rows: &[f32], k: usize, n: usize, s: usize, parts: &[Part], out: &mut [u16]) {
    let np = parts.len();
    let ks = k.div_ceil(TILE_K);
    let here = (k - s * TILE_K).min(TILE_K);
    let b = Operand::F32(MatRef::row_major(&rows[..here * n], 0, n));
    for jb in 0..n.div_ceil(PANEL) {
        for t in 0..2 {
            for (q, &part) in parts.iter().enumerate() {
                let at = ((jb * ks + s) * np + q) * KSTEP_LEN + t * 512;
                let n0 = jb * PANEL + t * TILE_ROWS;
                b_tile(&b, here, n, 0, n0, part, &mut out[at..at + 512]);
            }
        }
    }
}

/// One packed B tile: rows `k0..k0 + 32` × columns `n0..n0 + 16` of the `k × n` operand
/// `b` (zeros outside it), part `part`, into `dst` (512 values).
#[inline]
fn b_tile(b: &Operand<'_>, k: usize, n: usize, k0: usize, n0: usize, part: Part, dst: &mut [u16]) {
    let (rs, cs) = b.strides();
    let avx512 = super::features().avx512;
    let full = n0 + TILE_ROWS <= n && k0 + TILE_K <= k;
    if avx512 && full && rs == 1 {
        // SAFETY: AVX-512 is present; the 16 columns n0.. and 32 rows k0.. are inside
        // the operand (`full`); `dst` holds 512 values.
        unsafe { avx512::b_tile_k_contiguous(b, k0, n0, part, dst) };
    } else if avx512 && full && cs == 1 {
        // SAFETY: as above, with unit column stride.
        unsafe { avx512::b_tile_n_contiguous(b, k0, n0, part, dst) };
    } else {
        for p in 0..TILE_ROWS {
            for c in 0..TILE_ROWS {
                for e in 0..2 {
                    let (kk, nn) = (k0 + 2 * p + e, n0 + c);
                    dst[p * 32 + 2 * c + e] = if kk < k && nn < n {
                        b.get(kk, nn, part)
                    } else {
                        0
                    };
                }
            }
        }
    }
}

/// One row of VNNI pair words, `out[x] = bf16(even[x]) | bf16(odd[x]) << 16`, rounded
/// as the packers round (`odd` absent: zeros), for kernels that read pair planes in place.
/// Panics if a slice is shorter than `out`.
pub fn pair_row(even: &[f32], odd: Option<&[f32]>, out: &mut [u32]) {
    let n = out.len();
    let (even, odd) = (&even[..n], odd.map(|o| &o[..n]));
    let mut done = 0;
    if super::features().avx512 {
        done = n / 16 * 16;
        // SAFETY: AVX-512 is present; the first `done` values of every slice exist.
        unsafe { avx512::pair_words(&even[..done], odd.map(|o| &o[..done]), &mut out[..done]) };
    }
    for x in done..n {
        let hi = odd.map_or(0, |o| u32::from(bf16_bits(o[x])));
        out[x] = u32::from(bf16_bits(even[x])) | hi << 16;
    }
}

/// `out[x] = bf16(src[x])`, rounded as the packers round, so a bf16 tensor made of these
/// packs to the words its f32 source would. Panics if `src` is shorter than `out`.
pub fn round_row(src: &[f32], out: &mut [u16]) {
    let n = out.len();
    let src = &src[..n];
    let mut done = 0;
    if super::features().avx512 {
        done = n / 32 * 32;
        // SAFETY: AVX-512 is present; the first `done` values of both slices exist.
        unsafe { avx512::round_words(&src[..done], &mut out[..done]) };
    }
    for x in done..n {
        out[x] = bf16_bits(src[x]);
    }
}

/// The packers' bf16 rounding of 32 f32 lanes (AVX-512), for kernels that write packed
/// operands themselves.
#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::bf16_words;

#[cfg(target_arch = "x86_64")]
mod avx512 {
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
            63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25, 23, 21,
            19, 17, 15, 13, 11, 9, 7, 5, 3, 1,
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
        match a {
            Operand::F32(m) => {
                let i = m.index(row, 0);
                assert!(i + steps * 32 <= m.data.len());
                for s in 0..steps {
                    // SAFETY: values i + 32s .. i + 32s + 32 are inside the slice and
                    // the 32 words at at + s·stride inside `out` (both asserted).
                    unsafe {
                        let p = m.data.as_ptr().add(i + 32 * s);
                        let x0 = split16(_mm512_loadu_ps(p), part);
                        let x1 = split16(_mm512_loadu_ps(p.add(16)), part);
                        _mm512_storeu_si512(dst.add(at + s * stride).cast(), high_words(x0, x1));
                    }
                }
            }
            Operand::Bf16(m) => {
                let i = m.index(row, 0);
                assert!(i + steps * 32 <= m.data.len());
                for s in 0..steps {
                    // SAFETY: as above, for 32 bf16 values.
                    unsafe {
                        let v = match part {
                            Part::Hi => _mm512_loadu_si512(m.data.as_ptr().add(i + 32 * s).cast()),
                            Part::Lo => _mm512_setzero_si512(),
                        };
                        _mm512_storeu_si512(dst.add(at + s * stride).cast(), v);
                    }
                }
            }
            Operand::Fp8(m, table) => {
                let i = m.index(row, 0);
                assert!(i + steps * 32 <= m.data.len());
                for s in 0..steps {
                    // SAFETY: as above, for 32 codes.
                    unsafe {
                        let v = match part {
                            Part::Hi => {
                                let p = m.data.as_ptr().add(i + 32 * s);
                                super::super::fp8::words32(_mm256_loadu_si256(p.cast()), table)
                            }
                            Part::Lo => _mm512_setzero_si512(),
                        };
                        _mm512_storeu_si512(dst.add(at + s * stride).cast(), v);
                    }
                }
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
                                _mm256_castsi128_si256(_mm_loadu_si128(
                                    m.data.as_ptr().add(i0).cast(),
                                )),
                                _mm256_castsi128_si256(_mm_loadu_si128(
                                    m.data.as_ptr().add(i1).cast(),
                                )),
                            )
                        };
                        let lo16 = |x| {
                            let w = super::super::fp8::words32(x, table);
                            _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(
                                w,
                            )))
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
}

#[cfg(not(target_arch = "x86_64"))]
mod avx512 {
    //! No AVX-512 off x86_64: the scalar packers run (`features().avx512` is false).
    use super::{Operand, Part};
    pub(super) unsafe fn row_steps(
        _: &Operand<'_>,
        _: usize,
        _: usize,
        _: Part,
        _: &mut [u16],
        _: usize,
        _: usize,
    ) {
        unreachable!("AVX-512 is never detected off x86_64")
    }
    pub(super) unsafe fn b_tile_k_contiguous(
        _: &Operand<'_>,
        _: usize,
        _: usize,
        _: Part,
        _: &mut [u16],
    ) {
        unreachable!("AVX-512 is never detected off x86_64")
    }
    pub(super) unsafe fn b_tiles_k_contiguous(
        _: &Operand<'_>,
        _: usize,
        _: usize,
        _: Part,
        _: &mut [u16],
        _: usize,
        _: usize,
    ) {
        unreachable!("AVX-512 is never detected off x86_64")
    }
    pub(super) unsafe fn b_tile_n_contiguous(
        _: &Operand<'_>,
        _: usize,
        _: usize,
        _: Part,
        _: &mut [u16],
    ) {
        unreachable!("AVX-512 is never detected off x86_64")
    }
    pub(super) unsafe fn pair_words(_: &[f32], _: Option<&[f32]>, _: &mut [u32]) {
        unreachable!("AVX-512 is never detected off x86_64")
    }
    pub(super) unsafe fn round_words(_: &[f32], _: &mut [u16]) {
        unreachable!("AVX-512 is never detected off x86_64")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) as f32 / 4.0e9 - 0.5)
                    * 3.0
            })
            .collect()
    }

    #[test]
    fn bf16_rounding_is_nearest_even_like_half() {
        // 0x3f808000 and 0x3f818000 sit exactly halfway between two bf16 values.
        let ties = [f32::from_bits(0x3f80_8000), f32::from_bits(0x3f81_8000)];
        for x in [
            0.0f32,
            -0.0,
            1.0,
            ties[0],
            ties[1],
            -3.5e-20,
            3.0e38,
            f32::INFINITY,
        ] {
            assert_eq!(bf16_bits(x), bf16::from_f32(x).to_bits(), "{x}");
        }
        assert_eq!(bf16_bits(f32::NAN), 0x7fc0);
        let x = 1.2345678f32;
        let hi = f32::from_bits(u32::from(split(x, Part::Hi)) << 16);
        let lo = f32::from_bits(u32::from(split(x, Part::Lo)) << 16);
        assert!(((hi + lo) - x).abs() < x * 2e-5, "hi + lo is near x");
    }

    #[test]
    fn rounded_rows_hold_the_packers_words() {
        let mut src = values(77, 5);
        src[3] = f32::NAN;
        src[40] = f32::from_bits(0x3f80_8000);
        src[70] = f32::INFINITY;
        let mut out = vec![0u16; 77];
        round_row(&src, &mut out);
        let want: Vec<u16> = src.iter().map(|&x| bf16_bits(x)).collect();
        assert_eq!(out, want);
    }

    fn pack_both(op: &Operand<'_>, k: usize, n: usize, parts: &[Part]) -> Vec<u16> {
        let mut out = vec![7u16; packed_len(n, k, parts.len())];
        pack_b(op, k, n, 0..n.div_ceil(PANEL), parts, &mut out);
        out
    }

    /// B packed by the layout formula, element by element.
    fn reference_b(op: &Operand<'_>, k: usize, n: usize, parts: &[Part]) -> Vec<u16> {
        let (ks, np) = (k.div_ceil(TILE_K), parts.len());
        let mut out = vec![0u16; packed_len(n, k, np)];
        for jb in 0..n.div_ceil(PANEL) {
            for s in 0..ks {
                for (q, &part) in parts.iter().enumerate() {
                    for t in 0..2 {
                        for p in 0..TILE_ROWS {
                            for c in 0..TILE_ROWS {
                                for e in 0..2 {
                                    let (kk, nn) =
                                        (s * TILE_K + 2 * p + e, jb * PANEL + t * 16 + c);
                                    let at = ((jb * ks + s) * np + q) * KSTEP_LEN
                                        + t * 512
                                        + p * 32
                                        + 2 * c
                                        + e;
                                    if kk < k && nn < n {
                                        out[at] = op.get(kk, nn, part);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn simd_packers_write_the_scalar_bytes() {
        let (m, k, n) = (37, 70, 50);
        let av = values(m * k, 1);
        let bv = values(k * n, 2);
        let parts = [Part::Hi, Part::Lo];
        // A row-major (fast path) vs the same values through a strided view (scalar path).
        let at: Vec<f32> = (0..k * m).map(|i| av[(i % m) * k + i / m]).collect();
        let fast = Operand::F32(MatRef::row_major(&av, 0, k));
        let slow = Operand::F32(MatRef::row_major(&at, 0, m).t());
        let (mut x, mut y) = (
            vec![1u16; packed_len(m, k, 2)],
            vec![2u16; packed_len(m, k, 2)],
        );
        pack_a(&fast, 0, m, k, &parts, &mut x);
        pack_a(&slow, 0, m, k, &parts, &mut y);
        assert_eq!(x, y);
        // B with n contiguous and with k contiguous, against the layout formula.
        let bt: Vec<f32> = (0..n * k).map(|i| bv[(i % k) * n + i / k]).collect();
        let n_contig = Operand::F32(MatRef::row_major(&bv, 0, n));
        let k_contig = Operand::F32(MatRef::row_major(&bt, 0, k).t());
        let reference = reference_b(&n_contig, k, n, &parts);
        assert_eq!(pack_both(&n_contig, k, n, &parts), reference);
        assert_eq!(pack_both(&k_contig, k, n, &parts), reference);
        // bf16 operands: the bits as they are, zero low parts.
        let bb: Vec<bf16> = bv.iter().map(|&x| bf16::from_bits(bf16_bits(x))).collect();
        let bbt: Vec<bf16> = bt.iter().map(|&x| bf16::from_bits(bf16_bits(x))).collect();
        let b_n = Operand::Bf16(MatRef::row_major(&bb, 0, n));
        let b_k = Operand::Bf16(MatRef::row_major(&bbt, 0, k).t());
        assert_eq!(pack_both(&b_n, k, n, &parts), pack_both(&b_k, k, n, &parts));
        let hi_only = pack_both(&b_n, k, n, &[Part::Hi]);
        assert_eq!(hi_only, pack_both(&n_contig, k, n, &[Part::Hi]));
        // bf16 A: row-major (fast path) vs strided, and equal to f32 A's high part.
        let ab: Vec<bf16> = av.iter().map(|&x| bf16::from_bits(bf16_bits(x))).collect();
        let abt: Vec<bf16> = at.iter().map(|&x| bf16::from_bits(bf16_bits(x))).collect();
        let (mut x, mut y, mut z) = (
            vec![1u16; packed_len(m, k, 2)],
            vec![2u16; packed_len(m, k, 2)],
            vec![3u16; packed_len(m, k, 1)],
        );
        pack_a(
            &Operand::Bf16(MatRef::row_major(&ab, 0, k)),
            0,
            m,
            k,
            &parts,
            &mut x,
        );
        pack_a(
            &Operand::Bf16(MatRef::row_major(&abt, 0, m).t()),
            0,
            m,
            k,
            &parts,
            &mut y,
        );
        pack_a(&fast, 0, m, k, &[Part::Hi], &mut z);
        assert_eq!(x, y);
        let x_hi: Vec<u16> = x.chunks(KSTEP_LEN).step_by(2).flatten().copied().collect();
        assert_eq!(x_hi, z);
    }

    #[test]
    fn packed_b_holds_vnni_pairs_and_zero_tails() {
        let (k, n) = (35, 18);
        let bv = values(k * n, 3);
        let op = Operand::F32(MatRef::row_major(&bv, 0, n));
        let out = pack_both(&op, k, n, &[Part::Hi]);
        let ks = k.div_ceil(TILE_K);
        for kk in 0..ks * TILE_K {
            for nn in 0..PANEL {
                let (s, p, e) = (kk / TILE_K, (kk % TILE_K) / 2, kk % 2);
                let (t, c) = (nn / TILE_ROWS, nn % TILE_ROWS);
                let got = out[s * KSTEP_LEN + t * 512 + p * 32 + 2 * c + e];
                let want = if kk < k && nn < n {
                    bf16_bits(bv[kk * n + nn])
                } else {
                    0
                };
                assert_eq!(got, want, "k {kk} n {nn}");
            }
        }
    }
}
