//! Int8 products for W8A8 linear layers: `y = x · Wᵀ` with `W` quantized per output
//! channel and `x` per row (token), both symmetric, the sums exact in i32 and scaled to
//! f32 in the epilogue.
//!
//! - **Activations** ([`quantize_rows`]): row `r` has scale `s_r = max|x_r| / 127`, and
//!   `q = round(x / s_r)` in [−127, 127] is stored as the byte `q + 128` (unsigned, the
//!   operand `vpdpbusd` multiplies unsigned), zero-padded to a whole quad of k.
//! - **Weights** ([`pack_weight`]): `[n, k]` int8 values in panels of [`PANEL`] output
//!   columns; a panel holds, for each quad of 4 consecutive k, 2 halves × 16 columns × 4
//!   bytes: one half is exactly one `vpdpbusd` operand, and a row's quad of A broadcast to
//!   the 16 lanes is the other. After the panels, one i32 per column:
//!   `128 · Σ_k w[c][k]`, what the unsigned shift of A adds and the epilogue takes away.
//! - **Sums**: each element is the exact integer `Σ_k q_x · q_w` (|sum| < 2³¹ for
//!   k < 133,000), whatever the path, blocking or thread; the epilogue then computes
//!   `(sum as f32 · s_r) · s_c` in one fixed order, so every path and thread count gives
//!   the same bytes.
//!
//! The AVX512-VNNI micro-kernel keeps [`BAND`] rows × 32 columns of i32 accumulators in
//! registers over the whole of k (B streams from L2, A rows from L2/L3); the scalar loop
//! computes the same integers.

use crate::dtype::Element;

/// Output columns per packed panel.
pub const PANEL: usize = 32;
/// k values per `vpdpbusd` lane.
pub const QUAD: usize = 4;
/// Rows of C one pass of the VNNI kernel keeps in registers (2 × `BAND` accumulators).
pub const BAND: usize = 12;
/// Bytes of one packed quad of a panel (2 halves × 16 columns × 4 k).
const QUAD_BYTES: usize = PANEL * QUAD;
/// Quantized A bytes one row block holds (it stays in L2 across the worker's panels).
const ROW_BLOCK_BYTES: usize = 192 << 10;

/// k rounded up to a whole quad: the row length of quantized activations.
pub fn padded_k(k: usize) -> usize {
    k.div_ceil(QUAD) * QUAD
}

/// Bytes of a packed `[n, k]` weight: the panels, then one i32 per padded column.
pub fn packed_len(n: usize, k: usize) -> usize {
    let panels = n.div_ceil(PANEL);
    panels * (k.div_ceil(QUAD) * QUAD_BYTES) + panels * PANEL * 4
}

/// Symmetric per-row quantization of `x` (`rows × k`, row-major, f32 or a storage type
/// widened on the way) into `out` (`rows × padded_k(k)` bytes, `q + 128`, padding 128)
/// and `scales` (one per row), rows split over the kernel pool (call inside
/// [`crate::parallel::run`]; each row's bytes depend on that row alone). `q` is
/// `x · (127 / max|x|)` rounded to nearest even: AVX-512 where the path has it, the
/// same operations in plain code elsewhere. A row of zeros (or one whose largest
/// magnitude is not finite) quantizes to zeros with scale 0.
pub fn quantize_rows<T: QuantSource>(x: &[T], k: usize, out: &mut [u8], scales: &mut [f32]) {
    use rayon::prelude::*;
    let kp = padded_k(k);
    let simd = Int8Kernel::selected() == Int8Kernel::Vnni;
    x.par_chunks_exact(k)
        .zip(out.par_chunks_exact_mut(kp))
        .zip(scales.par_iter_mut())
        .with_min_len(8)
        .for_each(|((row, dst), scale)| {
            let amax = T::max_abs(row, simd);
            if amax == 0.0 || !amax.is_finite() {
                dst.fill(128);
                *scale = 0.0;
                return;
            }
            T::quantize(row, 127.0 / amax, &mut dst[..k], simd);
            dst[k..].fill(128);
            *scale = amax / 127.0;
        });
}

/// One activation value quantized: `v · inv` rounded to nearest even, clamped to
/// [−127, 127], shifted to unsigned.
#[inline(always)]
fn quantize_one(v: f32, inv: f32) -> u8 {
    ((v * inv).round_ties_even().clamp(-127.0, 127.0) as i32 + 128) as u8
}

/// A storage type activations are quantized from.
pub trait QuantSource: Element {
    /// The largest |v| of a row (NaNs ignored), through AVX-512 when `simd`.
    fn max_abs(row: &[Self], simd: bool) -> f32;
    /// Each value quantized (`x · inv` rounded to nearest even, clamped to ±127, plus
    /// 128) into `dst`, through AVX-512 when `simd`.
    fn quantize(row: &[Self], inv: f32, dst: &mut [u8], simd: bool);
}

/// [`QuantSource`] for a type the AVX-512 halves read (`$load` widens 16 of them).
macro_rules! simd_source {
    ($t:ty, $load:path) => {
        impl QuantSource for $t {
            fn max_abs(row: &[$t], simd: bool) -> f32 {
                #[cfg(target_arch = "x86_64")]
                if simd {
                    // SAFETY: `simd` is set only where the CPU has AVX-512 (the VNNI
                    // kernel); the row's values are readable.
                    return unsafe { avx512::max_abs(row.as_ptr(), row.len(), $load) };
                }
                let _ = simd;
                row.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()))
            }
            fn quantize(row: &[$t], inv: f32, dst: &mut [u8], simd: bool) {
                #[cfg(target_arch = "x86_64")]
                if simd {
                    // SAFETY: as above; `dst` has `row.len()` bytes.
                    return unsafe { avx512::quantize(row.as_ptr(), row.len(), inv, dst, $load) };
                }
                let _ = simd;
                for (d, &v) in dst.iter_mut().zip(row) {
                    *d = quantize_one(v.to_f32(), inv);
                }
            }
        }
    };
}

simd_source!(f32, avx512::load_f32);
simd_source!(half::bf16, avx512::load_bf16);

impl QuantSource for half::f16 {
    fn max_abs(row: &[half::f16], _: bool) -> f32 {
        row.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()))
    }
    fn quantize(row: &[half::f16], inv: f32, dst: &mut [u8], _: bool) {
        for (d, &v) in dst.iter_mut().zip(row) {
            *d = quantize_one(v.to_f32(), inv);
        }
    }
}

/// The AVX-512 halves of [`quantize_rows`]: the same operations 16 lanes at a time, the
/// tail in plain code.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Loads 16 f32 lanes.
    ///
    /// # Safety
    /// 16 values are readable at `p`; the CPU has AVX-512F.
    #[inline(always)]
    pub(super) unsafe fn load_f32(p: *const f32) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p) }
    }

    /// Loads 16 bf16 lanes widened to f32 (exactly: a bf16 is an f32's top half).
    ///
    /// # Safety
    /// 16 values are readable at `p`; the CPU has AVX-512F.
    #[inline(always)]
    pub(super) unsafe fn load_bf16(p: *const half::bf16) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }

    /// The largest |v| of `len` values at `p`, NaNs ignored.
    ///
    /// # Safety
    /// `len` values are readable at `p`; the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn max_abs<T: super::Element>(
        p: *const T,
        len: usize,
        load: unsafe fn(*const T) -> __m512,
    ) -> f32 {
        // SAFETY: the loads read whole 16-value groups inside `len`.
        unsafe {
            let mut m = _mm512_setzero_ps();
            let full = len / 16 * 16;
            let mut i = 0;
            while i < full {
                // max(x, m) keeps m where x is NaN, as f32::max does.
                m = _mm512_max_ps(_mm512_abs_ps(load(p.add(i))), m);
                i += 16;
            }
            let mut best = _mm512_reduce_max_ps(m);
            for j in full..len {
                best = best.max((*p.add(j)).to_f32().abs());
            }
            best
        }
    }

    /// [`super::quantize_one`] of `len` values at `p` into `dst`.
    ///
    /// # Safety
    /// `len` values are readable at `p` and `dst` holds `len` bytes; the CPU has
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn quantize<T: super::Element>(
        p: *const T,
        len: usize,
        inv: f32,
        dst: &mut [u8],
        load: unsafe fn(*const T) -> __m512,
    ) {
        // SAFETY: the loads read whole 16-value groups inside `len`; each store writes
        // 16 bytes inside `dst`.
        unsafe {
            let scale = _mm512_set1_ps(inv);
            let (lo, hi, shift) = (
                _mm512_set1_epi32(-127),
                _mm512_set1_epi32(127),
                _mm512_set1_epi32(128),
            );
            let full = len / 16 * 16;
            let mut i = 0;
            while i < full {
                // Round to nearest even (MXCSR's default), as `round_ties_even`.
                let q = _mm512_cvtps_epi32(_mm512_mul_ps(load(p.add(i)), scale));
                let q = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(q, lo), hi), shift);
                _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), _mm512_cvtepi32_epi8(q));
                i += 16;
            }
            for (j, d) in dst.iter_mut().enumerate().take(len).skip(full) {
                *d = super::quantize_one((*p.add(j)).to_f32(), inv);
            }
        }
    }
}

/// Symmetric per-row quantization of a weight `[n, k]` (row-major): the int8 values and
/// each row's scale `max|w| / 127` (0 for a zero row).
pub fn quantize_weight(w: &[f32], k: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = vec![0i8; w.len()];
    let mut scales = Vec::with_capacity(w.len() / k.max(1));
    for (row, dst) in w.chunks_exact(k).zip(q.chunks_exact_mut(k)) {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 || !amax.is_finite() {
            scales.push(0.0);
            continue;
        }
        let inv = 127.0 / amax;
        for (d, &v) in dst.iter_mut().zip(row) {
            *d = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
        scales.push(amax / 127.0);
    }
    (q, scales)
}

/// Packs int8 `w` (`[n, k]`, row-major) into `out` ([`packed_len`] bytes) as described
/// in the module doc.
pub fn pack_weight(w: &[i8], n: usize, k: usize, out: &mut [u8]) {
    let quads = k.div_ceil(QUAD);
    let panels = n.div_ceil(PANEL);
    let body = panels * quads * QUAD_BYTES;
    let (panel_bytes, comp_bytes) = out.split_at_mut(body);
    for (p, panel) in panel_bytes.chunks_exact_mut(quads * QUAD_BYTES).enumerate() {
        for (q, quad) in panel.chunks_exact_mut(QUAD_BYTES).enumerate() {
            for (j, lane) in quad.chunks_exact_mut(QUAD).enumerate() {
                // Half j / 16, column j % 16 of it: column p·32 + j of the panel.
                let col = p * PANEL + j;
                for (i, byte) in lane.iter_mut().enumerate() {
                    let kk = q * QUAD + i;
                    *byte = if col < n && kk < k {
                        w[col * k + kk] as u8
                    } else {
                        0
                    };
                }
            }
        }
    }
    for (col, c) in comp_bytes.chunks_exact_mut(4).enumerate() {
        let sum: i32 = if col < n {
            w[col * k..(col + 1) * k]
                .iter()
                .map(|&v| i32::from(v))
                .sum()
        } else {
            0
        };
        c.copy_from_slice(&(128 * sum).to_le_bytes());
    }
}

/// The compensation of packed column `col` (`128 · Σ_k w[col][k]`).
fn compensation(packed: &[u8], n: usize, k: usize, col: usize) -> i32 {
    let body = n.div_ceil(PANEL) * k.div_ceil(QUAD) * QUAD_BYTES;
    let at = body + col * 4;
    i32::from_le_bytes([packed[at], packed[at + 1], packed[at + 2], packed[at + 3]])
}

/// Value `[col][i]` of a packed `[n, k]` weight.
pub fn packed_value(packed: &[u8], k: usize, col: usize, i: usize) -> i8 {
    let quads = k.div_ceil(QUAD);
    let (p, j) = (col / PANEL, col % PANEL);
    packed[p * quads * QUAD_BYTES + (i / QUAD) * QUAD_BYTES + j * QUAD + i % QUAD] as i8
}

/// One finished block of the product: rows `row..row + h`, columns `col..col + w`, the
/// scaled f32 values in `data` (`h` rows, `PANEL` apart).
#[derive(Debug)]
pub struct Block<'a> {
    /// First row.
    pub row: usize,
    /// First column.
    pub col: usize,
    /// Rows.
    pub h: usize,
    /// Columns.
    pub w: usize,
    /// `h × PANEL` values, row-major (the first `w` of each row are the block's).
    pub data: &'a mut [f32],
}

/// How the kernel multiplies: the VNNI micro-kernel or plain loops (the same integers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int8Kernel {
    /// Plain Rust loops.
    Scalar,
    /// AVX-512 VNNI `vpdpbusd`.
    Vnni,
}

impl Int8Kernel {
    /// The kernel the selected CPU path runs int8 products with: VNNI where the path is
    /// an AVX-512 one and the CPU has AVX512_VNNI, else the plain loops.
    pub fn selected() -> Self {
        let path = super::selected();
        let f = super::features();
        if path >= super::CpuPath::Avx512 && f.avx512_vnni {
            Int8Kernel::Vnni
        } else {
            Int8Kernel::Scalar
        }
    }
}

/// `C = A · Bᵀ` for quantized `a` (`m × padded_k(k)` bytes from [`quantize_rows`], with
/// `a_scales`) and a packed weight (`n` columns, `w_scales`), handing each finished block
/// to `sink` with its values already scaled: `(Σ q_a·q_w as f32 · a_scale) · w_scale`.
/// Panels are split over `threads` workers of the kernel pool (call inside
/// [`crate::parallel::run`]); each block reaches `sink` exactly once.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: &[u8],
    a_scales: &[f32],
    packed: &[u8],
    w_scales: &[f32],
    threads: usize,
    kernel: Int8Kernel,
    sink: &(dyn Fn(Block<'_>) + Sync),
) {
    use rayon::prelude::*;
    let kp = padded_k(k);
    assert!(
        a.len() >= m * kp && a_scales.len() >= m,
        "int8 gemm: A too short"
    );
    assert!(
        packed.len() >= packed_len(n, k),
        "int8 gemm: packed B too short"
    );
    assert!(w_scales.len() >= n, "int8 gemm: scales too short");
    let panels = n.div_ceil(PANEL);
    let workers = threads.clamp(1, panels.max(1));
    let quads = k.div_ceil(QUAD);
    // Rows in blocks whose quantized A stays in L2 while every panel of the worker
    // passes over it (A would otherwise stream from L3 once per panel).
    let block_rows = (ROW_BLOCK_BYTES / kp.max(1)).max(BAND) / BAND * BAND;
    (0..workers).into_par_iter().for_each(|t| {
        let (p0, p1) = (panels * t / workers, panels * (t + 1) / workers);
        let mut acc = [0i32; BAND * PANEL];
        let mut out = [0f32; BAND * PANEL];
        // Each panel's columns, compensations and scales, read once for every row block.
        let weights: Vec<(usize, usize, [i32; PANEL], [f32; PANEL])> = (p0..p1)
            .map(|p| {
                let col = p * PANEL;
                let w = PANEL.min(n - col);
                let comp = std::array::from_fn(|j| {
                    if j < w {
                        compensation(packed, n, k, col + j)
                    } else {
                        0
                    }
                });
                let scales = std::array::from_fn(|j| if j < w { w_scales[col + j] } else { 0.0 });
                (col, w, comp, scales)
            })
            .collect();
        let mut block = 0;
        while block < m {
            let block_end = (block + block_rows).min(m);
            for (p, &(col, w, comp, sw)) in (p0..p1).zip(&weights) {
                let panel = &packed[p * quads * QUAD_BYTES..(p + 1) * quads * QUAD_BYTES];
                let mut row = block;
                while row < block_end {
                    let h = BAND.min(block_end - row);
                    let a_rows = &a[row * kp..(row + h) * kp];
                    sums(kernel, a_rows, kp, h, panel, quads, &mut acc);
                    for r in 0..h {
                        let sa = a_scales[row + r];
                        let (acc, out) =
                            (&acc[r * PANEL..][..PANEL], &mut out[r * PANEL..][..PANEL]);
                        for j in 0..PANEL {
                            out[j] = ((acc[j] - comp[j]) as f32 * sa) * sw[j];
                        }
                    }
                    sink(Block {
                        row,
                        col,
                        h,
                        w,
                        data: &mut out[..h * PANEL],
                    });
                    row += h;
                }
            }
            block = block_end;
        }
    });
}

/// The raw sums `Σ_k a[r][k] · w[j][k]` (A unsigned-shifted, so still including the
/// compensation) of `h ≤ BAND` rows against one panel, into `acc` (`h × PANEL`).
fn sums(
    kernel: Int8Kernel,
    a: &[u8],
    kp: usize,
    h: usize,
    panel: &[u8],
    quads: usize,
    acc: &mut [i32],
) {
    #[cfg(target_arch = "x86_64")]
    if kernel == Int8Kernel::Vnni {
        // SAFETY: `Vnni` is selected only where the CPU has AVX-512F/BW and VNNI; `a`
        // holds `h` rows of `kp = 4 · quads` bytes, `panel` holds `quads` packed quads,
        // `acc` has room for `h × PANEL` values.
        unsafe { vnni::sums(a, kp, h, panel, quads, acc) };
        return;
    }
    let _ = kernel;
    for r in 0..h {
        let row = &a[r * kp..r * kp + kp];
        for j in 0..PANEL {
            let mut s = 0i32;
            for q in 0..quads {
                // Column j's lane: half j / 16 (64 bytes each), lane j % 16, i.e. j · 4.
                let b = &panel[q * QUAD_BYTES + j * QUAD..][..QUAD];
                for i in 0..QUAD {
                    s += i32::from(row[q * QUAD + i]) * i32::from(b[i] as i8);
                }
            }
            acc[r * PANEL + j] = s;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{BAND, PANEL, QUAD, QUAD_BYTES};

    /// [`super::sums`] with `vpdpbusd`.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX-512BW and AVX512_VNNI; `a` holds `h ≤ BAND` rows of `kp`
    /// bytes (`kp = 4 · quads`); `panel` holds `quads` packed quads; `acc` holds
    /// `h × PANEL` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn sums(
        a: &[u8],
        kp: usize,
        h: usize,
        panel: &[u8],
        quads: usize,
        acc: &mut [i32],
    ) {
        debug_assert!(h <= BAND && a.len() >= h * kp && kp == quads * QUAD);
        debug_assert!(panel.len() >= quads * QUAD_BYTES && acc.len() >= h * PANEL);
        // SAFETY: the caller's contract, forwarded; each arm's row count is `h`.
        unsafe {
            match h {
                12 => band::<12>(a, kp, panel, quads, acc),
                11 => band::<11>(a, kp, panel, quads, acc),
                10 => band::<10>(a, kp, panel, quads, acc),
                9 => band::<9>(a, kp, panel, quads, acc),
                8 => band::<8>(a, kp, panel, quads, acc),
                7 => band::<7>(a, kp, panel, quads, acc),
                6 => band::<6>(a, kp, panel, quads, acc),
                5 => band::<5>(a, kp, panel, quads, acc),
                4 => band::<4>(a, kp, panel, quads, acc),
                3 => band::<3>(a, kp, panel, quads, acc),
                2 => band::<2>(a, kp, panel, quads, acc),
                1 => band::<1>(a, kp, panel, quads, acc),
                _ => unreachable!("h ≤ BAND rows"),
            }
        }
    }

    /// `R` rows × 32 columns over every quad, accumulators in registers.
    ///
    /// # Safety
    /// As for [`sums`] with `h = R`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn band<const R: usize>(
        a: &[u8],
        kp: usize,
        panel: &[u8],
        quads: usize,
        acc: &mut [i32],
    ) {
        use std::arch::x86_64::*;
        // SAFETY: reads stay inside `a` (R rows of kp bytes, 4 bytes at q·4 < kp) and
        // `panel` (quads × 128 bytes); the stores write R × 32 i32 into `acc`.
        unsafe {
            let mut c = [[_mm512_setzero_si512(); 2]; R];
            let ap = a.as_ptr();
            let bp = panel.as_ptr();
            for q in 0..quads {
                let b0 = _mm512_loadu_si512(bp.add(q * QUAD_BYTES).cast());
                let b1 = _mm512_loadu_si512(bp.add(q * QUAD_BYTES + 64).cast());
                for (r, pair) in c.iter_mut().enumerate() {
                    let bits = ap.add(r * kp + q * QUAD).cast::<i32>().read_unaligned();
                    let x = _mm512_set1_epi32(bits);
                    pair[0] = _mm512_dpbusd_epi32(pair[0], x, b0);
                    pair[1] = _mm512_dpbusd_epi32(pair[1], x, b1);
                }
            }
            let out = acc.as_mut_ptr();
            for (r, pair) in c.iter().enumerate() {
                _mm512_storeu_si512(out.add(r * PANEL).cast(), pair[0]);
                _mm512_storeu_si512(out.add(r * PANEL + 16).cast(), pair[1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The product through `kernel`, as `m × n` f32.
    fn product(m: usize, n: usize, k: usize, x: &[f32], w: &[f32], kernel: Int8Kernel) -> Vec<f32> {
        product_on(m, n, k, x, w, kernel, 2)
    }

    /// [`product`] on `threads` workers.
    fn product_on(
        m: usize,
        n: usize,
        k: usize,
        x: &[f32],
        w: &[f32],
        kernel: Int8Kernel,
        threads: usize,
    ) -> Vec<f32> {
        let kp = padded_k(k);
        let (mut a, mut sa) = (vec![0u8; m * kp], vec![0f32; m]);
        quantize_rows(x, k, &mut a, &mut sa);
        let (q, sw) = quantize_weight(w, k);
        let mut packed = vec![0u8; packed_len(n, k)];
        pack_weight(&q, n, k, &mut packed);
        let out = std::sync::Mutex::new(vec![0f32; m * n]);
        let sink = |b: Block<'_>| {
            let mut o = out.lock().unwrap();
            for r in 0..b.h {
                for j in 0..b.w {
                    o[(b.row + r) * n + b.col + j] = b.data[r * PANEL + j];
                }
            }
        };
        crate::parallel::run(|| gemm(m, n, k, &a, &sa, &packed, &sw, threads, kernel, &sink));
        out.into_inner().unwrap()
    }

    /// The same integers in f64, for reference.
    fn reference(m: usize, n: usize, k: usize, x: &[f32], w: &[f32]) -> Vec<f32> {
        let kp = padded_k(k);
        let (mut a, mut sa) = (vec![0u8; m * kp], vec![0f32; m]);
        quantize_rows(x, k, &mut a, &mut sa);
        let (q, sw) = quantize_weight(w, k);
        let mut out = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                let s: i64 = (0..k)
                    .map(|i| (i64::from(a[r * kp + i]) - 128) * i64::from(q[c * k + i]))
                    .sum();
                out[r * n + c] = (s as i32 as f32 * sa[r]) * sw[c];
            }
        }
        out
    }

    #[test]
    fn odd_shapes_give_the_exact_integer_products_on_every_kernel() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (13, 33, 7),
            (25, 64, 130),
            (12, 31, 5),
            (37, 70, 259),
        ] {
            let x = data(m * k, 1);
            let w = data(n * k, 2);
            let want = reference(m, n, k, &x, &w);
            let scalar = product(m, n, k, &x, &w, Int8Kernel::Scalar);
            assert_eq!(scalar, want, "scalar {m}x{n}x{k}");
            if super::super::features().avx512_vnni && super::super::features().avx512 {
                let vnni = product(m, n, k, &x, &w, Int8Kernel::Vnni);
                assert_eq!(vnni, want, "vnni {m}x{n}x{k}");
            }
        }
    }

    #[test]
    fn the_bytes_do_not_depend_on_the_thread_count() {
        let (m, n, k) = (29, 97, 133);
        let (x, w) = (data(m * k, 6), data(n * k, 7));
        let one = product_on(m, n, k, &x, &w, Int8Kernel::selected(), 1);
        for threads in [2, 3, 4] {
            let many = product_on(m, n, k, &x, &w, Int8Kernel::selected(), threads);
            assert_eq!(
                one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                many.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{threads} threads"
            );
        }
    }

    #[test]
    fn the_int8_product_is_close_to_the_f32_one() {
        let (m, n, k) = (16, 48, 512);
        let x = data(m * k, 3);
        let w = data(n * k, 4);
        let got = product(m, n, k, &x, &w, Int8Kernel::Scalar);
        let (mut err, mut norm) = (0f64, 0f64);
        for r in 0..m {
            for c in 0..n {
                let exact: f64 = (0..k)
                    .map(|i| f64::from(x[r * k + i]) * f64::from(w[c * k + i]))
                    .sum();
                err += (f64::from(got[r * n + c]) - exact).powi(2);
                norm += exact * exact;
            }
        }
        let rel = (err / norm).sqrt();
        assert!(rel < 0.02, "relative L2 error {rel}");
    }

    #[test]
    fn quantizing_through_avx512_gives_the_plain_loops_bytes() {
        let f = super::super::features();
        if !f.avx512 {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        // Odd lengths (a plain tail) and exact halves (ties to even) included.
        let mut x = data(1003, 5);
        x.extend((0..40).map(|i| i as f32 - 19.5));
        let amax = f32::max_abs(&x, false);
        assert_eq!(f32::max_abs(&x, true), amax);
        let (mut plain, mut simd) = (vec![0u8; x.len()], vec![0u8; x.len()]);
        f32::quantize(&x, 1.0, &mut plain, false);
        f32::quantize(&x, 1.0, &mut simd, true);
        assert_eq!(plain, simd);
        let b: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
        assert_eq!(
            half::bf16::max_abs(&b, true),
            half::bf16::max_abs(&b, false)
        );
        half::bf16::quantize(&b, 127.0 / amax, &mut plain, false);
        half::bf16::quantize(&b, 127.0 / amax, &mut simd, true);
        assert_eq!(plain, simd);
    }

    #[test]
    fn zero_rows_quantize_to_zero_with_scale_zero() {
        let x = [0f32; 6];
        let (mut a, mut s) = ([0u8; 8], [1f32; 1]);
        quantize_rows(&x[..], 6, &mut a, &mut s);
        assert_eq!(a, [128; 8]);
        assert_eq!(s, [0.0]);
    }
}
