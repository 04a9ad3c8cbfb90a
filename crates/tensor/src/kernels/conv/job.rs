//! A conv cut into jobs at its zero time padding: one job per *head* frame (an output
//! frame whose kernel reaches into the zero frames), computed from its real taps alone
//! (gathered once) or, when it has none, from the bias alone; and one job for the rest.

use rayon::prelude::*;

use super::params::{Conv3dParams, TimePad};

/// The part of a conv one tiled GEMM computes: output pixels `dst0..dst0 + count` of each
/// output-channel row, through `params`, whose own output pixel `first` is `dst0`.
///
/// A conv with zero time padding runs as one job per *head* frame (an output frame whose
/// kernel reaches into the zero frames) and one for the rest. A head frame's job is the
/// conv of its real taps alone: the kernel's last `kt − skip` time taps over input frames
/// `0..kt − skip`, one output frame. The skipped taps would multiply zeros, so they are
/// not computed (a causal 3-frame kernel over a stream's first frame does a third of
/// the work). Every output element still comes from one GEMM with a fixed order.
#[derive(Debug, Clone, Copy)]
pub(super) struct Job {
    /// The conv this job computes (a head frame's: its real taps over its real frames).
    pub(super) params: Conv3dParams,
    /// Leading time taps dropped (0 for the main job).
    pub(super) skip: usize,
    /// Every tap falls on zeros: the output is the bias alone.
    pub(super) bias_only: bool,
    /// The first output pixel of `params` computed.
    pub(super) first: usize,
    /// Output pixels computed.
    pub(super) count: usize,
    /// Where the first one goes in each output-channel row.
    pub(super) dst0: usize,
    /// Exact f32 compute may run on planes ([`f32_on_planes`](super::f32_on_planes)).
    pub(super) f32_planes: bool,
}

impl Job {
    /// Whether the job runs on gathered taps (a head frame with some real taps).
    pub(super) fn gathers(&self) -> bool {
        self.skip > 0 && !self.bias_only
    }
}

/// The jobs of a non-pointwise conv, head frames first; `f32_planes` as in
/// [`Route`](super::Route).
pub(super) fn jobs(p: &Conv3dParams, f32_planes: bool) -> Vec<Job> {
    let [to, ho, wo] = p.out_dims();
    let frame = ho * wo;
    let (kt, st, pad) = (p.kernel[0], p.stride[0], p.pad_t_front);
    let skipping = p.time_pad == TimePad::Zeros && pad > 0;
    let heads = if skipping {
        to.min(pad.div_ceil(st))
    } else {
        0
    };
    let mut jobs: Vec<Job> = (0..heads)
        .map(|t| {
            let skip = (pad - t * st).min(kt);
            let real = kt - skip;
            Job {
                params: Conv3dParams {
                    kernel: [real.max(1), p.kernel[1], p.kernel[2]],
                    in_t: real.max(1),
                    pad_t_front: 0,
                    ..*p
                },
                skip,
                bias_only: real == 0,
                first: 0,
                count: frame,
                dst0: t * frame,
                f32_planes,
            }
        })
        .collect();
    if heads < to {
        jobs.push(Job {
            params: *p,
            skip: 0,
            bias_only: false,
            first: heads * frame,
            count: (to - heads) * frame,
            dst0: heads * frame,
            f32_planes,
        });
    }
    jobs
}

/// f32 elements the head jobs' weights (their taps gathered) take in front of the tiles.
pub(super) fn head_weight_len(jobs: &[Job]) -> usize {
    jobs.iter()
        .filter(|j| j.gathers())
        .map(|j| j.params.weight_len())
        .max()
        .unwrap_or(0)
}

/// `out[co, ci, dt, …] = weight[co, ci, skip + dt, …]`: the last `kt − skip` time taps.
pub(super) fn gather_taps(weight: &[f32], p: &Conv3dParams, skip: usize, out: &mut [f32]) {
    let [kt, kh, kw] = p.kernel;
    let plane = kh * kw;
    let (from, to) = (kt * plane, (kt - skip) * plane);
    for (dst, src) in out.chunks_exact_mut(to).zip(weight.chunks_exact(from)) {
        dst.copy_from_slice(&src[skip * plane..]);
    }
}

/// Output pixels `dst0..dst0 + count` of every channel row set to the channel's bias (or 0).
pub(super) fn fill_rows(
    dst: &mut [f32],
    cout: usize,
    dst0: usize,
    count: usize,
    bias: Option<&[f32]>,
) {
    let row = dst.len() / cout;
    dst.par_chunks_mut(row).enumerate().for_each(|(co, r)| {
        r[dst0..dst0 + count].fill(bias.map_or(0.0, |b| b[co]));
    });
}
