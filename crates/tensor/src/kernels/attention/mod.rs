//! Flash-style tiled scaled dot-product attention: `out = softmax(scale·Q·Kᵀ + mask)·V`
//! per head, without ever materialising the `[q_len, kv_len]` score matrix.
//!
//! Algorithm. The work is cut into query tiles of at most [`BLOCK_Q`] rows of one head.
//! A tile walks the keys in tiles of [`BLOCK_KV`]: `S = scale·Q_tile·K_tileᵀ` (one GEMM), masked
//! entries are excluded, and an *online softmax* keeps per row the running maximum `m`
//! and the running sum `l` of `exp(s − m)`; when a new key tile raises `m`, the
//! accumulator and `l` are rescaled by `exp(m_old − m_new)` before `O_acc += P·V_tile`
//! (a second GEMM). After the last key tile `O = O_acc / l`. Key tiles that the mask
//! hides from every row of the query tile are never computed, and a row that sees no
//! key at all (only possible when `kv_len == 0`) gets zeros instead of NaN.
//!
//! Memory bound. Scratch per thread slot is one `BLOCK_Q × BLOCK_KV` score tile, one
//! `BLOCK_Q × head_dim` accumulator and two `BLOCK_Q` vectors, so the total is
//! `slots · (BLOCK_Q·BLOCK_KV + BLOCK_Q·head_dim + 2·BLOCK_Q)` floats, independent of
//! both sequence lengths (see [`attention_scratch_len`]).
//!
//! Parallelism and determinism. A work item is one query tile of one head (outputs
//! laid out heads-first) or one query tile of all heads (tokens-first), so that items
//! own disjoint, increasing ranges of `out`. The items are split into exactly `slots`
//! contiguous chunks, balanced by how many keys they see (causal masks), and each chunk
//! runs as one rayon task with its own scratch slot and its own sub-slice of `out`.
//! Every output row is computed by one task in a fixed order of operations, and a
//! tile's arithmetic does not depend on which chunk holds it, so the bytes are the same
//! on every call with the same thread count.

mod amx;
#[cfg(target_arch = "x86_64")]
mod probs;

use self::amx::{amx_chunk, amx_precision, kept_kv_tiles, kv_tile_lens, qp_lens, Input};
use crate::kernels::cpu::pack::{Operand, PANEL};
use crate::kernels::gemm::{gemm, gemm_scratch_len, Compute, MatRef, Threads};
use crate::kernels::softmax::{exp_with_max, scale_in_place};
use crate::parallel;

/// Query rows per tile: large enough that each key/value tile packed by the GEMM is
/// reused over many rows.
pub const BLOCK_Q: usize = 256;
/// Keys per tile: large enough to amortise GEMM call overhead, small enough that the
/// score tile stays in L2.
pub const BLOCK_KV: usize = 256;

/// Which keys a query may see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mask {
    /// Every query sees every key.
    None,
    /// Block-causal: query `i` sees key `j` iff `j / block_len <= (q_start + i) / block_len`.
    BlockCausal {
        /// Tokens per causal block (must be > 0).
        block_len: usize,
        /// Absolute position of query 0 (keys start at absolute position 0).
        q_start: usize,
    },
}

/// Shapes, scale, mask and element strides of one attention call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Number of heads.
    pub heads: usize,
    /// Number of queries per head.
    pub q_len: usize,
    /// Number of keys (and values) per head.
    pub kv_len: usize,
    /// Elements per head vector (contiguous in memory).
    pub head_dim: usize,
    /// Factor applied to `q·k`, usually `1/sqrt(head_dim)`.
    pub scale: f32,
    /// Which keys each query sees.
    pub mask: Mask,
    /// Elements between heads in `q`.
    pub q_head_stride: usize,
    /// Elements between tokens in `q`.
    pub q_token_stride: usize,
    /// Elements between heads in `k`.
    pub k_head_stride: usize,
    /// Elements between tokens in `k`.
    pub k_token_stride: usize,
    /// Elements between heads in `v`.
    pub v_head_stride: usize,
    /// Elements between tokens in `v`.
    pub v_token_stride: usize,
    /// Elements between heads in `out`.
    pub out_head_stride: usize,
    /// Elements between tokens in `out`.
    pub out_token_stride: usize,
    /// What the two products compute in.
    pub compute: Compute,
}

impl AttentionParams {
    /// The query rows from `row` on of head `h`: `[rows, head_dim]`.
    fn q_rows<'a>(&self, q: &'a [f32], h: usize, row: usize) -> MatRef<'a, f32> {
        MatRef {
            data: q,
            offset: h * self.q_head_stride + row * self.q_token_stride,
            row_stride: self.q_token_stride as isize,
            col_stride: 1,
        }
    }

    /// Kᵀ of head `h` from key `c0` on: element (dim, key).
    fn k_t<'a>(&self, k: &'a [f32], h: usize, c0: usize) -> MatRef<'a, f32> {
        MatRef {
            data: k,
            offset: h * self.k_head_stride + c0 * self.k_token_stride,
            row_stride: 1,
            col_stride: self.k_token_stride as isize,
        }
    }

    /// V of head `h` from key `c0` on: `[keys, head_dim]`.
    fn v_rows<'a>(&self, v: &'a [f32], h: usize, c0: usize) -> MatRef<'a, f32> {
        MatRef {
            data: v,
            offset: h * self.v_head_stride + c0 * self.v_token_stride,
            row_stride: self.v_token_stride as isize,
            col_stride: 1,
        }
    }

    /// Number of keys (a prefix `0..n`) that query row `row` sees.
    fn visible_keys(&self, row: usize) -> usize {
        match self.mask {
            Mask::None => self.kv_len,
            Mask::BlockCausal { block_len, q_start } => {
                let block_end = ((q_start + row) / block_len + 1).saturating_mul(block_len);
                block_end.min(self.kv_len)
            }
        }
    }
}

/// Floats of GEMM packing scratch one thread slot uses (the larger of the two products).
fn gemm_len(head_dim: usize, compute: Compute) -> usize {
    let qk = gemm_scratch_len(BLOCK_Q, BLOCK_KV, head_dim, compute, Threads::One);
    let pv = gemm_scratch_len(BLOCK_Q, head_dim, BLOCK_KV, compute, Threads::One);
    qk.max(pv)
}

/// Most keys whose packed K and V tiles a slot keeps for a whole head (2 MiB of bf16 at
/// head_dim 128): up to this many keys, every query tile of the slot's chunk reuses one
/// packing of the head's keys and values instead of repacking them per query tile.
pub const KV_PACKED_MAX: usize = 4096;

/// Floats of scratch one thread slot uses (`cap`: see [`attention_with_cap`]).
fn slot_len(p: &AttentionParams, cap: Option<usize>) -> usize {
    let d = p.head_dim;
    let tiles = BLOCK_Q * BLOCK_KV + BLOCK_Q * d + 2 * BLOCK_Q;
    match (amx_precision(p.compute), cap) {
        (Some(prec), Some(cap)) => {
            let (qa, pa) = qp_lens(d, prec);
            let (kt, vt) = kv_tile_lens(d, prec);
            tiles + (qa + pa + (kept_kv_tiles(p.kv_len, cap) + 1) * (kt + vt)).div_ceil(2)
        }
        _ => tiles + gemm_len(d, p.compute),
    }
}

/// Floats of scratch [`attention`] needs: a fixed tile set per kernel thread, independent
/// of `q_len`, growing with `kv_len` only up to [`KV_PACKED_MAX`] keys on the AMX path.
pub fn attention_scratch_len(p: &AttentionParams) -> usize {
    parallel::num_threads() * slot_len(p, Some(KV_PACKED_MAX))
}

/// How the output is walked so that work items own disjoint, increasing ranges of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// Heads are far apart in `out`: an item is one query tile of one head.
    HeadMajor,
    /// Tokens are far apart in `out`: an item is one query tile of all heads.
    TokenMajor,
}

/// The static description of the work items of one call.
struct Plan<'a> {
    p: &'a AttentionParams,
    order: Order,
    /// Query row panels ([`PANEL`] rows, the packed products' row unit; the last may be
    /// short) of one unit (a head, or all heads).
    panels: usize,
    q_tiles: usize,
    items: usize,
}

impl Plan<'_> {
    fn new(p: &AttentionParams, slots: usize) -> Plan<'_> {
        let order = if p.heads > 1 && (p.q_len == 1 || p.out_head_stride >= p.out_token_stride) {
            Order::HeadMajor
        } else {
            Order::TokenMajor
        };
        let units = match order {
            Order::HeadMajor => p.heads,
            Order::TokenMajor => 1,
        };
        // Tiles are whole panels of PANEL rows, since the packed products compute a
        // short panel at full size: 1170 rows as six tiles of 195 rows computed 6 × 224 =
        // 1344 (15 % more than needed). Use the fewest tiles of at most BLOCK_Q rows whose
        // item count is a multiple of the slot count, with the panels spread evenly over
        // them, so that the contiguous chunks can be balanced: 1170 rows (37 panels) on 2
        // slots become tiles of 6, 6, 6, 6, 6, 7 panels, 18 and 19 panels a slot.
        let panels = p.q_len.div_ceil(PANEL);
        let mut q_tiles = panels.div_ceil(BLOCK_Q / PANEL);
        while !(units * q_tiles).is_multiple_of(slots) && q_tiles < panels {
            q_tiles += 1;
        }
        Plan {
            p,
            order,
            panels,
            q_tiles,
            items: units * q_tiles,
        }
    }

    /// The heads and the query rows of work item `item`.
    fn item(&self, item: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let (heads, tile) = match self.order {
            Order::HeadMajor => {
                let h = item / self.q_tiles;
                (h..h + 1, item % self.q_tiles)
            }
            Order::TokenMajor => (0..self.p.heads, item),
        };
        let edge = |t: usize| (t * self.panels / self.q_tiles * PANEL).min(self.p.q_len);
        (heads, edge(tile)..edge(tile + 1))
    }

    /// Offset in `out` of the first element item `item` writes (`out_len` past the end).
    fn item_start(&self, item: usize, out_len: usize) -> usize {
        if item == self.items {
            return out_len;
        }
        let (heads, rows) = self.item(item);
        heads.start * self.p.out_head_stride + rows.start * self.p.out_token_stride
    }

    /// Estimated cost of an item: the keys its rows scan plus a per-row output cost, for
    /// its rows rounded up to whole panels (what the packed products compute).
    fn item_weight(&self, item: usize) -> u128 {
        let (heads, rows) = self.item(item);
        let keys = self.p.visible_keys(rows.end - 1) + self.p.head_dim;
        (heads.len() * rows.len().next_multiple_of(PANEL)) as u128 * keys as u128
    }

    /// Panics unless items own disjoint, increasing ranges that all fit in `out_len`.
    fn check_output_layout(&self, out_len: usize) {
        let p = self.p;
        let (outer, outer_stride, inner, inner_stride) = match self.order {
            Order::HeadMajor => (p.heads, p.out_head_stride, p.q_len, p.out_token_stride),
            Order::TokenMajor => (p.q_len, p.out_token_stride, p.heads, p.out_head_stride),
        };
        let inner_span = (inner - 1) * inner_stride + p.head_dim;
        assert!(
            inner == 1 || inner_stride >= p.head_dim,
            "attention output rows overlap"
        );
        assert!(
            outer == 1 || outer_stride >= inner_span,
            "attention output rows overlap"
        );
        assert!(
            (outer - 1) * outer_stride + inner_span <= out_len,
            "attention output out of bounds"
        );
    }
}

/// Scaled dot-product attention of `q` against `k`/`v` into `out` (see the module doc).
///
/// `scratch` must hold at least [`attention_scratch_len`] floats; its contents on entry
/// are ignored.
pub fn attention(
    p: &AttentionParams,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    attention_with_cap(p, q, k, v, out, scratch, Some(KV_PACKED_MAX));
}

/// [`attention`] keeping whole heads of packed keys up to `cap` keys on the AMX path;
/// `None` takes the generic path (a GEMM call per product) on every CPU path.
fn attention_with_cap(
    p: &AttentionParams,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    scratch: &mut [f32],
    cap: Option<usize>,
) {
    debug_assert!(p.head_dim > 0, "head_dim must be positive");
    debug_assert!(
        !matches!(p.mask, Mask::BlockCausal { block_len: 0, .. }),
        "block_len must be positive"
    );
    if p.heads == 0 || p.q_len == 0 {
        return;
    }
    let slots = parallel::num_threads();
    let per_slot = slot_len(p, cap);
    assert!(
        scratch.len() >= slots * per_slot,
        "attention scratch too small"
    );
    let plan = Plan::new(p, slots);
    plan.check_output_layout(out.len());

    let total: u128 = (0..plan.items).map(|i| plan.item_weight(i)).sum();
    let plan = &plan;
    parallel::run(|| {
        rayon::scope(|s| {
            let mut out_rest = out;
            let mut out_base = 0;
            let mut scratch_rest = &mut scratch[..slots * per_slot];
            let mut item = 0;
            let mut done: u128 = 0;
            for chunk in 0..slots {
                // Chunk `c` takes items while that brings the running weight nearer to
                // (c + 1)/slots of the total (the last chunk takes the rest): a fixed
                // function of the parameters and the slot count.
                let first = item;
                let n = slots as u128;
                let target = total * (chunk as u128 + 1);
                while item < plan.items && done * n < target {
                    let weight = plan.item_weight(item);
                    let after = (done + weight) * n;
                    if after > target && after - target > target - done * n {
                        break;
                    }
                    done += weight;
                    item += 1;
                }
                let end = plan.item_start(item, out_base + out_rest.len());
                let (mine, rest) = std::mem::take(&mut out_rest).split_at_mut(end - out_base);
                let (slot, scratch_tail) = std::mem::take(&mut scratch_rest).split_at_mut(per_slot);
                let base = out_base;
                out_rest = rest;
                out_base = end;
                scratch_rest = scratch_tail;
                if first < item {
                    s.spawn(move |_| {
                        let input = Input { q, k, v };
                        match (amx_precision(p.compute), cap) {
                            (Some(prec), Some(cap)) => {
                                amx_chunk(p, plan, prec, first..item, input, mine, base, slot, cap)
                            }
                            _ => {
                                for i in first..item {
                                    let (heads, rows) = plan.item(i);
                                    for h in heads {
                                        tile(p, h, rows.clone(), q, k, v, mine, base, slot);
                                    }
                                }
                            }
                        }
                    });
                }
            }
        });
    });
}

/// Attention of query rows `rows` of head `h`, written into `out` (whose element 0 is
/// element `out_base` of the whole output), using one scratch slot.
#[allow(clippy::too_many_arguments)]
fn tile(
    p: &AttentionParams,
    h: usize,
    rows: std::ops::Range<usize>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    out_base: usize,
    slot: &mut [f32],
) {
    let d = p.head_dim;
    let n_rows = rows.len();
    let (s, rest) = slot.split_at_mut(BLOCK_Q * BLOCK_KV);
    let (acc, rest) = rest.split_at_mut(BLOCK_Q * d);
    let (m, rest) = rest.split_at_mut(BLOCK_Q);
    let (l, packing) = rest.split_at_mut(BLOCK_Q);
    let acc = &mut acc[..n_rows * d];
    acc.fill(0.0);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);

    let q_tile = p.q_rows(q, h, rows.start);
    // Visibility is a prefix per row and grows with the row, so the last row bounds the
    // key tiles this query tile needs; later tiles are skipped entirely.
    let kv_end = p.visible_keys(rows.end - 1);
    for c0 in (0..kv_end).step_by(BLOCK_KV) {
        let cols = BLOCK_KV.min(kv_end - c0);
        let k_t = p.k_t(k, h, c0);
        gemm(
            n_rows,
            cols,
            d,
            Operand::F32(q_tile),
            Operand::F32(k_t),
            s,
            0,
            BLOCK_KV,
            false,
            p.scale,
            p.compute,
            Threads::One,
            packing,
        );

        online_softmax(p, &rows, c0, cols, s, acc, m, l);

        let p_tile = MatRef::row_major(s, 0, BLOCK_KV);
        let v_tile = p.v_rows(v, h, c0);
        gemm(
            n_rows,
            d,
            cols,
            Operand::F32(p_tile),
            Operand::F32(v_tile),
            acc,
            0,
            d,
            true,
            1.0,
            p.compute,
            Threads::One,
            packing,
        );
    }

    write_rows(p, h, &rows, acc, l, out, out_base);
}

/// The online softmax step for key tile `c0..c0 + cols` (see the module doc): the scores
/// in `s` (rows `BLOCK_KV` apart) become probabilities against the running maxima `m`,
/// and the accumulator rows and sums `l` are rescaled where a maximum grew.
#[allow(clippy::too_many_arguments)]
fn online_softmax(
    p: &AttentionParams,
    rows: &std::ops::Range<usize>,
    c0: usize,
    cols: usize,
    s: &mut [f32],
    acc: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) {
    let d = p.head_dim;
    for i in 0..rows.len() {
        let visible = p.visible_keys(rows.start + i).saturating_sub(c0).min(cols);
        let s_row = &mut s[i * BLOCK_KV..i * BLOCK_KV + cols];
        if visible == 0 {
            // Masked out: contributes nothing, and must not touch m/l (−∞ − −∞).
            s_row.fill(0.0);
            continue;
        }
        let m_old = m[i];
        let (m_new, sum) = exp_with_max(&mut s_row[..visible], m_old);
        s_row[visible..].fill(0.0);
        if m_new > m_old && m_old != f32::NEG_INFINITY {
            // The running max grew: earlier terms were exponentiated against a
            // smaller shift and must shrink by exp(m_old − m_new) ≤ 1.
            let correction = (m_old - m_new).exp();
            scale_in_place(&mut acc[i * d..(i + 1) * d], correction);
            l[i] *= correction;
        }
        l[i] += sum;
        m[i] = m_new;
    }
}

/// `out` rows of head `h` for query rows `rows`: `acc / l` (zeros where no key was seen).
fn write_rows(
    p: &AttentionParams,
    h: usize,
    rows: &std::ops::Range<usize>,
    acc: &[f32],
    l: &[f32],
    out: &mut [f32],
    out_base: usize,
) {
    let d = p.head_dim;
    for i in 0..rows.len() {
        let at = h * p.out_head_stride + (rows.start + i) * p.out_token_stride - out_base;
        let dst = &mut out[at..at + d];
        if l[i] > 0.0 {
            for (o, &a) in dst.iter_mut().zip(&acc[i * d..(i + 1) * d]) {
                *o = a / l[i];
            }
        } else {
            dst.fill(0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::test_rng::TestRng as Rng;

    /// Where the heads and tokens of a `[*, *, head_dim]` buffer sit.
    #[derive(Debug, Clone, Copy)]
    enum Layout {
        /// `[tokens, heads, head_dim]`, the transformer's layout.
        TokensHeads,
        /// `[heads, tokens, head_dim]`.
        HeadsTokens,
    }

    /// (head stride, token stride) of a layout, with `pad` unused floats after each row
    /// group so that gaps in the output can be checked.
    fn strides(layout: Layout, heads: usize, tokens: usize, d: usize, pad: usize) -> [usize; 2] {
        match layout {
            Layout::TokensHeads => [d, heads * d + pad],
            Layout::HeadsTokens => [tokens * d + pad, d],
        }
    }

    /// Parameters for `[heads, q_len, kv_len, head_dim]` with the layouts of q, k/v, out.
    fn params(shape: [usize; 4], scale: f32, mask: Mask, layouts: [Layout; 3]) -> AttentionParams {
        let [heads, q_len, kv_len, d] = shape;
        // Padding after every output row group checks that gaps are left untouched.
        let out_pad = 3;
        let [qh, qt] = strides(layouts[0], heads, q_len, d, 0);
        let [kh, kt] = strides(layouts[1], heads, kv_len, d, 0);
        let [oh, ot] = strides(layouts[2], heads, q_len, d, out_pad);
        AttentionParams {
            heads,
            q_len,
            kv_len,
            head_dim: d,
            scale,
            mask,
            q_head_stride: qh,
            q_token_stride: qt,
            k_head_stride: kh,
            k_token_stride: kt,
            v_head_stride: kh,
            v_token_stride: kt,
            out_head_stride: oh,
            out_token_stride: ot,
            compute: Compute::F32,
        }
    }

    fn out_len(p: &AttentionParams) -> usize {
        (p.heads - 1) * p.out_head_stride + (p.q_len - 1) * p.out_token_stride + p.head_dim
    }

    /// Straightforward f64 attention with the full score matrix; `[heads, q_len, d]`.
    fn reference(p: &AttentionParams, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
        let d = p.head_dim;
        let mut out = vec![0.0; p.heads * p.q_len * d];
        for h in 0..p.heads {
            for i in 0..p.q_len {
                let qi = h * p.q_head_stride + i * p.q_token_stride;
                let visible = |j: usize| match p.mask {
                    Mask::None => true,
                    Mask::BlockCausal { block_len, q_start } => {
                        j / block_len <= (q_start + i) / block_len
                    }
                };
                let scores: Vec<f64> = (0..p.kv_len)
                    .map(|j| {
                        if !visible(j) {
                            return f64::NEG_INFINITY;
                        }
                        let kj = h * p.k_head_stride + j * p.k_token_stride;
                        let dot: f64 = (0..d).map(|e| q[qi + e] as f64 * k[kj + e] as f64).sum();
                        p.scale as f64 * dot
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    continue;
                }
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for (j, w) in weights.iter().enumerate() {
                    let vj = h * p.v_head_stride + j * p.v_token_stride;
                    for e in 0..d {
                        out[(h * p.q_len + i) * d + e] += w / sum * v[vj + e] as f64;
                    }
                }
            }
        }
        out
    }

    /// Runs the kernel on random inputs and checks it against the reference, including
    /// that the padding between output rows is left untouched.
    fn check(p: &AttentionParams, seed: u64) {
        let mut rng = Rng(seed);
        let q_span =
            (p.heads - 1) * p.q_head_stride + (p.q_len - 1) * p.q_token_stride + p.head_dim;
        let kv_span = (p.heads - 1) * p.k_head_stride
            + p.kv_len.saturating_sub(1) * p.k_token_stride
            + p.head_dim;
        let q = rng.vec(q_span);
        let k = rng.vec(kv_span);
        let v = rng.vec(kv_span);
        let mut out = vec![f32::NAN; out_len(p)];
        let mut scratch = vec![f32::NAN; attention_scratch_len(p)];
        attention(p, &q, &k, &v, &mut out, &mut scratch);

        let want = reference(p, &q, &k, &v);
        let max_ref = want.iter().fold(0.0f64, |a, b| a.max(b.abs()));
        let tolerance = 2e-5 * (1.0 + max_ref);
        let d = p.head_dim;
        let mut written = vec![false; out.len()];
        for h in 0..p.heads {
            for i in 0..p.q_len {
                let at = h * p.out_head_stride + i * p.out_token_stride;
                for e in 0..d {
                    let got = out[at + e] as f64;
                    let w = want[(h * p.q_len + i) * d + e];
                    assert!(
                        (got - w).abs() <= tolerance,
                        "{p:?}: head {h} row {i} elem {e}: got {got}, want {w}"
                    );
                    written[at + e] = true;
                }
            }
        }
        for (x, w) in out.iter().zip(&written) {
            assert!(*w || x.is_nan(), "a padding element was overwritten");
        }
    }

    use Layout::{HeadsTokens as H, TokensHeads as T};
    const SAME: [Layout; 3] = [T, T, T];
    const HEADS_FIRST: [Layout; 3] = [H, H, H];
    const MIXED: [Layout; 3] = [T, H, H];
    const MIXED_OUT: [Layout; 3] = [H, H, T];

    #[test]
    fn matches_reference_for_unaligned_lengths_head_dims_and_both_layouts() {
        let mut seed = 1;
        for d in [8, 64, 128] {
            for layouts in [SAME, HEADS_FIRST, MIXED, MIXED_OUT] {
                for [heads, q_len, kv_len] in [[3, 300, 601], [2, 517, 70], [1, 263, 513]] {
                    let scale = 1.0 / (d as f32).sqrt();
                    check(
                        &params([heads, q_len, kv_len, d], scale, Mask::None, layouts),
                        seed,
                    );
                    seed += 1;
                }
            }
        }
    }

    #[test]
    fn single_queries_and_single_keys_match_reference() {
        for layouts in [SAME, HEADS_FIRST] {
            for shape in [[4, 1, 300, 64], [4, 5, 1, 64], [1, 1, 1, 64]] {
                check(&params(shape, 0.125, Mask::None, layouts), 7);
            }
        }
    }

    #[test]
    fn block_causal_masks_match_reference() {
        // (q_len, kv_len, block_len, q_start):
        // - a square causal mask whose first query tiles skip whole key tiles;
        // - query rows straddling a block edge, so rows of one tile see different keys
        //   and some rows see none of a key tile the tile still computes;
        // - a query chunk after the cache, whose early rows see only earlier blocks;
        // - queries whose every key lies in earlier blocks (q_start past kv_len);
        // - token-level causality (block_len 1).
        let cases = [
            (700, 700, 100, 0),
            (600, 600, 300, 0),
            (300, 1200, 450, 900),
            (200, 300, 100, 300),
            (150, 1000, 256, 5000),
            (260, 300, 1, 40),
        ];
        let mut seed = 100;
        for (q_len, kv_len, block_len, q_start) in cases {
            for layouts in [SAME, HEADS_FIRST] {
                for d in [8, 64] {
                    let mask = Mask::BlockCausal { block_len, q_start };
                    let scale = 1.0 / (d as f32).sqrt();
                    check(&params([2, q_len, kv_len, d], scale, mask, layouts), seed);
                    seed += 1;
                }
            }
        }
    }

    #[test]
    fn stays_accurate_when_scores_reach_magnitude_fifty() {
        // Unit-range q and k with scale 25 over 8 dims give scores up to about ±50, so
        // the softmax weights span ~40 orders of magnitude.
        let mask = Mask::BlockCausal {
            block_len: 128,
            q_start: 64,
        };
        for layouts in [SAME, HEADS_FIRST] {
            check(&params([2, 200, 700, 8], 25.0, Mask::None, layouts), 11);
            check(&params([2, 200, 700, 8], 25.0, mask, layouts), 12);
        }
    }

    #[test]
    fn no_keys_give_zero_output() {
        let p = params([3, 10, 0, 16], 0.25, Mask::None, SAME);
        let mut out = vec![f32::NAN; out_len(&p)];
        let mut scratch = vec![0.0; attention_scratch_len(&p)];
        attention(&p, &[0.5; 3 * 10 * 16], &[], &[], &mut out, &mut scratch);
        for h in 0..3 {
            for i in 0..10 {
                let at = h * p.out_head_stride + i * p.out_token_stride;
                assert!(out[at..at + 16].iter().all(|&x| x == 0.0));
            }
        }
    }

    #[test]
    fn scratch_len_is_bounded_whatever_the_sequence_lengths() {
        for compute in [Compute::F32, Compute::Bf16, Compute::NearF32] {
            let with = |q_len, kv_len| AttentionParams {
                compute,
                ..params([12, q_len, kv_len, 128], 0.1, Mask::None, SAME)
            };
            let (short, long) = (with(100, 1_000), with(50_000, 100_000));
            let at_cap = with(100, KV_PACKED_MAX);
            assert_eq!(
                attention_scratch_len(&with(50_000, 1_000)),
                attention_scratch_len(&short)
            );
            assert!(attention_scratch_len(&long) <= attention_scratch_len(&at_cap));
            if amx_precision(compute).is_none() {
                assert_eq!(attention_scratch_len(&short), attention_scratch_len(&long));
                assert_eq!(
                    attention_scratch_len(&short),
                    parallel::num_threads()
                        * (BLOCK_Q * BLOCK_KV
                            + BLOCK_Q * 128
                            + 2 * BLOCK_Q
                            + gemm_len(128, compute))
                );
            }
        }
    }

    #[test]
    fn amx_path_matches_the_generic_path_with_and_without_kept_keys() {
        let mask = Mask::BlockCausal {
            block_len: 96,
            q_start: 32,
        };
        for compute in [Compute::Bf16, Compute::NearF32] {
            if amx_precision(compute).is_none() {
                eprintln!("skipped: the selected CPU path does not run {compute:?} on AMX");
                return;
            }
            for (layouts, mask) in [(SAME, Mask::None), (HEADS_FIRST, mask), (SAME, mask)] {
                let p = AttentionParams {
                    compute,
                    ..params([3, 333, 777, 40], 0.125, mask, layouts)
                };
                let mut rng = Rng(7);
                let q = rng.vec(3 * 333 * 40 + 64);
                let k = rng.vec(3 * 777 * 40 + 64);
                let v = rng.vec(3 * 777 * 40 + 64);
                let run = |cap: Option<usize>| {
                    let mut out = vec![0.0; out_len(&p)];
                    let slots = parallel::num_threads();
                    let mut scratch =
                        vec![
                            f32::NAN;
                            slots * slot_len(&p, cap).max(slot_len(&p, Some(KV_PACKED_MAX)))
                        ];
                    attention_with_cap(&p, &q, &k, &v, &mut out, &mut scratch, cap);
                    out
                };
                let generic = run(None);
                let (kept, per_tile) = (run(Some(KV_PACKED_MAX)), run(Some(0)));
                assert_eq!(
                    kept, per_tile,
                    "{compute:?} kept keys vs keys packed per tile"
                );
                if compute == Compute::NearF32 {
                    assert_eq!(kept, generic, "{compute:?} kept keys");
                } else {
                    // bf16 products: the fused softmax's exponential is ~1 ulp like the
                    // shared one but not bit-equal; after bf16 rounding they stay close.
                    let scale = generic.iter().fold(0.0f32, |a, b| a.max(b.abs()));
                    let err = kept
                        .iter()
                        .zip(&generic)
                        .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
                    assert!(err <= 1e-2 * scale, "{compute:?}: {err} against {scale}");
                }
            }
        }
    }

    #[test]
    fn repeated_calls_give_identical_bytes_whatever_the_scratch_held() {
        let mask = Mask::BlockCausal {
            block_len: 96,
            q_start: 32,
        };
        for layouts in [SAME, HEADS_FIRST] {
            let p = params([3, 333, 777, 64], 0.125, mask, layouts);
            let mut rng = Rng(99);
            let q = rng.vec(3 * 333 * 64);
            let k = rng.vec(3 * 777 * 64);
            let v = rng.vec(3 * 777 * 64);
            let mut first = vec![0.0; out_len(&p)];
            let mut second = vec![1.0; out_len(&p)];
            let mut scratch = vec![0.0; attention_scratch_len(&p)];
            attention(&p, &q, &k, &v, &mut first, &mut scratch);
            scratch.fill(f32::NAN);
            attention(&p, &q, &k, &v, &mut second, &mut scratch);
            // Padding differs (0 vs 1) by construction; compare the written rows.
            for h in 0..3 {
                for i in 0..333 {
                    let at = h * p.out_head_stride + i * p.out_token_stride;
                    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&first[at..at + 64]), bits(&second[at..at + 64]));
                }
            }
        }
    }
}
