//! The shape of a convolution: [`Conv3dParams`] (and [`Conv2dParams`], a single-frame
//! 3-D one) with the sizes it implies, and the geometry the im2col fill and the planes
//! read the input through (where each kernel tap of an output row falls, padding
//! included).

use crate::kernels::gemm::Compute;

/// What the causal frames in front of the time axis hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimePad {
    /// Zero frames.
    Zeros,
    /// Copies of the first input frame.
    Replicate,
}

/// Shape and padding of one 3-D convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dParams {
    /// Batch size.
    pub batch: usize,
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Input frames (unpadded).
    pub in_t: usize,
    /// Input height (unpadded).
    pub in_h: usize,
    /// Input width (unpadded).
    pub in_w: usize,
    /// Kernel extent `(kt, kh, kw)`.
    pub kernel: [usize; 3],
    /// Stride `(st, sh, sw)`.
    pub stride: [usize; 3],
    /// Frames added before `t = 0` (causal); nothing is added after the last frame.
    pub pad_t_front: usize,
    /// What the front frames hold.
    pub time_pad: TimePad,
    /// Zero rows added above and below.
    pub pad_h: usize,
    /// Zero columns added left and right.
    pub pad_w: usize,
    /// What the GEMMs compute in (bf16 for bf16 weights).
    pub compute: Compute,
}

/// Output length of one axis: `(input + pad - k) / stride + 1`, or 0 if the kernel does not fit.
fn out_size(input: usize, pad: usize, k: usize, stride: usize) -> usize {
    let span = input + pad;
    if span < k {
        0
    } else {
        (span - k) / stride + 1
    }
}

impl Conv3dParams {
    /// Output dims `(To, Ho, Wo)`.
    pub fn out_dims(&self) -> [usize; 3] {
        [
            out_size(self.in_t, self.pad_t_front, self.kernel[0], self.stride[0]),
            out_size(self.in_h, 2 * self.pad_h, self.kernel[1], self.stride[1]),
            out_size(self.in_w, 2 * self.pad_w, self.kernel[2], self.stride[2]),
        ]
    }

    /// Number of output elements `B·Cout·To·Ho·Wo`.
    pub fn out_len(&self) -> usize {
        self.batch * self.out_channels * self.out_dims().iter().product::<usize>()
    }

    /// Number of input elements `B·Cin·T·H·W`.
    pub fn in_len(&self) -> usize {
        self.batch * self.in_channels * self.in_t * self.in_h * self.in_w
    }

    /// Number of weight elements `Cout·Cin·kt·kh·kw`.
    pub fn weight_len(&self) -> usize {
        self.out_channels * self.patch_len()
    }

    /// The GEMM depth `K = Cin·kt·kh·kw`.
    pub(super) fn patch_len(&self) -> usize {
        self.in_channels * self.kernel.iter().product::<usize>()
    }

    /// True when the input of a batch item already is the im2col matrix.
    pub(super) fn is_pointwise(&self) -> bool {
        self.kernel == [1, 1, 1]
            && self.stride == [1, 1, 1]
            && self.pad_t_front == 0
            && self.pad_h == 0
            && self.pad_w == 0
    }

    /// Checks (in debug builds) that the extents, strides and time padding make sense.
    pub(super) fn debug_validate(&self) {
        debug_assert!(
            self.kernel.iter().all(|&k| k > 0),
            "kernel extents must be > 0"
        );
        debug_assert!(self.stride.iter().all(|&s| s > 0), "strides must be > 0");
        debug_assert!(
            self.time_pad == TimePad::Zeros || self.pad_t_front == 0 || self.in_t > 0,
            "replicate padding needs a frame to copy"
        );
    }
}

/// Shape of one 2-D convolution (a 3-D one with a single frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Batch size.
    pub batch: usize,
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Input height (unpadded).
    pub in_h: usize,
    /// Input width (unpadded).
    pub in_w: usize,
    /// Kernel extent `(kh, kw)`.
    pub kernel: [usize; 2],
    /// Stride `(sh, sw)`.
    pub stride: [usize; 2],
    /// Zero rows added above and below.
    pub pad_h: usize,
    /// Zero columns added left and right.
    pub pad_w: usize,
    /// What the GEMMs compute in (bf16 for bf16 weights).
    pub compute: Compute,
}

impl Conv2dParams {
    /// The equivalent single-frame 3-D convolution.
    pub fn to_3d(&self) -> Conv3dParams {
        Conv3dParams {
            batch: self.batch,
            in_channels: self.in_channels,
            out_channels: self.out_channels,
            in_t: 1,
            in_h: self.in_h,
            in_w: self.in_w,
            kernel: [1, self.kernel[0], self.kernel[1]],
            stride: [1, self.stride[0], self.stride[1]],
            pad_t_front: 0,
            time_pad: TimePad::Zeros,
            pad_h: self.pad_h,
            pad_w: self.pad_w,
            compute: self.compute,
        }
    }

    /// Output dims `(Ho, Wo)`.
    pub fn out_dims(&self) -> [usize; 2] {
        let [_, h, w] = self.to_3d().out_dims();
        [h, w]
    }

    /// Number of output elements `B·Cout·Ho·Wo`.
    pub fn out_len(&self) -> usize {
        self.to_3d().out_len()
    }

    /// Number of input elements `B·Cin·H·W`.
    pub fn in_len(&self) -> usize {
        self.to_3d().in_len()
    }

    /// Number of weight elements `Cout·Cin·kh·kw`.
    pub fn weight_len(&self) -> usize {
        self.to_3d().weight_len()
    }
}

/// The conv (or one job's part of it) plus the sizes the im2col fill derives from it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Geometry {
    /// The conv (or the job's part of it).
    pub(super) p: Conv3dParams,
    /// Elements of one input channel of one batch item (`T·H·W` of the real input, whose
    /// first `p.in_t` frames a head job reads).
    pub(super) in_chan: usize,
    /// Output width (`Wo`).
    pub(super) out_w: usize,
    /// Output pixels per frame (`Ho·Wo`).
    pub(super) out_frame: usize,
}

impl Geometry {
    /// The geometry of `p` over an input of `in_t` frames per channel (`p.in_t` or more).
    pub(super) fn new(p: &Conv3dParams, in_t: usize) -> Self {
        let [_, out_h, out_w] = p.out_dims();
        let in_chan = in_t * p.in_h * p.in_w;
        let out_frame = out_h * out_w;
        Self {
            p: *p,
            in_chan,
            out_w,
            out_frame,
        }
    }

    /// The input row under tap `(dt, dy, _)` for output row `(t, y)`, or None if it is padding.
    pub(super) fn source_row<'a>(
        &self,
        chan: &'a [f32],
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
        let start = (ti * p.in_h + yi) * p.in_w;
        (yi < p.in_h).then(|| &chan[start..start + p.in_w])
    }
}
