//! The im2col fill: rows of `cols[K, n]` gathered from the input, which may arrive as
//! several slabs along time.
//!
//! A causal conv's input is the cached last frames of the previous chunk followed by the
//! new chunk. Joining them into one buffer first (`Tensor::cat`) copies the whole chunk
//! once more per conv; the fill instead asks [`Source::frame`] for one input frame of one
//! channel and gets it from whichever slab holds it. The values written to `cols` are the
//! same either way, so the GEMMs, and the bytes out, are too.

use super::{Conv3dParams, TimePad};

/// One part of a conv's input along time: `[B, Cin, frames, H, W]`, contiguous f32.
/// The parts of one input are consecutive along time and share `B`, `Cin`, `H` and `W`.
#[derive(Debug, Clone, Copy)]
pub struct TimeSlab<'a> {
    /// The slab's elements, `B·Cin·frames·H·W` of them.
    pub data: &'a [f32],
    /// Frames in this slab (0 is allowed).
    pub frames: usize,
}

/// One batch item of a conv's input, read frame by frame from its time slabs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Source<'a> {
    slabs: &'a [TimeSlab<'a>],
    item: usize,
    channels: usize,
    /// Elements of one frame of one channel (`H·W`).
    frame_len: usize,
}

impl<'a> Source<'a> {
    /// Batch item `item` of `slabs`, for a conv shaped `p`.
    pub(super) fn new(slabs: &'a [TimeSlab<'a>], item: usize, p: &Conv3dParams) -> Self {
        Self {
            slabs,
            item,
            channels: p.in_channels,
            frame_len: p.in_h * p.in_w,
        }
    }

    /// Frame `t` (counted over all slabs) of channel `c`: `H·W` elements.
    fn frame(&self, c: usize, t: usize) -> &'a [f32] {
        let mut t = t;
        for slab in self.slabs {
            if t < slab.frames {
                let start = ((self.item * self.channels + c) * slab.frames + t) * self.frame_len;
                return &slab.data[start..start + self.frame_len];
            }
            t -= slab.frames;
        }
        unreachable!("frame index past the conv's input (Geometry keeps it in range)")
    }
}

/// The conv plus the sizes the im2col fill derives from it, computed once per call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Geometry {
    pub(super) p: Conv3dParams,
    pub(super) out_t: usize,
    out_w: usize,
    /// Output pixels per frame (`Ho·Wo`).
    pub(super) out_frame: usize,
}

impl Geometry {
    pub(super) fn new(p: &Conv3dParams) -> Self {
        let [out_t, out_h, out_w] = p.out_dims();
        Self {
            p: *p,
            out_t,
            out_w,
            out_frame: out_h * out_w,
        }
    }

    /// The runs of a tile of output pixels `p0..p0 + n`, into `runs` (cleared first).
    pub(super) fn runs(&self, p0: usize, n: usize, runs: &mut Vec<Run>) {
        runs.clear();
        let [st, sh, sw] = self.p.stride;
        let mut done = 0;
        while done < n {
            let pixel = p0 + done;
            let (t, rest) = (pixel / self.out_frame, pixel % self.out_frame);
            let (y, x) = (rest / self.out_w, rest % self.out_w);
            let len = (self.out_w - x).min(n - done);
            runs.push(Run {
                at: done,
                len,
                t: t * st,
                y: y * sh,
                x: x * sw,
            });
            done += len;
        }
    }
}

/// Consecutive output pixels of one output row within a tile: where they start in a
/// `cols` row and the padded input coordinates (time, row, column) under tap `(0, 0, 0)`
/// of the first. Cut once per tile, they serve all `K` rows of its `cols`, so the row
/// fill does no division.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    at: usize,
    len: usize,
    t: usize,
    y: usize,
    x: usize,
}

/// Fills `cols[rows, n]`: rows `row0..` of the tile cut into `runs`, on the calling thread.
pub(super) fn fill_cols(
    g: &Geometry,
    src: &Source<'_>,
    runs: &[Run],
    row0: usize,
    n: usize,
    cols: &mut [f32],
) {
    for (i, dst) in cols.chunks_mut(n).enumerate() {
        fill_row(g, src, runs, row0 + i, dst);
    }
}

/// Fills row `row` of `cols` (one input channel under one kernel tap) for the tile's runs.
fn fill_row(g: &Geometry, src: &Source<'_>, runs: &[Run], row: usize, dst: &mut [f32]) {
    let p = &g.p;
    let [kt, kh, kw] = p.kernel;
    let taps = kt * kh * kw;
    let (c, tap) = (row / taps, row % taps);
    let (dt, dy, dx) = (tap / (kh * kw), (tap / kw) % kh, tap % kw);
    for run in runs {
        let seg = &mut dst[run.at..run.at + run.len];
        let ti = match (run.t + dt).checked_sub(p.pad_t_front) {
            Some(ti) => ti,
            None if p.time_pad == TimePad::Replicate => 0,
            None => {
                zero(seg);
                continue;
            }
        };
        let yi = match (run.y + dy).checked_sub(p.pad_h) {
            Some(yi) if yi < p.in_h => yi,
            _ => {
                zero(seg);
                continue;
            }
        };
        let line = &src.frame(c, ti)[yi * p.in_w..(yi + 1) * p.in_w];
        fill_segment(seg, line, run.x + dx, p.stride[2], p.pad_w);
    }
}

/// `seg[j] = row[padded_x0 + j·stride - pad]`, or 0 where that index falls outside `row`.
fn fill_segment(seg: &mut [f32], row: &[f32], padded_x0: usize, stride: usize, pad: usize) {
    let len = seg.len();
    // First j whose padded column reaches the real row: padded_x0 + j·stride ≥ pad.
    let lo = pad.saturating_sub(padded_x0).div_ceil(stride).min(len);
    // First j whose padded column is past the real row: padded_x0 + j·stride ≥ pad + width.
    let hi = (pad + row.len())
        .saturating_sub(padded_x0)
        .div_ceil(stride)
        .clamp(lo, len);
    zero(&mut seg[..lo]);
    zero(&mut seg[hi..]);
    if hi > lo {
        let first = padded_x0 + lo * stride - pad;
        let inner = &mut seg[lo..hi];
        if stride == 1 {
            copy(inner, &row[first..first + inner.len()]);
        } else {
            for (d, s) in inner.iter_mut().zip(row[first..].iter().step_by(stride)) {
                *d = *s;
            }
        }
    }
}

/// Runs at least this long go to `memcpy` / `memset`; shorter ones (a row of a small
/// frame, a padding column) are moved inline: the library call's setup cost more than
/// the move itself on the VAE's 16- to 128-wide rows.
const INLINE_MAX: usize = 128;

/// `dst.copy_from_slice(src)`, short runs inline in fixed 16/4/1-element moves.
#[inline(always)]
fn copy(dst: &mut [f32], src: &[f32]) {
    let n = dst.len();
    if n >= INLINE_MAX {
        dst.copy_from_slice(src);
        return;
    }
    let src = &src[..n];
    let mut d16 = dst.chunks_exact_mut(16);
    let mut s16 = src.chunks_exact(16);
    for (d, s) in (&mut d16).zip(&mut s16) {
        let s: &[f32; 16] = s.try_into().expect("chunks of 16");
        let d: &mut [f32; 16] = d.try_into().expect("chunks of 16");
        *d = *s;
    }
    let (dst, src) = (d16.into_remainder(), s16.remainder());
    let mut d4 = dst.chunks_exact_mut(4);
    let mut s4 = src.chunks_exact(4);
    for (d, s) in (&mut d4).zip(&mut s4) {
        let s: &[f32; 4] = s.try_into().expect("chunks of 4");
        let d: &mut [f32; 4] = d.try_into().expect("chunks of 4");
        *d = *s;
    }
    for (d, s) in d4.into_remainder().iter_mut().zip(s4.remainder()) {
        *d = *s;
    }
}

/// `dst.fill(0.0)`, short runs inline.
#[inline(always)]
fn zero(dst: &mut [f32]) {
    if dst.len() >= INLINE_MAX {
        dst.fill(0.0);
        return;
    }
    let mut d16 = dst.chunks_exact_mut(16);
    for d in &mut d16 {
        let d: &mut [f32; 16] = d.try_into().expect("chunks of 16");
        *d = [0.0; 16];
    }
    for d in d16.into_remainder() {
        *d = 0.0;
    }
}
