//! The im2col path: each batch item's output pixels are cut into equal tiles, one per
//! pool thread and round ([`Plan`]); every slot fills its tile's `cols[K, n]` from the
//! input (on the AMX path k-step by k-step straight into packed B, against weights
//! packed once per call) and multiplies it with a one-thread GEMM, then a row-parallel
//! pass scatters the results, plus the bias, into the output.

use rayon::prelude::*;

use super::job::Job;
use super::params::{Conv3dParams, Geometry};
use crate::kernels::cpu;
use crate::kernels::cpu::amx::{self, Precision};
use crate::kernels::cpu::pack::{as_u16, pack_a, pack_b_kstep, Operand, PANEL, TILE_K};
use crate::kernels::gemm::{gemm, gemm_scratch_len, Compute, MatRef, Threads};

/// How one conv is cut into tiles: per batch item, `rounds` rounds of `slots` tiles.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    /// Tiles per round: one per pool thread.
    pub(super) slots: usize,
    /// Rounds per batch item.
    pub(super) rounds: usize,
    /// Output pixels per tile (the last tiles of a batch item may be shorter or empty).
    pub(super) tile: usize,
    /// Scratch floats per slot: `cols[K, tile]` then the GEMM result `[Cout, tile]` (on
    /// the AMX path: 32 staged rows `[32, tile]`, the result, then B packed in place).
    pub(super) per_slot: usize,
    /// Scratch floats in front of the slots, shared by them: the weights packed once
    /// for the AMX tiles (0 off that path).
    pub(super) shared: usize,
    /// The AMX precision when the GEMMs run on packed operands.
    pub(super) amx: Option<Precision>,
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
    pub(super) fn new(p: &Conv3dParams, pixels: usize, target: usize, slots: usize) -> Self {
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

/// One batch item through im2col tiles: each round, every slot fills and multiplies its
/// own tile into its own scratch, then the results are copied into `dst` row by row.
#[allow(clippy::too_many_arguments)]
pub(super) fn tiled(
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
