//! The AVX512-BF16 micro-kernel: one 32 × 32 block of C from the packed panels the AMX
//! tiles read, with `vdpbf16ps` on ZMM registers (Intel Cooper Lake, Sapphire Rapids and
//! later; AMD Zen 4 and Zen 5).
//!
//! A packed k-step (see [`super::pack`]) holds 32 rows of A as two 16-row halves, each
//! row 32 bf16 values (16 pairs of consecutive k), and 32 columns of B as two 16-column
//! halves, each of 16 pair rows of 16 columns × 2 k values: a pair row of B is exactly one
//! `vdpbf16ps` operand, and one pair of an A row broadcast to all 16 lanes is the other.
//! The block is computed in four bands of `BAND` rows: 16 f32 accumulators (8 rows × 2
//! column halves) stay in registers over every k-step of the call, fed by two B loads and
//! eight A broadcasts per pair. Every element sums its pairs in one fixed order (k
//! ascending), so the bytes do not depend on the blocking or the thread. x86-64 only, as
//! the tile kernel beside it.

/// Rows of C one pass of the kernel keeps in registers (× 32 columns).
const BAND: usize = 8;

/// Packed k-steps per K block on this path: the B sub-panel of a block (16 KiB) stays in
/// the 32 KiB L1 while the A panels of the block pass it.
pub const KC: usize = 8;

/// C (32 × 32 f32 at `c`, rows `ldc_bytes` apart) `(load ? C : 0) +=` A panel · B panel
/// over `steps` packed k-steps, prefetching four cache lines per k-step at `pf`.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16; `a` and `b` point at `steps` packed k-steps
/// (2,048 bytes each); the 32 rows of 128 bytes at `c` are writable; `steps ≥ 1`. `pf`
/// may point anywhere (a prefetch never faults).
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn kernel(
    a: *const u16,
    b: *const u16,
    pf: *const u16,
    c: *mut f32,
    ldc_bytes: usize,
    steps: usize,
    load: bool,
) {
    let src = Packed { b, pf };
    for band in 0..32 / BAND {
        // SAFETY: the caller's contract; band rows lie inside the block.
        unsafe { band_kernel(a, &src, c, ldc_bytes, steps, load, band * BAND) };
    }
}

/// [`kernel`] with B read in place from VNNI pair planes (a direct convolution's input,
/// see `conv::planes`): k-step `s`'s pair row `p` (16 columns × 2 k values) starts at
/// `b + offsets[s] + p · pair_stride` and its second 16 columns 32 values further on.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16; `a` points at `steps` packed k-steps; for every
/// `s < steps` (`offsets` holds them) and `p < 16`, the 64 values at
/// `b + offsets[s] + p · pair_stride` are readable; the 32 rows of 128 bytes at `c` are
/// writable; `steps ≥ 1`.
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn kernel_planes(
    a: *const u16,
    b: *const u16,
    offsets: &[isize],
    pair_stride: usize,
    c: *mut f32,
    ldc_bytes: usize,
    load: bool,
) {
    let src = Planes {
        b,
        offsets: offsets.as_ptr(),
        pair_stride,
    };
    for band in 0..32 / BAND {
        // SAFETY: the caller's contract; band rows lie inside the block.
        unsafe { band_kernel(a, &src, c, ldc_bytes, offsets.len(), load, band * BAND) };
    }
}

/// Where the kernel finds each k-step's B pair rows.
trait BSource {
    /// Pair row `p` of k-step `s` (its first 16 columns; the next 16 follow at +`HALF`).
    ///
    /// # Safety
    /// `s` is a k-step of the call and `p < 16`.
    unsafe fn pair(&self, s: usize, p: usize) -> *const u16;
    /// `u16` values from a pair row's first 16 columns to its second 16.
    fn half(&self) -> usize;
    /// Prefetches ahead of k-step `s` (once per k-step, from the first band).
    ///
    /// # Safety
    /// Any address may be prefetched; `s` is a k-step of the call.
    unsafe fn prefetch(&self, s: usize);
}

/// Packed B panels ([`super::pack`]): 1,024 values a k-step, the halves 512 apart.
struct Packed {
    b: *const u16,
    pf: *const u16,
}

impl BSource for Packed {
    #[inline(always)]
    unsafe fn pair(&self, s: usize, p: usize) -> *const u16 {
        // SAFETY: inside the caller's `steps` packed k-steps.
        unsafe { self.b.add(s * 1024 + p * 32) }
    }

    #[inline(always)]
    fn half(&self) -> usize {
        512
    }

    #[inline(always)]
    unsafe fn prefetch(&self, s: usize) {
        use std::arch::x86_64::*;
        // SAFETY: a prefetch never faults.
        unsafe {
            let p = self.pf.wrapping_add(s * 128).cast::<i8>();
            _mm_prefetch::<_MM_HINT_T0>(p);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(128));
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(192));
        }
    }
}

/// VNNI pair planes read in place, one offset per k-step.
struct Planes {
    b: *const u16,
    offsets: *const isize,
    pair_stride: usize,
}

impl BSource for Planes {
    #[inline(always)]
    unsafe fn pair(&self, s: usize, p: usize) -> *const u16 {
        // SAFETY: `offsets` holds every k-step of the call; the result is inside the
        // planes by the caller's contract.
        unsafe {
            self.b
                .offset(*self.offsets.add(s))
                .add(p * self.pair_stride)
        }
    }

    #[inline(always)]
    fn half(&self) -> usize {
        32
    }

    #[inline(always)]
    unsafe fn prefetch(&self, _: usize) {}
}

/// Rows `r0..r0 + BAND` of [`kernel`]'s block.
///
/// # Safety
/// As for [`kernel`] (or [`kernel_planes`], by `src`); `r0 + BAND ≤ 32` and `r0` is a
/// multiple of [`BAND`].
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn band_kernel<S: BSource>(
    a: *const u16,
    src: &S,
    c: *mut f32,
    ldc_bytes: usize,
    steps: usize,
    load: bool,
    r0: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: every pointer below stays inside the caller's buffers: C rows r0..r0 + 8
    // (columns 0..32), A rows r0..r0 + 8 of each k-step (half r0 / 16, row r0 % 16 on),
    // B's two halves of each k-step's pair rows (`src`).
    unsafe {
        let mut acc = super::fma::load_band::<BAND>(c, ldc_bytes, r0, load);
        // A rows of this band within a k-step: half r0 / 16 (1,024 bytes each), row r0 % 16.
        let a_band = a.add((r0 / 16) * 512 + (r0 % 16) * 32);
        let half = src.half();
        for s in 0..steps {
            let ap = a_band.add(s * 1024);
            if r0 == 0 {
                src.prefetch(s);
            }
            for p in 0..16 {
                let bp = src.pair(s, p);
                let b0: __m512bh = std::mem::transmute(_mm512_loadu_ps(bp.cast()));
                let b1: __m512bh = std::mem::transmute(_mm512_loadu_ps(bp.add(half).cast()));
                for (r, pair) in acc.iter_mut().enumerate() {
                    let bits = ap.add(r * 32 + p * 2).cast::<i32>().read_unaligned();
                    let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(bits));
                    pair[0] = _mm512_dpbf16_ps(pair[0], x, b0);
                    pair[1] = _mm512_dpbf16_ps(pair[1], x, b1);
                }
            }
        }
        super::fma::store_band(&acc, c, ldc_bytes, r0);
    }
}
