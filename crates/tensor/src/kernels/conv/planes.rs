//! Convolution without im2col: the GEMM reads its B operand in place from *planes* of
//! the input, in bf16 on the AVX512-BF16 path and in exact f32 wherever AVX-512F is.
//!
//! For stride 1, the value under tap `(dt, dy, dx)` for output pixel `(t, y, x)` is the
//! input at `(t + dt, y + dy, x + dx)` of the padded input: every tap's B matrix is the
//! same padded input, shifted. So the input is packed once per band of output rows, one
//! plane per channel (f32) or per pair of channels (bf16, the two interleaved as VNNI
//! words), the spatial padding written as zeros, and the micro-kernel reads each k's B
//! row (each k-step's 16 pair rows in bf16) from the planes at that k's shift
//! ([`fma::kernel_planes`], [`vdp::kernel_planes`]). im2col wrote (and the GEMM then
//! packed) 27 values per input value for a 3×3×3 kernel; this writes about
//! `kt · (1 + (kh − 1) / rows)`.
//!
//! Output pixels run over the padded width: column `v = r · Wp + x` of band row `r`. The
//! `Wp − Wo` columns past each row's end are computed and dropped (2 of 106 at 104
//! wide). K runs tap-major, `k = tap · Cin' + ci` (in bf16 `Cin'` is `Cin` rounded up to
//! a k-step, the extra channels zero planes), so the weights are reordered as they are
//! packed. Every output element sums its taps in one fixed order, whatever the band or
//! the thread, so the bytes depend on neither; they differ from im2col's `(ci, tap)`
//! order by rounding only.

use rayon::prelude::*;

use super::job::Job;
use super::params::Geometry;
use crate::kernels::cpu::amx::Kernel;
use crate::kernels::cpu::pack::{
    as_u16, pack_a, pair_row, Operand, Part, KSTEP_LEN, PANEL, TILE_K,
};
use crate::kernels::cpu::{self, fma, vdp, CpuPath};
use crate::kernels::gemm::{Compute, MatRef};

/// Bytes of packed A one K range covers, kept in L2 while every column panel passes it.
const A_RANGE_BYTES: usize = 512 << 10;

/// k-steps per kernel call: C stays in registers over this many, and the B lines they read
/// (32 a k-step) stay in L1 across the four bands. Measured on Zen 4 over the VAE's
/// shapes: 16 ran 1.05–1.15× faster than 8 or 32, 64 slower than 8.
const KC: usize = 16;

/// k values per f32 kernel call (the f32 analogue of [`KC`]: 256 B rows of 128 bytes).
const KC_F32: usize = 256;

/// What the planes hold and the kernel computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// bf16 pairs of channels, `vdpbf16ps` (the AVX512-BF16 path).
    Bf16,
    /// One f32 channel a plane, exact f32 fused multiply-adds (AVX-512F).
    F32,
}

/// How `job` runs on planes, or `None` when it runs on im2col tiles: stride 1, no tap of
/// the job's output frames in the causal time padding, and bf16 compute on the
/// AVX512-BF16 kernel or f32 compute on a path with AVX-512F where the job allows it
/// (`Job::f32_planes`).
fn mode(job: &Job) -> Option<Mode> {
    let p = &job.params;
    let [_, ho, wo] = p.out_dims();
    if job.bias_only
        || p.stride != [1, 1, 1]
        || ho * wo == 0
        || job.first / (ho * wo) < p.pad_t_front
    {
        return None;
    }
    let path = cpu::selected();
    match p.compute {
        Compute::Bf16 => (Kernel::of(path) == Some(Kernel::Vdp)).then_some(Mode::Bf16),
        Compute::F32 => (job.f32_planes
            && matches!(path, CpuPath::Avx512 | CpuPath::Avx512Bf16 | CpuPath::Amx))
        .then_some(Mode::F32),
        Compute::NearF32 => None,
    }
}

/// Whether `job` runs on planes (see [`mode`]).
pub(super) fn eligible(job: &Job) -> bool {
    mode(job).is_some()
}

/// The sizes of one job's planes, bands and buffers.
#[derive(Debug, Clone, Copy)]
struct Layout {
    mode: Mode,
    /// Input channels, in bf16 rounded up to a k-step.
    cin_pad: usize,
    /// Kernel extent `(kt, kh, kw)`.
    kernel: [usize; 3],
    /// Kernel steps over K: packed k-steps of 32 in bf16 (`taps · cin_pad / 32`), single
    /// k values in f32 (`taps · cin`).
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
    fn new(job: &Job, mode: Mode, target: usize) -> Self {
        let p = &job.params;
        let taps = p.kernel.iter().product::<usize>();
        let (cin_pad, steps) = match mode {
            Mode::Bf16 => {
                let cin_pad = p.in_channels.next_multiple_of(TILE_K);
                (cin_pad, taps * cin_pad / TILE_K)
            }
            Mode::F32 => (p.in_channels, taps * p.in_channels),
        };
        let mut l = Self {
            mode,
            cin_pad,
            kernel: p.kernel,
            steps,
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

    /// Words (a bf16 pair or an f32) between two planes for bands of `rows` rows: every
    /// frame's rows, then slack for a last column panel's reads, rounded to an odd
    /// multiple of 64 bytes so that the planes one k-step reads fall in different L1 sets.
    fn plane_stride(&self, rows: usize) -> usize {
        let [kt, _, kw] = self.kernel;
        let len = kt * self.plane_rows(rows) * self.wp + kw + PANEL;
        len.next_multiple_of(32) + 16
    }

    /// Output columns (over the padded width) of a band of `rows` rows, rounded to panels.
    fn cols(&self, rows: usize) -> usize {
        (rows * self.wp).next_multiple_of(PANEL)
    }

    /// Planes: channel pairs in bf16, channels in f32.
    fn planes(&self) -> usize {
        match self.mode {
            Mode::Bf16 => self.cin_pad / 2,
            Mode::F32 => self.cin_pad,
        }
    }

    /// f32 elements of a band's planes, then its C, for bands of `rows` rows.
    fn band_len(&self, rows: usize) -> usize {
        self.planes() * self.plane_stride(rows) + self.cout_pad * self.cols(rows)
    }

    /// f32 elements of the reordered weights packed as A panels.
    fn packed_a_len(&self) -> usize {
        match self.mode {
            Mode::Bf16 => (self.cout_pad / PANEL * self.steps * KSTEP_LEN).div_ceil(2),
            Mode::F32 => self.cout_pad * self.steps,
        }
    }

    /// f32 elements of one panel's reordered weight rows (bf16; f32 packs directly).
    fn reorder_len(&self) -> usize {
        match self.mode {
            Mode::Bf16 => PANEL * self.steps * TILE_K,
            Mode::F32 => 0,
        }
    }

    /// Offset of kernel step `s` in a band of `rows` rows, in the kernel's units (`u16`
    /// in bf16, f32 in f32): its planes (16 channel pairs in bf16, one channel in f32)
    /// at the shift of its tap.
    fn step_offset(&self, s: usize, rows: usize) -> isize {
        let [_, kh, kw] = self.kernel;
        let (per_tap, plane0) = match self.mode {
            Mode::Bf16 => (self.cin_pad / TILE_K, 16),
            Mode::F32 => (self.cin_pad, 1),
        };
        let (tap, block) = (s / per_tap, s % per_tap);
        let (dt, dy, dx) = (tap / (kh * kw), (tap / kw) % kh, tap % kw);
        let words = block * plane0 * self.plane_stride(rows)
            + (dt * self.plane_rows(rows) + dy) * self.wp
            + dx;
        match self.mode {
            Mode::Bf16 => (2 * words) as isize,
            Mode::F32 => words as isize,
        }
    }
}

/// f32 elements of scratch a job on planes needs with `slots` threads (0 off planes).
pub(super) fn scratch_len(job: &Job, target: usize, slots: usize) -> usize {
    let Some(mode) = mode(job) else { return 0 };
    let l = Layout::new(job, mode, target);
    l.packed_a_len() + l.band_len(l.rows).max(slots * l.reorder_len())
}

/// `job` over every batch item of `input` into `out` (`[B, Cout, P]`), the weights packed
/// once for all of them, with `scratch` of [`scratch_len`] elements; `weight` is
/// `[Cout, Cin, kt, kh, kw]` (the job's taps).
/// Panics unless the job is [`eligible`].
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    geom: &Geometry,
    job: &Job,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [f32],
    target: usize,
    slots: usize,
) {
    let p = &job.params;
    let l = Layout::new(job, mode(job).expect("a job on planes"), target);
    let (packed, rest) = scratch.split_at_mut(l.packed_a_len());
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
    let (in_batch, out_batch) = (input.len() / p.batch, out.len() / p.batch);
    let row_len = out_batch / p.out_channels;
    // The weights are packed once above; the batch items share them.
    for b in 0..p.batch {
        let src = &input[b * in_batch..(b + 1) * in_batch];
        let dst = &mut out[b * out_batch..(b + 1) * out_batch];
        for f in 0..job.count / frame {
            let t = job.first / frame + f;
            for y0 in (0..ho).step_by(l.rows) {
                let rows = l.rows.min(ho - y0);
                let (planes, c) = rest.split_at_mut(l.planes() * l.plane_stride(rows));
                let c = &mut c[..l.cout_pad * l.cols(rows)];
                fill_planes(geom, &l, src, t, y0, rows, planes);
                multiply(&l, rows, packed, planes, c, slots);
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
}

/// The weights reordered tap-major (`k = tap · cin_pad + ci`, zero past `Cin`) as A
/// panels: in bf16 packed through `temp` a panel per slot at a time, in f32 as
/// `[panel][k][32]` rows.
fn pack_weights(
    l: &Layout,
    cin: usize,
    cout: usize,
    weight: &[f32],
    packed: &mut [f32],
    temp: &mut [f32],
    slots: usize,
) {
    let taps = l.kernel.iter().product::<usize>();
    let row = |co: usize| &weight[co * cin * taps..(co + 1) * cin * taps];
    match l.mode {
        Mode::F32 => {
            // Panel rows past Cout stay zero.
            packed
                .par_chunks_mut(l.steps * PANEL)
                .enumerate()
                .for_each(|(ib, panel)| {
                    panel.fill(0.0);
                    for r in 0..PANEL.min(cout - ib * PANEL) {
                        for (ci, taps_of) in row(ib * PANEL + r).chunks_exact(taps).enumerate() {
                            for (tap, &v) in taps_of.iter().enumerate() {
                                panel[(tap * cin + ci) * PANEL + r] = v;
                            }
                        }
                    }
                });
        }
        Mode::Bf16 => {
            let k = l.steps * TILE_K;
            let panel_len = l.steps * KSTEP_LEN;
            let packed = &mut as_u16(packed)[..l.cout_pad / PANEL * panel_len];
            for (g, group) in packed.chunks_mut(slots * panel_len).enumerate() {
                group
                    .par_chunks_mut(panel_len)
                    .zip(temp.par_chunks_mut(l.reorder_len()))
                    .enumerate()
                    .for_each(|(i, (out, temp))| {
                        let r0 = (g * slots + i) * PANEL;
                        let h = PANEL.min(cout - r0);
                        let temp = &mut temp[..h * k];
                        temp.fill(0.0);
                        for (r, t) in temp.chunks_exact_mut(k).enumerate() {
                            for (ci, taps_of) in row(r0 + r).chunks_exact(taps).enumerate() {
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
    }
}

/// The planes of output frame `t`'s rows `y0..y0 + rows`: plane `q` holds channel `q`
/// (f32) or channels `2q` and `2q + 1` (bf16 words) over input frames
/// `t − pad_t_front + dt` and padded rows `y0 + r`, zero in the padding and the slack.
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
    let channel = |c: usize| (c < p.in_channels).then(|| &src[c * g.in_chan..(c + 1) * g.in_chan]);
    planes
        .par_chunks_mut(l.plane_stride(rows))
        .enumerate()
        .for_each(|(q, plane)| {
            let (first, second) = match l.mode {
                Mode::Bf16 => (channel(2 * q), channel(2 * q + 1)),
                Mode::F32 => (channel(q), None),
            };
            for dt in 0..kt {
                let ti = t + dt - p.pad_t_front;
                for r in 0..prow {
                    let out = &mut plane[(dt * prow + r) * l.wp..(dt * prow + r + 1) * l.wp];
                    let yi = (y0 + r).checked_sub(p.pad_h).filter(|&yi| yi < p.in_h);
                    let Some((yi, first)) = yi.zip(first) else {
                        out.fill(0.0);
                        continue;
                    };
                    let at = (ti * p.in_h + yi) * w;
                    out[..pw].fill(0.0);
                    out[pw + w..].fill(0.0);
                    let out = &mut out[pw..pw + w];
                    match l.mode {
                        Mode::F32 => out.copy_from_slice(&first[at..at + w]),
                        // f32 scratch seen as u32 words: the same bytes.
                        Mode::Bf16 => pair_row(
                            &first[at..at + w],
                            second.map(|o| &o[at..at + w]),
                            as_u32(out),
                        ),
                    }
                }
            }
            plane[kt * prow * l.wp..].fill(0.0);
        });
}

/// An f32 buffer seen as twice as many `u16` values.
fn u16_view(buf: &[f32]) -> &[u16] {
    // SAFETY: u16 is smaller and no more aligned than f32, and every bit pattern is a
    // valid u16; the new slice covers exactly the same bytes and borrows `buf`.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u16>(), buf.len() * 2) }
}

/// An f32 buffer seen as `u32` words.
fn as_u32(buf: &mut [f32]) -> &mut [u32] {
    // SAFETY: u32 has f32's size and alignment and every bit pattern is valid; the new
    // slice covers exactly the same bytes and borrows `buf`.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u32>(), buf.len()) }
}

/// `C = A · B` for one band: `c` is panel-major (`[cols / 32][cout_pad][32]`), so each
/// thread owns whole column panels. K runs in ranges whose packed A stays in L2 while
/// the thread's panels pass it, then in kernel calls of [`KC`] k-steps (bf16) or
/// [`KC_F32`] k values (f32) over every row panel.
fn multiply(
    l: &Layout,
    rows: usize,
    packed: &[f32],
    planes: &mut [f32],
    c: &mut [f32],
    slots: usize,
) {
    let offsets: Vec<isize> = (0..l.steps).map(|s| l.step_offset(s, rows)).collect();
    let row_panels = l.cout_pad / PANEL;
    let block = l.cout_pad * PANEL;
    let panels = l.cols(rows) / PANEL;
    let per_thread = panels.div_ceil(slots).max(1);
    // Packed A per kernel step and row panel (bytes), and kernel steps per call.
    let (step_bytes, kc) = match l.mode {
        Mode::Bf16 => (2 * KSTEP_LEN, KC),
        Mode::F32 => (4 * PANEL, KC_F32),
    };
    let range = (A_RANGE_BYTES / (row_panels * step_bytes))
        .max(1)
        .next_multiple_of(kc);
    // The planes' last read, in f32 words: the largest offset's last plane row (pair 15
    // in bf16) of the last column panel.
    let max_offset = offsets.iter().max().copied().unwrap_or(0) as usize;
    let last = match l.mode {
        Mode::Bf16 => max_offset.div_ceil(2) + 15 * l.plane_stride(rows) + panels * PANEL,
        Mode::F32 => max_offset + panels * PANEL,
    };
    assert!(last <= planes.len(), "conv planes too short");
    assert!(packed.len() >= l.packed_a_len());
    let planes_u16 = u16_view(planes);
    let (packed_u16, pair_stride) = match l.mode {
        Mode::Bf16 => (u16_view(packed), 2 * l.plane_stride(rows)),
        Mode::F32 => (&[][..], 0),
    };
    c.par_chunks_mut(per_thread * block)
        .enumerate()
        .for_each(|(i, mine)| {
            let first = i * per_thread;
            for k0 in (0..l.steps).step_by(range) {
                let k1 = (k0 + range).min(l.steps);
                // Column panels two at a time: f32 runs both in one 64-column kernel.
                for (j, pair) in mine.chunks_mut(2 * block).enumerate() {
                    let v0 = (first + 2 * j) * PANEL;
                    let wide = l.mode == Mode::F32 && pair.len() == 2 * block;
                    for s0 in (k0..k1).step_by(kc) {
                        let s1 = (s0 + kc).min(k1);
                        for rp in 0..row_panels {
                            let rows_of = rp * PANEL * PANEL..(rp + 1) * PANEL * PANEL;
                            if wide {
                                let (left, right) = pair.split_at_mut(block);
                                // SAFETY: an AVX-512 path (`mode`); A holds k values s0..s1
                                // of row panel rp (asserted length); every planes read,
                                // 64 f32 from v0, is below `last` (asserted); both blocks
                                // are this pair's 32 rows of 32 f32.
                                unsafe {
                                    fma::kernel_planes_wide(
                                        packed[(rp * l.steps + s0) * PANEL..].as_ptr(),
                                        planes.as_ptr().add(v0),
                                        &offsets[s0..s1],
                                        left[rows_of.clone()].as_mut_ptr(),
                                        right[rows_of].as_mut_ptr(),
                                        PANEL * 4,
                                        s0 > 0,
                                    )
                                };
                                continue;
                            }
                            for (h, cblock) in pair.chunks_exact_mut(block).enumerate() {
                                let v = v0 + h * PANEL;
                                let cb = &mut cblock[rows_of.clone()];
                                // SAFETY: the kernel's instructions are present (`mode`:
                                // the Vdp kernel for bf16, an AVX-512 path for f32); A
                                // holds steps s0..s1 of row panel rp (asserted length);
                                // every planes read is below `last` (asserted) and
                                // offsets are non-negative; `cb` is this block's 32 rows
                                // of 32 f32.
                                unsafe {
                                    match l.mode {
                                        Mode::Bf16 => vdp::kernel_planes(
                                            packed_u16[(rp * l.steps + s0) * KSTEP_LEN..].as_ptr(),
                                            planes_u16.as_ptr().add(2 * v),
                                            &offsets[s0..s1],
                                            pair_stride,
                                            cb.as_mut_ptr(),
                                            PANEL * 4,
                                            s0 > 0,
                                        ),
                                        Mode::F32 => fma::kernel_planes(
                                            packed[(rp * l.steps + s0) * PANEL..].as_ptr(),
                                            planes.as_ptr().add(v),
                                            &offsets[s0..s1],
                                            cb.as_mut_ptr(),
                                            PANEL * 4,
                                            s0 > 0,
                                        ),
                                    }
                                };
                            }
                        }
                    }
                }
            }
        });
}
