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
mod avx512;

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
