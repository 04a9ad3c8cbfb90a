//! The AVX-512F f32 micro-kernel of the direct convolution (`conv::planes`): one 32 × 32
//! block of C from an f32 A panel (`[k][32]`, a row of 32 output channels per k) and B
//! rows of 32 columns read in place from f32 planes, one offset per k. The block is
//! computed in four bands of `BAND` rows: 16 accumulators (8 rows × 2 column halves)
//! stay in registers over every k of the call, fed by two B loads and eight A broadcasts
//! per k. Each element is one chain of fused multiply-adds in k order, so the bytes do
//! not depend on the blocking or the thread. x86-64 only.

/// Rows of C one pass keeps in registers (× 32 columns).
const BAND: usize = 8;

/// C (32 × 32 f32 at `c`, rows `ldc_bytes` apart) `(load ? C : 0) +=` A · B over the
/// `offsets.len()` values of k: A row `k` is the 32 f32 at `a + 32k`, B row `k` the 32 f32
/// at `b + offsets[k]`.
///
/// # Safety
/// The CPU has AVX-512F; `a` holds `32 · offsets.len()` f32; for every k the 32 f32 at
/// `b + offsets[k]` are readable; the 32 rows of 128 bytes at `c` are writable.
#[target_feature(enable = "avx512f")]
pub unsafe fn kernel_planes(
    a: *const f32,
    b: *const f32,
    offsets: &[isize],
    c: *mut f32,
    ldc_bytes: usize,
    load: bool,
) {
    for band in 0..32 / BAND {
        // SAFETY: the caller's contract; band rows lie inside the block.
        unsafe { band_kernel(a, b, offsets, c, ldc_bytes, load, band * BAND) };
    }
}

/// Rows `r0..r0 + BAND` of [`kernel_planes`]' block.
///
/// # Safety
/// As for [`kernel_planes`]; `r0 + BAND ≤ 32`.
#[target_feature(enable = "avx512f")]
unsafe fn band_kernel(
    a: *const f32,
    b: *const f32,
    offsets: &[isize],
    c: *mut f32,
    ldc_bytes: usize,
    load: bool,
    r0: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: every pointer stays inside the caller's buffers: C rows r0..r0 + 8 (columns
    // 0..32), A row k's values r0..r0 + 8, B row k's 32 values.
    unsafe {
        let mut acc = load_band::<BAND>(c, ldc_bytes, r0, load);
        for (k, &off) in offsets.iter().enumerate() {
            let bp = b.offset(off);
            let (b0, b1) = (_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16)));
            let ap = a.add(k * 32 + r0);
            for (r, pair) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*ap.add(r));
                pair[0] = _mm512_fmadd_ps(x, b0, pair[0]);
                pair[1] = _mm512_fmadd_ps(x, b1, pair[1]);
            }
        }
        store_band(&acc, c, ldc_bytes, r0);
    }
}

/// Rows `r0..r0 + N` (32 f32 each, `ldc_bytes` apart from `c`) as accumulators: loaded
/// when `load`, else zero.
///
/// # Safety
/// AVX-512F present; when `load`, the rows are readable.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn load_band<const N: usize>(
    c: *const f32,
    ldc_bytes: usize,
    r0: usize,
    load: bool,
) -> [[std::arch::x86_64::__m512; 2]; N] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; N];
    if load {
        for (r, pair) in acc.iter_mut().enumerate() {
            // SAFETY: the caller's rows are readable.
            unsafe {
                let row = c.cast::<u8>().add((r0 + r) * ldc_bytes).cast::<f32>();
                pair[0] = _mm512_loadu_ps(row);
                pair[1] = _mm512_loadu_ps(row.add(16));
            }
        }
    }
    acc
}

/// The accumulators of [`load_band`] stored back into their rows.
///
/// # Safety
/// AVX-512F present; the rows are writable.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store_band<const N: usize>(
    acc: &[[std::arch::x86_64::__m512; 2]; N],
    c: *mut f32,
    ldc_bytes: usize,
    r0: usize,
) {
    use std::arch::x86_64::*;
    for (r, pair) in acc.iter().enumerate() {
        // SAFETY: the caller's rows are writable.
        unsafe {
            let row = c.cast::<u8>().add((r0 + r) * ldc_bytes).cast::<f32>();
            _mm512_storeu_ps(row, pair[0]);
            _mm512_storeu_ps(row.add(16), pair[1]);
        }
    }
}

/// [`kernel_planes`] over 64 columns: C is two 32 × 32 blocks (`c0`, then `c1` for
/// columns 32..64), B row `k` the 64 f32 at `b + offsets[k]`. Bands of four rows × four
/// column quarters halve the broadcasts per multiply-add.
///
/// # Safety
/// As for [`kernel_planes`], with 64 readable f32 per B row and both blocks writable.
#[target_feature(enable = "avx512f")]
pub unsafe fn kernel_planes_wide(
    a: *const f32,
    b: *const f32,
    offsets: &[isize],
    c0: *mut f32,
    c1: *mut f32,
    ldc_bytes: usize,
    load: bool,
) {
    for band in 0..32 / WIDE_BAND {
        // SAFETY: the caller's contract; band rows lie inside both blocks.
        unsafe { wide_band(a, b, offsets, [c0, c1], ldc_bytes, load, band * WIDE_BAND) };
    }
}

/// Rows of C one pass of [`kernel_planes_wide`] keeps in registers (× 64 columns).
const WIDE_BAND: usize = 4;

/// Rows `r0..r0 + WIDE_BAND` of [`kernel_planes_wide`]' two blocks.
///
/// # Safety
/// As for [`kernel_planes_wide`]; `r0 + WIDE_BAND ≤ 32`.
#[target_feature(enable = "avx512f")]
unsafe fn wide_band(
    a: *const f32,
    b: *const f32,
    offsets: &[isize],
    c: [*mut f32; 2],
    ldc_bytes: usize,
    load: bool,
    r0: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: every pointer stays inside the caller's buffers: each block's rows r0..r0 + 4,
    // A row k's values r0..r0 + 4, B row k's 64 values.
    unsafe {
        let mut left = load_band::<WIDE_BAND>(c[0], ldc_bytes, r0, load);
        let mut right = load_band::<WIDE_BAND>(c[1], ldc_bytes, r0, load);
        for (k, &off) in offsets.iter().enumerate() {
            let bp = b.offset(off);
            let bv = [
                _mm512_loadu_ps(bp),
                _mm512_loadu_ps(bp.add(16)),
                _mm512_loadu_ps(bp.add(32)),
                _mm512_loadu_ps(bp.add(48)),
            ];
            let ap = a.add(k * 32 + r0);
            for r in 0..WIDE_BAND {
                let x = _mm512_set1_ps(*ap.add(r));
                left[r][0] = _mm512_fmadd_ps(x, bv[0], left[r][0]);
                left[r][1] = _mm512_fmadd_ps(x, bv[1], left[r][1]);
                right[r][0] = _mm512_fmadd_ps(x, bv[2], right[r][0]);
                right[r][1] = _mm512_fmadd_ps(x, bv[3], right[r][1]);
            }
        }
        store_band(&left, c[0], ldc_bytes, r0);
        store_band(&right, c[1], ldc_bytes, r0);
    }
}
