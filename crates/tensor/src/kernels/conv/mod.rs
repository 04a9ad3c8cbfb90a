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
//!
//! This module checks a call and routes it; `params` holds the shapes, `job` cuts a conv
//! at its zero time padding, `im2col` runs the tiled path and `planes` the direct one.

mod im2col;
mod job;
mod params;

use rayon::prelude::*;

use self::im2col::{tiled, Plan};
use self::job::{fill_rows, gather_taps, head_weight_len, jobs};
use self::params::Geometry;
pub use self::params::{Conv2dParams, Conv3dParams, TimePad};
use super::cpu;
use super::cpu::pack::Operand;
use super::gemm::{gemm, gemm_scratch_len, MatRef, Threads};
use crate::parallel;

/// Upper bound, in f32 elements, on the im2col scratch one conv uses (4 Mi floats = 16 MiB).
pub const CONV_SCRATCH_TARGET: usize = 4 << 20;

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

/// The environment variable that picks where exact f32 stride-1 convs run on AVX-512
/// paths: `planes` (the direct f32 kernel, `planes`) or `im2col` (columns through the
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

mod planes;
#[cfg(test)]
mod tests;
