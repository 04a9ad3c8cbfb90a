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

    /// The input row of channel `c` under tap `(dt, dy, _)` for output row `(t, y)`, or
    /// None if it is padding.
    fn source_row<'a>(
        &self,
        src: &Source<'a>,
        c: usize,
        t: usize,
        y: usize,
        tap: [usize; 3],
    ) -> Option<&'a [f32]> {
        let p = &self.p;
        let ti = match (t * p.stride[0] + tap[0]).checked_sub(p.pad_t_front) {
            Some(ti) => ti,
            None if p.time_pad == TimePad::Replicate => 0,
            None => return None,
        };
        let yi = (y * p.stride[1] + tap[1]).checked_sub(p.pad_h)?;
        let start = yi * p.in_w;
        (yi < p.in_h).then(|| &src.frame(c, ti)[start..start + p.in_w])
    }
}

/// Fills `cols[K, n]` for output pixels `p0..p0 + n` of one batch item, on the calling thread.
pub(super) fn fill_cols(g: &Geometry, src: &Source<'_>, p0: usize, n: usize, cols: &mut [f32]) {
    for (row, dst) in cols.chunks_mut(n).enumerate() {
        fill_cols_row(g, src, row, p0, dst);
    }
}

/// Fills row `row` of `cols` (one input channel under one kernel tap) for output pixels
/// `p0..p0 + dst.len()`.
pub(super) fn fill_cols_row(
    g: &Geometry,
    src: &Source<'_>,
    row: usize,
    p0: usize,
    dst: &mut [f32],
) {
    let [_, kh, kw] = g.p.kernel;
    let taps = kh * kw * g.p.kernel[0];
    let (ci, tap) = (row / taps, row % taps);
    let (dt, dy, dx) = (tap / (kh * kw), (tap / kw) % kh, tap % kw);
    fill_row(g, src, ci, [dt, dy, dx], p0, dst);
}

/// Fills one row of `cols`: channel `c`'s values under `tap` for output pixels
/// `p0..p0 + dst.len()`.
fn fill_row(g: &Geometry, src: &Source<'_>, c: usize, tap: [usize; 3], p0: usize, dst: &mut [f32]) {
    let sw = g.p.stride[2];
    let mut pixel = p0;
    let mut done = 0;
    // Walk the pixel range one output-row segment at a time.
    while done < dst.len() {
        let (t, rest) = (pixel / g.out_frame, pixel % g.out_frame);
        let (y, x) = (rest / g.out_w, rest % g.out_w);
        let len = (g.out_w - x).min(dst.len() - done);
        let seg = &mut dst[done..done + len];
        match g.source_row(src, c, t, y, tap) {
            Some(row) => fill_segment(seg, row, x * sw + tap[2], sw, g.p.pad_w),
            None => seg.fill(0.0),
        }
        done += len;
        pixel += len;
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
    seg[..lo].fill(0.0);
    seg[hi..].fill(0.0);
    if hi > lo {
        let first = padded_x0 + lo * stride - pad;
        let inner = &mut seg[lo..hi];
        if stride == 1 {
            inner.copy_from_slice(&row[first..first + inner.len()]);
        } else {
            for (d, s) in inner.iter_mut().zip(row[first..].iter().step_by(stride)) {
                *d = *s;
            }
        }
    }
}
