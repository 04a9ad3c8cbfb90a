//! 3-D (and 2-D) convolution as tiled im2col + GEMM.
//!
//! Layout (PyTorch's, all contiguous row-major f32): input `[B, Cin, T, H, W]`, weight
//! `[Cout, Cin, kt, kh, kw]`, bias `[Cout]`, output `[B, Cout, To, Ho, Wo]`. Read as a
//! matrix the weight is `W[Cout, K]` with `K = Cin·kt·kh·kw` ordered `(ci, dt, dy, dx)`,
//! and for one batch item the output is `O[Cout, P]` with `P = To·Ho·Wo` output pixels
//! in `(t, y, x)` order. So `O = W · cols`, where `cols[K, P]` holds, for every output
//! pixel, the input values under each kernel tap (zero where a tap falls in the spatial
//! padding; zero or a copy of frame 0 where it falls in the causal time padding).
//!
//! Tiling trade-off: a whole `cols` matrix is `K·P` floats (27× the input for a 3×3×3
//! conv: 64 MiB for 96 channels over four 60×104 frames), so it is built one tile of
//! consecutive output pixels at a time. A tile may span rows and frames, since `O`'s
//! columns are contiguous per batch item. Each pool thread owns one scratch slot of at
//! most [`CONV_SCRATCH_TARGET`] floats (or one output row, if a row needs more) for its
//! tile's `cols[K, n]` and GEMM result `[Cout, n]`. Per round every slot fills and
//! multiplies its own tile with a one-thread GEMM, then a row-parallel pass copies the
//! results (plus bias) into `out`. Bigger tiles make the GEMM faster, so tiles are as
//! large as the target allows, evened out so that every slot gets the same share. This
//! measured ~5-15% faster on the VAE's shapes than filling one shared tile in parallel
//! and running a pool-wide GEMM on it, and the scratch never grows with the image. Every
//! output element comes from exactly one GEMM with a fixed summation order, so results are
//! bitwise deterministic for a given thread count (the tiles depend on it).
//!
//! A 1×1×1 conv with stride 1 and no padding needs no im2col: a batch item's input
//! already is `cols`, so it runs as one pool-wide GEMM per batch item with no scratch.
//!
//! Zero time padding is not multiplied: each output frame whose kernel reaches into it
//! runs as its own GEMM over its real taps (the weights' last time taps, gathered once
//! into scratch), and the frames past it as one GEMM over the full kernel (`Job`). A
//! causal 3-frame kernel over a stream's first frame does a third of the work.
//!
//! A bf16 conv with stride 1 on the AVX512-BF16 path skips im2col altogether: its input
//! is packed once per band of output rows as VNNI pair planes, and the GEMM reads every
//! tap's shifted B from them in place (`planes`; 1.44× the im2col path's GFLOP/s on the
//! VAE's 96-channel full-size conv).

use rayon::prelude::*;

use super::cpu;
use super::cpu::amx::{self, Precision};
use super::cpu::pack::{as_u16, pack_a, pack_b_kstep, Operand, PANEL, TILE_K};
use super::gemm::{gemm, gemm_scratch_len, Compute, MatRef, Threads};
use crate::parallel;

/// Upper bound, in f32 elements, on the im2col scratch one conv uses (4 Mi floats = 16 MiB).
pub const CONV_SCRATCH_TARGET: usize = 4 << 20;

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
    fn patch_len(&self) -> usize {
        self.in_channels * self.kernel.iter().product::<usize>()
    }

    /// True when the input of a batch item already is the im2col matrix.
    fn is_pointwise(&self) -> bool {
        self.kernel == [1, 1, 1]
            && self.stride == [1, 1, 1]
            && self.pad_t_front == 0
            && self.pad_h == 0
            && self.pad_w == 0
    }

    fn debug_validate(&self) {
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

/// How one conv is cut into tiles: per batch item, `rounds` rounds of `slots` tiles.
#[derive(Debug, Clone, Copy)]
struct Plan {
    slots: usize,
    rounds: usize,
    /// Output pixels per tile (the last tiles of a batch item may be shorter or empty).
    tile: usize,
    /// Scratch floats per slot: `cols[K, tile]` then the GEMM result `[Cout, tile]` (on
    /// the AMX path: 32 staged rows `[32, tile]`, the result, then B packed in place).
    per_slot: usize,
    /// Scratch floats in front of the slots, shared by them: the weights packed once
    /// for the AMX tiles (0 off that path).
    shared: usize,
    /// The AMX precision when the GEMMs run on packed operands.
    amx: Option<Precision>,
}

/// The AMX precision of `p`'s GEMMs when the tiles run them: the weights are then packed
/// once per call and im2col writes straight into packed B.
fn amx_precision(p: &Conv3dParams) -> Option<Precision> {
    if !cpu::selected().packs_bf16() {
        return None;
    }
    match p.compute {
        Compute::Bf16 => Some(Precision::Bf16),
        Compute::NearF32 => Some(Precision::Bf16x3),
        Compute::F32 => None,
    }
}

/// Floats in front of an AMX slot's packed B (32 staged rows, then the result), rounded up
/// to 64 bytes: tile loads from an unaligned packed B measured 6× slower.
fn amx_lead(cout: usize, tile: usize) -> usize {
    ((PANEL + cout) * tile).next_multiple_of(16)
}

/// `u16` scratch seen as f32 elements (rounded up).
fn u16_in_f32(len: usize) -> usize {
    len.div_ceil(2)
}

impl Plan {
    /// Tiles for `pixels` output pixels of `p` (the whole output, or one job's part).
    fn new(p: &Conv3dParams, pixels: usize, target: usize, slots: usize) -> Self {
        let wo = p.out_dims()[2];
        let (k, cout) = (p.patch_len(), p.out_channels);
        let amx = amx_precision(p);
        let per_pixel = match amx {
            // Packed B (K rounded up, per part), 32 staged rows and the result.
            Some(prec) => u16_in_f32(amx::packed_b_len(1, k, prec) / PANEL) + PANEL + cout,
            None => k + cout,
        };
        let max_tile = (target / per_pixel.max(1)).max(wo).min(pixels).max(1);
        // Equal tiles, a whole number of rounds: no slot idles while another finishes.
        let rounds = pixels.div_ceil(slots * max_tile).max(1);
        let tile = pixels.div_ceil(rounds * slots).max(1);
        let (per_slot, shared) = match amx {
            Some(prec) => (
                amx_lead(cout, tile) + u16_in_f32(amx::packed_b_len(tile, k, prec)),
                u16_in_f32(amx::packed_a_len(cout, k, prec)),
            ),
            None => (
                per_pixel * tile + gemm_scratch_len(cout, tile, k, p.compute, Threads::One),
                0,
            ),
        };
        Self {
            slots,
            rounds,
            tile,
            per_slot,
            shared,
            amx,
        }
    }

    /// First pixel and pixel count of slot `slot`'s tile in round `round`.
    fn tile_range(&self, pixels: usize, round: usize, slot: usize) -> (usize, usize) {
        let start = ((round * self.slots + slot) * self.tile).min(pixels);
        (start, self.tile.min(pixels - start))
    }
}

fn scratch_len_for_route(p: &Conv3dParams, route: Route, slots: usize) -> usize {
    let target = route.target;
    if p.out_len() == 0 {
        0
    } else if p.is_pointwise() {
        let [to, ho, wo] = p.out_dims();
        gemm_scratch_len(
            p.out_channels,
            to * ho * wo,
            p.in_channels,
            p.compute,
            Threads::Pool,
        )
    } else {
        let jobs = jobs(p, route.f32_planes);
        let tiles = jobs
            .iter()
            .map(|job| {
                if planes::eligible(job) {
                    return planes::scratch_len(job, target, slots);
                }
                let plan = Plan::new(&job.params, job.count, target, slots);
                plan.shared + slots * plan.per_slot
            })
            .max()
            .unwrap_or(0);
        head_weight_len(&jobs) + tiles
    }
}

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
struct Job {
    params: Conv3dParams,
    /// Leading time taps dropped (0 for the main job).
    skip: usize,
    /// Every tap falls on zeros: the output is the bias alone.
    bias_only: bool,
    first: usize,
    count: usize,
    dst0: usize,
    /// Exact f32 compute may run on planes ([`f32_on_planes`]).
    f32_planes: bool,
}

impl Job {
    /// Whether the job runs on gathered taps (a head frame with some real taps).
    fn gathers(&self) -> bool {
        self.skip > 0 && !self.bias_only
    }
}

/// The environment variable that picks where exact f32 stride-1 convs run on AVX-512
/// paths: `planes` (the direct f32 kernel, [`planes`]) or `im2col` (columns through the
/// routed GEMM). Unset, [`f32_on_planes`] picks by CPU.
pub const CONV_F32_ENV: &str = "HEADROOM_CONV_F32";

/// Whether exact f32 stride-1 convs run on planes: as `HEADROOM_CONV_F32` says, else on
/// AMD CPUs only. Measured with `conv_probe f32` at the VAE's shapes: on AMD EPYC (Zen 4)
/// planes ran 1.5-1.7x im2col's speed; on an Intel Xeon with AMX they ran 0.56-0.89x
/// (split-line loads of shifted B rows cost the Intel cores more than the im2col copy).
/// Read once, so a process never mixes the two (their bytes differ by rounding).
pub fn f32_on_planes() -> bool {
    static CHOICE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| {
        let by_cpu = cpu::vendor_is_amd();
        match std::env::var(CONV_F32_ENV) {
            Ok(v) if v.trim().eq_ignore_ascii_case("planes") => true,
            Ok(v) if v.trim().eq_ignore_ascii_case("im2col") => false,
            Ok(v) if !v.trim().is_empty() => {
                let name = if by_cpu { "planes" } else { "im2col" };
                eprintln!("warning: {CONV_F32_ENV}={v:?} is not planes or im2col; using {name}");
                by_cpu
            }
            _ => by_cpu,
        }
    })
}

/// How one conv call is cut and routed.
#[derive(Debug, Clone, Copy)]
struct Route {
    /// Scratch target of its im2col tiles and plane bands, in f32 elements.
    target: usize,
    /// Exact f32 stride-1 jobs may run on planes.
    f32_planes: bool,
}

impl Default for Route {
    fn default() -> Self {
        Route {
            target: CONV_SCRATCH_TARGET,
            f32_planes: f32_on_planes(),
        }
    }
}

/// The jobs of a non-pointwise conv, head frames first; `f32_planes` as in [`Route`].
fn jobs(p: &Conv3dParams, f32_planes: bool) -> Vec<Job> {
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
fn head_weight_len(jobs: &[Job]) -> usize {
    jobs.iter()
        .filter(|j| j.gathers())
        .map(|j| j.params.weight_len())
        .max()
        .unwrap_or(0)
}

/// f32 elements of scratch [`conv3d`] needs for `p` (depends on the thread count).
pub fn conv3d_scratch_len(p: &Conv3dParams) -> usize {
    scratch_len_for_route(p, Route::default(), parallel::num_threads())
}

/// f32 elements of scratch [`conv2d`] needs for `p` (depends on the thread count).
pub fn conv2d_scratch_len(p: &Conv2dParams) -> usize {
    conv3d_scratch_len(&p.to_3d())
}

/// 3-D convolution into `out`, using `scratch` of at least [`conv3d_scratch_len`] floats.
///
/// `input` is `[B, Cin, T, H, W]`, `weight` `[Cout, Cin, kt, kh, kw]`, `bias` `[Cout]` and
/// `out` `[B, Cout, To, Ho, Wo]`. Panics if a slice has the wrong length.
pub fn conv3d(
    p: &Conv3dParams,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    conv3d_routed(p, input, weight, bias, out, scratch, Route::default());
}

/// 2-D convolution into `out`, using `scratch` of at least [`conv2d_scratch_len`] floats.
///
/// `input` is `[B, Cin, H, W]`, `weight` `[Cout, Cin, kh, kw]`, `bias` `[Cout]` and `out`
/// `[B, Cout, Ho, Wo]`. Panics if a slice has the wrong length.
pub fn conv2d(
    p: &Conv2dParams,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    // [B, Cin, H, W] and [Cout, Cin, kh, kw] are the 3-D layouts with T = kt = 1.
    conv3d(&p.to_3d(), input, weight, bias, out, scratch);
}

/// [`conv3d`] on an explicit [`Route`], so tests can force many small tiles and either
/// f32 kernel.
fn conv3d_routed(
    p: &Conv3dParams,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [f32],
    route: Route,
) {
    let target = route.target;
    p.debug_validate();
    assert_eq!(input.len(), p.in_len(), "conv3d: input length");
    assert_eq!(weight.len(), p.weight_len(), "conv3d: weight length");
    assert_eq!(out.len(), p.out_len(), "conv3d: output length");
    if let Some(bias) = bias {
        assert_eq!(bias.len(), p.out_channels, "conv3d: bias length");
    }
    let slots = parallel::num_threads();
    assert!(
        scratch.len() >= scratch_len_for_route(p, route, slots),
        "conv3d: scratch too short"
    );
    if out.is_empty() {
        return;
    }
    let [to, ho, wo] = p.out_dims();
    let in_batch = p.in_channels * p.in_t * p.in_h * p.in_w;
    let out_batch = p.out_channels * to * ho * wo;
    if p.is_pointwise() {
        parallel::run(|| {
            for b in 0..p.batch {
                let src = &input[b * in_batch..(b + 1) * in_batch];
                let dst = &mut out[b * out_batch..(b + 1) * out_batch];
                pointwise(p, src, weight, bias, dst, scratch);
            }
        });
        return;
    }
    let jobs = jobs(p, route.f32_planes);
    let (head_weights, scratch) = scratch.split_at_mut(head_weight_len(&jobs));
    parallel::run(|| {
        // Job by job, so a head job's taps are gathered once for every batch item.
        for job in &jobs {
            let geom = Geometry::new(&job.params, p.in_t);
            let plan = Plan::new(&job.params, job.count, target, slots);
            let taps: &[f32] = if job.gathers() {
                let taps = &mut head_weights[..job.params.weight_len()];
                gather_taps(weight, p, job.skip, taps);
                taps
            } else {
                weight
            };
            if planes::eligible(job) {
                planes::run(&geom, job, input, taps, bias, out, scratch, target, slots);
                continue;
            }
            for b in 0..p.batch {
                let src = &input[b * in_batch..(b + 1) * in_batch];
                let dst = &mut out[b * out_batch..(b + 1) * out_batch];
                if job.bias_only {
                    fill_rows(dst, p.out_channels, job.dst0, job.count, bias);
                } else {
                    tiled(&geom, &plan, job, src, taps, bias, dst, scratch);
                }
            }
        }
    });
}

/// `out[co, ci, dt, …] = weight[co, ci, skip + dt, …]`: the last `kt − skip` time taps.
fn gather_taps(weight: &[f32], p: &Conv3dParams, skip: usize, out: &mut [f32]) {
    let [kt, kh, kw] = p.kernel;
    let plane = kh * kw;
    let (from, to) = (kt * plane, (kt - skip) * plane);
    for (dst, src) in out.chunks_exact_mut(to).zip(weight.chunks_exact(from)) {
        dst.copy_from_slice(&src[skip * plane..]);
    }
}

/// Output pixels `dst0..dst0 + count` of every channel row set to the channel's bias (or 0).
fn fill_rows(dst: &mut [f32], cout: usize, dst0: usize, count: usize, bias: Option<&[f32]>) {
    let row = dst.len() / cout;
    dst.par_chunks_mut(row).enumerate().for_each(|(co, r)| {
        r[dst0..dst0 + count].fill(bias.map_or(0.0, |b| b[co]));
    });
}

/// One batch item of a 1×1×1, stride-1, unpadded conv: `dst[Cout, P] = W · src[Cin, P]`.
fn pointwise(
    p: &Conv3dParams,
    src: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    dst: &mut [f32],
    scratch: &mut [f32],
) {
    let (ci, co) = (p.in_channels, p.out_channels);
    let px = dst.len() / co;
    let (w, x) = (
        Operand::F32(MatRef::row_major(weight, 0, ci)),
        Operand::F32(MatRef::row_major(src, 0, px)),
    );
    gemm(
        co,
        px,
        ci,
        w,
        x,
        dst,
        0,
        px,
        false,
        1.0,
        p.compute,
        Threads::Pool,
        scratch,
    );
    if let Some(bias) = bias {
        dst.par_chunks_mut(px).zip(bias).for_each(|(row, &b)| {
            row.iter_mut().for_each(|v| *v += b);
        });
    }
}

/// One batch item through im2col tiles: each round, every slot fills and multiplies its
/// own tile into its own scratch, then the results are copied into `dst` row by row.
#[allow(clippy::too_many_arguments)]
fn tiled(
    geom: &Geometry,
    plan: &Plan,
    job: &Job,
    src: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    dst: &mut [f32],
    scratch: &mut [f32],
) {
    let p = &geom.p;
    let (k, cout) = (p.patch_len(), p.out_channels);
    let pixels = job.count;
    let row_len = dst.len() / cout;
    let w = Operand::F32(MatRef::row_major(weight, 0, k));
    let (shared, scratch) =
        scratch[..plan.shared + plan.slots * plan.per_slot].split_at_mut(plan.shared);
    if let Some(prec) = plan.amx {
        // The weights as A panels, once for every tile of the call.
        let packed = as_u16(shared);
        let panel = amx::packed_a_len(PANEL, k, prec);
        packed[..amx::packed_a_len(cout, k, prec)]
            .par_chunks_mut(panel)
            .enumerate()
            .for_each(|(ib, out)| {
                let r0 = ib * PANEL;
                pack_a(&w, r0, PANEL.min(cout - r0), k, prec.parts().0, out);
            });
    }
    let weights_packed: &[u16] = as_u16(shared);
    // Each slot starts with its cols (32 staged rows on the AMX path), then the result.
    let lead = if plan.amx.is_some() { PANEL } else { k } * plan.tile;
    for round in 0..plan.rounds {
        // Exactly `slots` contiguous scratch chunks, one per tile of the round.
        scratch
            .par_chunks_mut(plan.per_slot)
            .enumerate()
            .for_each(|(slot, buf)| {
                let (p0, n) = plan.tile_range(pixels, round, slot);
                if n == 0 {
                    return;
                }
                let (cols, rest) = buf.split_at_mut(lead);
                let result_len = match plan.amx {
                    Some(_) => amx_lead(cout, plan.tile) - lead,
                    None => cout * plan.tile,
                };
                let (result, gemm_scratch) = rest.split_at_mut(result_len);
                let result = &mut result[..cout * n];
                match plan.amx {
                    Some(prec) => {
                        // im2col k-step by k-step into packed B: 32 rows staged at a time.
                        let packed = as_u16(gemm_scratch);
                        for s in 0..k.div_ceil(TILE_K) {
                            let rows = (k - s * TILE_K).min(TILE_K);
                            for r in 0..rows {
                                fill_cols_row(
                                    geom,
                                    src,
                                    s * TILE_K + r,
                                    job.first + p0,
                                    &mut cols[r * n..(r + 1) * n],
                                );
                            }
                            pack_b_kstep(cols, k, n, s, prec.parts().1, packed);
                        }
                        let dst = amx::Dst {
                            data: result,
                            offset: 0,
                            ldc: n,
                        };
                        amx::gemm_packed(cout, n, k, weights_packed, packed, dst, false, 1.0, prec);
                    }
                    None => {
                        let cols = &mut cols[..k * n];
                        fill_cols(geom, src, job.first + p0, n, cols);
                        let x = Operand::F32(MatRef::row_major(cols, 0, n));
                        gemm(
                            cout,
                            n,
                            k,
                            w,
                            x,
                            result,
                            0,
                            n,
                            false,
                            1.0,
                            p.compute,
                            Threads::One,
                            gemm_scratch,
                        );
                    }
                }
            });
        // The GEMM results are [Cout, n] blocks; dst rows are strided by P, so they are
        // scattered by output channel (with the bias) in a second, row-parallel pass.
        let scratch = &*scratch;
        dst.par_chunks_mut(row_len)
            .enumerate()
            .for_each(|(co, row)| {
                for slot in 0..plan.slots {
                    let (p0, n) = plan.tile_range(pixels, round, slot);
                    let result = &scratch[slot * plan.per_slot + lead..];
                    let from = &result[co * n..(co + 1) * n];
                    let to = &mut row[job.dst0 + p0..job.dst0 + p0 + n];
                    match bias {
                        Some(bias) => {
                            let b = bias[co];
                            to.iter_mut().zip(from).for_each(|(d, &v)| *d = v + b);
                        }
                        None => to.copy_from_slice(from),
                    }
                }
            });
    }
}

/// The conv (or one job's part of it) plus the sizes the im2col fill derives from it.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    p: Conv3dParams,
    /// Elements of one input channel of one batch item (`T·H·W` of the real input, whose
    /// first `p.in_t` frames a head job reads).
    in_chan: usize,
    out_w: usize,
    /// Output pixels per frame (`Ho·Wo`).
    out_frame: usize,
}

impl Geometry {
    /// The geometry of `p` over an input of `in_t` frames per channel (`p.in_t` or more).
    fn new(p: &Conv3dParams, in_t: usize) -> Self {
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
    fn source_row<'a>(
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

/// Fills `cols[K, n]` for output pixels `p0..p0 + n` of one batch item, on the calling thread.
fn fill_cols(g: &Geometry, src: &[f32], p0: usize, n: usize, cols: &mut [f32]) {
    for (row, dst) in cols.chunks_mut(n).enumerate() {
        fill_cols_row(g, src, row, p0, dst);
    }
}

/// Fills row `row` of `cols` (one input channel under one kernel tap) for output pixels
/// `p0..p0 + dst.len()`.
fn fill_cols_row(g: &Geometry, src: &[f32], row: usize, p0: usize, dst: &mut [f32]) {
    let [_, kh, kw] = g.p.kernel;
    let taps = kh * kw * g.p.kernel[0];
    let (ci, tap) = (row / taps, row % taps);
    let (dt, dy, dx) = (tap / (kh * kw), (tap / kw) % kh, tap % kw);
    let chan = &src[ci * g.in_chan..(ci + 1) * g.in_chan];
    fill_row(g, chan, [dt, dy, dx], p0, dst);
}

/// Fills one row of `cols`: the values under `tap` for output pixels `p0..p0 + dst.len()`.
fn fill_row(g: &Geometry, chan: &[f32], tap: [usize; 3], p0: usize, dst: &mut [f32]) {
    let sw = g.p.stride[2];
    let mut pixel = p0;
    let mut done = 0;
    // Walk the pixel range one output-row segment at a time.
    while done < dst.len() {
        let (t, rest) = (pixel / g.out_frame, pixel % g.out_frame);
        let (y, x) = (rest / g.out_w, rest % g.out_w);
        let len = (g.out_w - x).min(dst.len() - done);
        let seg = &mut dst[done..done + len];
        match g.source_row(chan, t, y, tap) {
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

mod planes;
#[cfg(test)]
mod tests;
