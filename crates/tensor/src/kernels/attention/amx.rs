//! The AMX path of [`super::attention`]: the same tiles and online softmax, with the
//! operands packed once where the generic path packs them per product. A slot packs its
//! query tile once for all key tiles, and a head's Kᵀ and V tiles once for all of its
//! query tiles when the head has at most [`super::KV_PACKED_MAX`] keys. The products run
//! the same loops over the same packed bytes as [`crate::kernels::gemm::gemm`] would, so
//! the output bits equal the generic path's.

use super::{online_softmax, write_rows, AttentionParams, Plan, BLOCK_KV, BLOCK_Q};
use crate::kernels::cpu;
use crate::kernels::cpu::amx::{self, Precision};
use crate::kernels::cpu::pack::{as_u16, pack_a, pack_b, Operand, PANEL};
use crate::kernels::gemm::{Compute, MatRef};

/// The AMX precision of the two products for `compute` when the tiles run them.
pub(super) fn amx_precision(compute: Compute) -> Option<Precision> {
    if !cpu::selected().packs_bf16() {
        return None;
    }
    match compute {
        Compute::Bf16 => Some(Precision::Bf16),
        Compute::NearF32 => Some(Precision::Bf16x3),
        Compute::F32 => None,
    }
}

/// Whether the fused bf16 softmax applies the scale (the score product then leaves its
/// output unscaled, saving a pass over it): bf16 products on x86-64 with a positive scale.
fn folds_scale(p: &AttentionParams, prec: Precision) -> bool {
    cfg!(target_arch = "x86_64") && prec == Precision::Bf16 && p.scale > 0.0
}

/// `u16` lengths of one packed Kᵀ tile and one packed V tile.
pub(super) fn kv_tile_lens(head_dim: usize, prec: Precision) -> (usize, usize) {
    (
        amx::packed_b_len(BLOCK_KV, head_dim, prec),
        amx::packed_b_len(head_dim, BLOCK_KV, prec),
    )
}

/// `u16` lengths of the packed Q tile and the packed P tile.
pub(super) fn qp_lens(head_dim: usize, prec: Precision) -> (usize, usize) {
    (
        amx::packed_a_len(BLOCK_Q, head_dim, prec),
        amx::packed_a_len(BLOCK_Q, BLOCK_KV, prec),
    )
}

/// Key tiles whose packing a slot keeps (a whole head's when it has at most `cap` keys).
pub(super) fn kept_kv_tiles(kv_len: usize, cap: usize) -> usize {
    if kv_len <= cap {
        kv_len.div_ceil(BLOCK_KV)
    } else {
        0
    }
}

/// The three inputs of an attention call.
#[derive(Clone, Copy)]
pub(super) struct Input<'a> {
    pub(super) q: &'a [f32],
    pub(super) k: &'a [f32],
    pub(super) v: &'a [f32],
}

/// The work items `items` of one slot on AMX tiles, head by head: when the head's keys
/// fit the slot (at most `cap`), its Kᵀ and V tiles are packed once and every query
/// tile of the chunk reuses them; otherwise each query tile packs them as it goes.
/// Every output row gets the same operations in the same order either way (the packed
/// bytes do not depend on when they were packed), so the bits do not change.
#[allow(clippy::too_many_arguments)]
pub(super) fn amx_chunk(
    p: &AttentionParams,
    plan: &Plan<'_>,
    prec: Precision,
    items: std::ops::Range<usize>,
    input: Input<'_>,
    out: &mut [f32],
    out_base: usize,
    slot: &mut [f32],
    cap: usize,
) {
    // (head, rows) in head-major order, so one head's packed keys serve all its tiles.
    let mut work: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    for i in items {
        let (heads, rows) = plan.item(i);
        for h in heads {
            work.push((h, rows.clone()));
        }
    }
    work.sort_by_key(|(h, _)| *h);
    let keep = p.kv_len <= cap;
    let kv_end = work
        .iter()
        .map(|(_, rows)| p.visible_keys(rows.end - 1))
        .max()
        .unwrap_or(0);
    let mut t = AmxTile::new(p, prec, slot, cap);
    let mut packed_head = None;
    for (h, rows) in work {
        if keep && packed_head != Some(h) {
            for c0 in (0..kv_end).step_by(BLOCK_KV) {
                t.pack_kv(
                    p,
                    prec,
                    input,
                    h,
                    c0,
                    BLOCK_KV.min(p.kv_len - c0),
                    c0 / BLOCK_KV,
                );
            }
            packed_head = Some(h);
        }
        t.run(p, prec, input, h, rows, out, out_base, keep);
    }
}

/// One slot's scratch on the AMX path: the score, accumulator and softmax tiles, the
/// packed Q and P tiles, and the packed Kᵀ/V tiles it keeps.
struct AmxTile<'a> {
    s: &'a mut [f32],
    acc: &'a mut [f32],
    m: &'a mut [f32],
    l: &'a mut [f32],
    q_packed: &'a mut [u16],
    p_packed: &'a mut [u16],
    /// Packed Kᵀ tile `i` then V tile `i`, for every kept key tile `i`, then one more
    /// pair for a tile packed as it is used.
    kv: &'a mut [u16],
    /// Kept key tiles.
    kept: usize,
    kt_len: usize,
    vt_len: usize,
}

impl<'a> AmxTile<'a> {
    fn new(p: &AttentionParams, prec: Precision, slot: &'a mut [f32], cap: usize) -> Self {
        let d = p.head_dim;
        let (s, rest) = slot.split_at_mut(BLOCK_Q * BLOCK_KV);
        let (acc, rest) = rest.split_at_mut(BLOCK_Q * d);
        let (m, rest) = rest.split_at_mut(BLOCK_Q);
        let (l, packing) = rest.split_at_mut(BLOCK_Q);
        let packing = as_u16(packing);
        let (qa, pa) = qp_lens(d, prec);
        let (kt_len, vt_len) = kv_tile_lens(d, prec);
        let (q_packed, rest) = packing.split_at_mut(qa);
        let (p_packed, kv) = rest.split_at_mut(pa);
        let kept = kept_kv_tiles(p.kv_len, cap);
        let kv_len = (kept + 1) * (kt_len + vt_len);
        Self {
            kept,
            s,
            acc,
            m,
            l,
            q_packed,
            p_packed,
            kv: &mut kv[..kv_len],
            kt_len,
            vt_len,
        }
    }

    /// Packs `cols` keys from key `c0` of head `h` (Kᵀ and V) into tile slot `at`.
    #[allow(clippy::too_many_arguments)]
    fn pack_kv(
        &mut self,
        p: &AttentionParams,
        prec: Precision,
        x: Input<'_>,
        h: usize,
        c0: usize,
        cols: usize,
        at: usize,
    ) {
        let d = p.head_dim;
        let (kt, vt) = (self.kt_len, self.vt_len);
        let (k_dst, v_dst) = self.kv[at * (kt + vt)..(at + 1) * (kt + vt)].split_at_mut(kt);
        let k_t = Operand::F32(p.k_t(x.k, h, c0));
        pack_b(
            &k_t,
            d,
            cols,
            0..cols.div_ceil(PANEL),
            prec.parts().1,
            k_dst,
        );
        let v_tile = Operand::F32(p.v_rows(x.v, h, c0));
        pack_b(
            &v_tile,
            cols,
            d,
            0..d.div_ceil(PANEL),
            prec.parts().1,
            v_dst,
        );
    }

    /// The online softmax of the score tile into the packed P tile: fused for bf16
    /// products, else through the shared f32 step and the packer (near-f32 needs the f32
    /// probabilities' low parts).
    fn probabilities(
        &mut self,
        p: &AttentionParams,
        prec: Precision,
        rows: &std::ops::Range<usize>,
        c0: usize,
        cols: usize,
    ) {
        let n_rows = rows.len();
        let d = p.head_dim;
        #[cfg(target_arch = "x86_64")]
        if folds_scale(p, prec) {
            let mut run = super::probs::Running {
                m: &mut *self.m,
                l: &mut *self.l,
                acc: &mut self.acc[..n_rows * d],
            };
            super::probs::softmax_into_packed(p, rows, c0, cols, self.s, &mut run, self.p_packed);
            return;
        }
        online_softmax(
            p,
            rows,
            c0,
            cols,
            self.s,
            &mut self.acc[..n_rows * d],
            self.m,
            self.l,
        );
        let p_tile = Operand::F32(MatRef::row_major(self.s, 0, BLOCK_KV));
        pack_a(&p_tile, 0, n_rows, cols, prec.parts().0, self.p_packed);
    }

    /// Query rows `rows` of head `h` into `out` (element 0 = element `out_base` of the
    /// whole output); the key tiles are kept packed already when `kept`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        p: &AttentionParams,
        prec: Precision,
        x: Input<'_>,
        h: usize,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
        out_base: usize,
        kept: bool,
    ) {
        let d = p.head_dim;
        let n_rows = rows.len();
        self.acc[..n_rows * d].fill(0.0);
        self.m.fill(f32::NEG_INFINITY);
        self.l.fill(0.0);
        let q_tile = Operand::F32(p.q_rows(x.q, h, rows.start));
        pack_a(&q_tile, 0, n_rows, d, prec.parts().0, self.q_packed);
        let kv_end = p.visible_keys(rows.end - 1);
        for c0 in (0..kv_end).step_by(BLOCK_KV) {
            let cols = BLOCK_KV.min(kv_end - c0);
            // A kept tile holds all of its keys; a query tile that sees fewer of them
            // (a causal mask) packs just those, as the products need exactly its keys.
            let full = BLOCK_KV.min(p.kv_len - c0);
            let at = if kept && cols == full {
                c0 / BLOCK_KV
            } else {
                self.pack_kv(p, prec, x, h, c0, cols, self.kept);
                self.kept
            };
            let (kt, vt) = (self.kt_len, self.vt_len);
            let k_range = at * (kt + vt)..at * (kt + vt) + kt;
            let v_range = k_range.end..k_range.end + vt;
            let dst = amx::Dst {
                data: &mut *self.s,
                offset: 0,
                ldc: BLOCK_KV,
            };
            amx::gemm_packed(
                n_rows,
                cols,
                d,
                self.q_packed,
                &self.kv[k_range],
                dst,
                false,
                if folds_scale(p, prec) { 1.0 } else { p.scale },
                prec,
            );
            self.probabilities(p, prec, &rows, c0, cols);
            let dst = amx::Dst {
                data: &mut self.acc[..n_rows * d],
                offset: 0,
                ldc: d,
            };
            amx::gemm_packed(
                n_rows,
                d,
                cols,
                self.p_packed,
                &self.kv[v_range],
                dst,
                true,
                1.0,
                prec,
            );
        }
        write_rows(p, h, &rows, &self.acc[..n_rows * d], self.l, out, out_base);
    }
}
