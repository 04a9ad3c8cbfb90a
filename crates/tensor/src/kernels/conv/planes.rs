//! bf16 convolution without im2col on the AVX512-BF16 path: the GEMM reads its B operand
//! in place from VNNI *pair planes* of the input.
//!
//! For stride 1, the value under tap `(dt, dy, dx)` for output pixel `(t, y, x)` is the
//! input at `(t + dt, y + dy, x + dx)` of the padded input: every tap's B matrix is the
//! same padded input, shifted. So the input is packed once per band of output rows (every
//! pair of channels interleaved as bf16 words, the spatial padding written as zeros, one
//! plane per channel pair) and the `vdpbf16ps` kernel reads each k-step's 16 pair rows
//! from the planes at that k-step's shift ([`vdp::kernel_planes`]). im2col wrote and
//! packed 27 values per input value for a 3×3×3 kernel; this packs about
//! `kt · (1 + (kh − 1) / rows)`.
//!
//! Output pixels run over the padded width: column `v = r · Wp + x` of band row `r`. The
//! `Wp − Wo` columns past each row's end are computed and dropped (2 of 106 at 104
//! wide). K runs tap-major, `k = tap · Cin' + ci` (`Cin'` is `Cin` rounded up to a
//! k-step, the extra channels zero planes), so the weights are reordered as they are
//! packed. Every output element sums its taps in one fixed order, whatever the band or
//! the thread, so the bytes depend on neither; they differ from im2col's `(ci, tap)`
//! order by rounding only.

use rayon::prelude::*;

use super::{Geometry, Job};
use crate::kernels::cpu::amx::Kernel;
use crate::kernels::cpu::pack::{
    as_u16, pack_a, pair_row, Operand, Part, KSTEP_LEN, PANEL, TILE_K,
};
use crate::kernels::cpu::{self, vdp};
use crate::kernels::gemm::{Compute, MatRef};

/// Bytes of packed A one K range covers, kept in L2 while every column panel passes it.
const A_RANGE_BYTES: usize = 512 << 10;

/// k-steps per kernel call: C stays in registers over this many, and the B lines they read
/// (32 a k-step) stay in L1 across the four bands. Measured on Zen 4 over the VAE's
/// shapes: 16 ran 1.05–1.15× faster than 8 or 32, 64 slower than 8.
const KC: usize = 16;

/// Whether `job` runs on pair planes: bf16 compute on the AVX512-BF16 kernel, stride 1,
/// and no tap of the job's output frames in the causal time padding.
pub(super) fn eligible(job: &Job) -> bool {
    let p = &job.params;
    let [_, ho, wo] = p.out_dims();
    !job.bias_only
        && p.compute == Compute::Bf16
        && p.stride == [1, 1, 1]
        && ho * wo > 0
        && job.first / (ho * wo) >= p.pad_t_front
        && Kernel::of(cpu::selected()) == Some(Kernel::Vdp)
}

/// The sizes of one job's planes, bands and buffers.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Input channels rounded up to a k-step.
    cin_pad: usize,
    /// Kernel extent `(kt, kh, kw)`.
    kernel: [usize; 3],
    /// Packed k-steps of K (`taps · cin_pad / 32`).
    steps: usize,
    /// Output channels rounded up to a panel.
    cout_pad: usize,
    /// Padded input width.
    wp: usize,
    /// Output rows per band (the last band of a frame may have fewer).
    rows: usize,
}

impl Layout {
    /// The layout of `job` with bands as tall as `target` f32 elements of planes and C allow.
    fn new(job: &Job, target: usize) -> Self {
        let p = &job.params;
        let cin_pad = p.in_channels.next_multiple_of(TILE_K);
        let mut l = Self {
            cin_pad,
            kernel: p.kernel,
            steps: p.kernel.iter().product::<usize>() * cin_pad / TILE_K,
            cout_pad: p.out_channels.next_multiple_of(PANEL),
            wp: p.in_w + 2 * p.pad_w,
            rows: 1,
        };
        let ho = p.out_dims()[1];
        let fit = (1..=ho)
            .rev()
            .find(|&rows| l.band_len(rows) <= target)
            .unwrap_or(1);
        // Equal bands: the same halo for each.
        l.rows = ho.div_ceil(ho.div_ceil(fit));
        l
    }

    /// Input rows a band of `rows` output rows reads per frame.
    fn plane_rows(&self, rows: usize) -> usize {
        rows + self.kernel[1] - 1
    }

    /// `u32` words between two pair planes for bands of `rows` rows: every frame's rows,
    /// then slack for a last column panel's reads, rounded to an odd multiple of 64 bytes
    /// so that the 16 planes one k-step reads fall in 16 different L1 sets.
    fn pair_stride(&self, rows: usize) -> usize {
        let [kt, _, kw] = self.kernel;
        let len = kt * self.plane_rows(rows) * self.wp + kw + PANEL;
        len.next_multiple_of(32) + 16
    }

    /// Output columns (over the padded width) of a band of `rows` rows, rounded to panels.
    fn cols(&self, rows: usize) -> usize {
        (rows * self.wp).next_multiple_of(PANEL)
    }

    /// Channel pairs (planes).
    fn pairs(&self) -> usize {
        self.cin_pad / 2
    }

    /// f32 elements of a band's planes, then its C, for bands of `rows` rows.
    fn band_len(&self, rows: usize) -> usize {
        self.pairs() * self.pair_stride(rows) + self.cout_pad * self.cols(rows)
    }

    /// `u16` length of the reordered weights packed as A panels.
    fn packed_a_len(&self) -> usize {
        self.cout_pad / PANEL * self.steps * KSTEP_LEN
    }

    /// f32 elements of one panel's reordered weight rows.
    fn reorder_len(&self) -> usize {
        PANEL * self.steps * TILE_K
    }

    /// `u16` offset of k-step `s` in a band of `rows` rows: its 16 channel pairs' planes,
    /// at the shift of its tap.
    fn step_offset(&self, s: usize, rows: usize) -> isize {
        let [_, kh, kw] = self.kernel;
        let per_tap = self.cin_pad / TILE_K;
        let (tap, block) = (s / per_tap, s % per_tap);
        let (dt, dy, dx) = (tap / (kh * kw), (tap / kw) % kh, tap % kw);
        let words =
            block * 16 * self.pair_stride(rows) + (dt * self.plane_rows(rows) + dy) * self.wp + dx;
        (2 * words) as isize
    }
}

/// f32 elements of scratch a job on pair planes needs with `slots` threads.
pub(super) fn scratch_len(job: &Job, target: usize, slots: usize) -> usize {
    let l = Layout::new(job, target);
    let band = l.band_len(l.rows);
    l.packed_a_len().div_ceil(2) + band.max(slots * l.reorder_len())
}

/// `job` over one batch item's input `src` into `dst` (`[Cout, P]`), with `scratch` of
/// [`scratch_len`] elements; `weight` is `[Cout, Cin, kt, kh, kw]` (the job's taps).
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    geom: &Geometry,
    job: &Job,
    src: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    dst: &mut [f32],
    scratch: &mut [f32],
    target: usize,
    slots: usize,
) {
    let p = &job.params;
    let l = Layout::new(job, target);
    let (packed, rest) = scratch.split_at_mut(l.packed_a_len().div_ceil(2));
    let packed = &mut as_u16(packed)[..l.packed_a_len()];
    pack_weights(
        &l,
        p.in_channels,
        p.out_channels,
        weight,
        packed,
        rest,
        slots,
    );
    let packed = &*packed;
    let [_, ho, wo] = p.out_dims();
    let frame = ho * wo;
    let row_len = dst.len() / p.out_channels;
    for f in 0..job.count / frame {
        let t = job.first / frame + f;
        for y0 in (0..ho).step_by(l.rows) {
            let rows = l.rows.min(ho - y0);
            let (planes, c) = rest.split_at_mut(l.pairs() * l.pair_stride(rows));
            let c = &mut c[..l.cout_pad * l.cols(rows)];
            fill_planes(geom, &l, src, t, y0, rows, planes);
            multiply(&l, rows, packed, as_u16(planes), c, slots);
            // Scatter the band's valid columns into `dst` rows, with the bias.
            let c = &*c;
            let out0 = job.dst0 + f * frame + y0 * wo;
            dst.par_chunks_mut(row_len)
                .enumerate()
                .for_each(|(co, row)| {
                    let b = bias.map_or(0.0, |b| b[co]);
                    for r in 0..rows {
                        let out = &mut row[out0 + r * wo..out0 + (r + 1) * wo];
                        let mut x = 0;
                        while x < wo {
                            let v = r * l.wp + x;
                            let (panel, j) = (v / PANEL, v % PANEL);
                            let n = (PANEL - j).min(wo - x);
                            let from = &c[(panel * l.cout_pad + co) * PANEL + j..][..n];
                            out[x..x + n]
                                .iter_mut()
                                .zip(from)
                                .for_each(|(d, &v)| *d = v + b);
                            x += n;
                        }
                    }
                });
        }
    }
}

/// The weights reordered tap-major (`k = tap · cin_pad + ci`, zero past `Cin`) and packed
/// as A panels, a panel per slot at a time through `temp`.
fn pack_weights(
    l: &Layout,
    cin: usize,
    cout: usize,
    weight: &[f32],
    packed: &mut [u16],
    temp: &mut [f32],
    slots: usize,
) {
    let taps = l.kernel.iter().product::<usize>();
    let k = l.steps * TILE_K;
    let panel_len = l.steps * KSTEP_LEN;
    for (g, group) in packed.chunks_mut(slots * panel_len).enumerate() {
        group
            .par_chunks_mut(panel_len)
            .zip(temp.par_chunks_mut(l.reorder_len()))
            .enumerate()
            .for_each(|(i, (out, temp))| {
                let r0 = (g * slots + i) * PANEL;
                let h = PANEL.min(cout.saturating_sub(r0));
                let temp = &mut temp[..h * k];
                temp.fill(0.0);
                for r in 0..h {
                    let w = &weight[(r0 + r) * cin * taps..(r0 + r + 1) * cin * taps];
                    let t = &mut temp[r * k..(r + 1) * k];
                    for (ci, taps_of) in w.chunks_exact(taps).enumerate() {
                        for (tap, &v) in taps_of.iter().enumerate() {
                            t[tap * l.cin_pad + ci] = v;
                        }
                    }
                }
                let a = Operand::F32(MatRef::row_major(temp, 0, k));
                pack_a(&a, 0, h, k, &[Part::Hi], out);
            });
    }
}

/// The pair planes of output frame `t`'s rows `y0..y0 + rows`: plane `q` holds channels
/// `2q` and `2q + 1` over input frames `t − pad_t_front + dt` and padded rows
/// `y0 + r`, every row `Wp` words wide, zero in the padding and the slack.
#[allow(clippy::too_many_arguments)]
fn fill_planes(
    g: &Geometry,
    l: &Layout,
    src: &[f32],
    t: usize,
    y0: usize,
    rows: usize,
    planes: &mut [f32],
) {
    let p = &g.p;
    let (kt, prow) = (l.kernel[0], l.plane_rows(rows));
    let (w, pw) = (p.in_w, p.pad_w);
    let stride = l.pair_stride(rows);
    let channel = |c: usize| (c < p.in_channels).then(|| &src[c * g.in_chan..(c + 1) * g.in_chan]);
    planes
        .par_chunks_mut(stride)
        .enumerate()
        .for_each(|(q, plane)| {
            // f32 scratch seen as u32 words: the same bytes.
            let plane = as_u32(plane);
            let (even, odd) = (channel(2 * q), channel(2 * q + 1));
            for dt in 0..kt {
                let ti = t + dt - p.pad_t_front;
                for r in 0..prow {
                    let out = &mut plane[(dt * prow + r) * l.wp..(dt * prow + r + 1) * l.wp];
                    let yi = (y0 + r).checked_sub(p.pad_h).filter(|&yi| yi < p.in_h);
                    match (yi, even) {
                        (Some(yi), Some(even)) => {
                            let at = (ti * p.in_h + yi) * w;
                            out[..pw].fill(0);
                            out[pw + w..].fill(0);
                            pair_row(
                                &even[at..at + w],
                                odd.map(|o| &o[at..at + w]),
                                &mut out[pw..pw + w],
                            );
                        }
                        _ => out.fill(0),
                    }
                }
            }
            plane[kt * prow * l.wp..].fill(0);
        });
}

/// An f32 buffer seen as `u32` words.
fn as_u32(buf: &mut [f32]) -> &mut [u32] {
    // SAFETY: u32 has f32's size and alignment and every bit pattern is valid; the new
    // slice covers exactly the same bytes and borrows `buf`.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u32>(), buf.len()) }
}

/// `C = A · B` for one band: `c` is panel-major (`[cols / 32][cout_pad][32]`), so each
/// thread owns whole column panels. K runs in ranges whose packed A stays in L2 while
/// the thread's panels pass it, then in blocks of [`KC`] k-steps over every row panel.
fn multiply(l: &Layout, rows: usize, packed: &[u16], planes: &[u16], c: &mut [f32], slots: usize) {
    let offsets: Vec<isize> = (0..l.steps).map(|s| l.step_offset(s, rows)).collect();
    let pair_stride = 2 * l.pair_stride(rows);
    let row_panels = l.cout_pad / PANEL;
    let block = l.cout_pad * PANEL;
    let panels = l.cols(rows) / PANEL;
    let per_thread = panels.div_ceil(slots).max(1);
    let range = (A_RANGE_BYTES / (row_panels * KSTEP_LEN * 2))
        .max(1)
        .next_multiple_of(KC);
    // The planes' last read (a last panel's last k-step, pair 15, second half).
    let last = offsets.iter().max().copied().unwrap_or(0) as usize
        + 15 * pair_stride
        + 2 * (panels * PANEL);
    assert!(last <= planes.len(), "conv planes too short");
    assert!(packed.len() >= row_panels * l.steps * KSTEP_LEN);
    c.par_chunks_mut(per_thread * block)
        .enumerate()
        .for_each(|(i, mine)| {
            let first = i * per_thread;
            for k0 in (0..l.steps).step_by(range) {
                let k1 = (k0 + range).min(l.steps);
                for (j, cblock) in mine.chunks_exact_mut(block).enumerate() {
                    let v0 = (first + j) * PANEL;
                    for s0 in (k0..k1).step_by(KC) {
                        let s1 = (s0 + KC).min(k1);
                        for rp in 0..row_panels {
                            let a = &packed[(rp * l.steps + s0) * KSTEP_LEN..];
                            let cb = &mut cblock[rp * PANEL * PANEL..(rp + 1) * PANEL * PANEL];
                            // SAFETY: AVX512_BF16 is present (the Vdp kernel is selected,
                            // `eligible`); A holds k-steps s0..s1 of row panel rp
                            // (asserted length); every planes read is below `last`
                            // (asserted), whose offsets are non-negative; `cb` is this
                            // block's 32 rows of 32 f32.
                            unsafe {
                                vdp::kernel_planes(
                                    a.as_ptr(),
                                    planes.as_ptr().add(2 * v0),
                                    &offsets[s0..s1],
                                    pair_stride,
                                    cb.as_mut_ptr(),
                                    PANEL * 4,
                                    s0 > 0,
                                )
                            };
                        }
                    }
                }
            }
        });
}
