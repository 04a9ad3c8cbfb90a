//! Flash-style tiled scaled dot-product attention: `out = softmax(scale·Q·Kᵀ + mask)·V`
//! per head, without ever materialising the `[q_len, kv_len]` score matrix.
//!
//! Algorithm. The work is cut into query tiles of [`BLOCK_Q`] rows of one head. A tile
//! walks the keys in tiles of [`BLOCK_KV`]: `S = scale·Q_tile·K_tileᵀ` (one GEMM), masked
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
//! Determinism. The work items are split into exactly `slots` contiguous chunks (each
//! with its own scratch slot), weighted by how many keys they see so that causal
//! masks stay balanced; every output row is computed by one task in a fixed order of
//! operations, and a tile's arithmetic does not depend on which chunk holds it.

use crate::kernels::gemm::{sgemm, MatRef, Threads};
use crate::kernels::softmax::{exp_shifted_sum, row_max, scale_in_place};
use crate::parallel;

/// Query rows per tile: large enough that each key/value tile packed by the GEMM is
/// reused over many rows.
pub const BLOCK_Q: usize = 64;
/// Keys per tile: large enough to amortise GEMM call overhead, small enough that the
/// score tile stays in L2.
pub const BLOCK_KV: usize = 256;

/// Which keys a query may see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mask {
    /// Every query sees every key.
    None,
    /// Query `i` at absolute position `q_start + i` sees key `j` iff `j / block_len <= (q_start + i) / block_len`.
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
}

impl AttentionParams {
    /// Number of keys (a prefix `0..n`) that query row `row` sees.
    fn visible_keys(&self, row: usize) -> usize {
        match self.mask {
            Mask::None => self.kv_len,
            Mask::BlockCausal {
                block_len,
                q_start,
            } => {
                let block_end = ((q_start + row) / block_len + 1).saturating_mul(block_len);
                block_end.min(self.kv_len)
            }
        }
    }
}

/// Floats of scratch one thread slot uses.
fn slot_len(head_dim: usize) -> usize {
    BLOCK_Q * BLOCK_KV + BLOCK_Q * head_dim + 2 * BLOCK_Q
}

/// Floats of scratch [`attention`] needs: a fixed tile set per kernel thread,
/// independent of `q_len` and `kv_len`.
pub fn attention_scratch_len(p: &AttentionParams) -> usize {
    parallel::num_threads() * slot_len(p.head_dim)
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
    q_tiles: usize,
    items: usize,
}

impl Plan<'_> {
    fn new(p: &AttentionParams) -> Plan<'_> {
        let order = if p.heads > 1 && (p.q_len == 1 || p.out_head_stride >= p.out_token_stride)
        {
            Order::HeadMajor
        } else {
            Order::TokenMajor
        };
        let q_tiles = p.q_len.div_ceil(BLOCK_Q);
        let items = match order {
            Order::HeadMajor => p.heads * q_tiles,
            Order::TokenMajor => q_tiles,
        };
        Plan {
            p,
            order,
            q_tiles,
            items,
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
        let r0 = tile * BLOCK_Q;
        (heads, r0..(r0 + BLOCK_Q).min(self.p.q_len))
    }

    /// Offset in `out` of the first element item `item` writes (`out_len` past the end).
    fn item_start(&self, item: usize, out_len: usize) -> usize {
        if item == self.items {
            return out_len;
        }
        let (heads, rows) = self.item(item);
        heads.start * self.p.out_head_stride + rows.start * self.p.out_token_stride
    }

    /// Estimated cost of an item: the keys its rows scan plus a per-row output cost.
    fn item_weight(&self, item: usize) -> u128 {
        let (heads, rows) = self.item(item);
        let keys = self.p.visible_keys(rows.end - 1) + self.p.head_dim;
        (heads.len() * rows.len()) as u128 * keys as u128
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
    debug_assert!(p.head_dim > 0, "head_dim must be positive");
    debug_assert!(
        !matches!(p.mask, Mask::BlockCausal { block_len: 0, .. }),
        "block_len must be positive"
    );
    if p.heads == 0 || p.q_len == 0 {
        return;
    }
    let slots = parallel::num_threads();
    let per_slot = slot_len(p.head_dim);
    assert!(
        scratch.len() >= slots * per_slot,
        "attention scratch too small"
    );
    let plan = Plan::new(p);
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
                // The chunk ends at the first item whose preceding weight reaches
                // (chunk + 1)/slots of the total: a fixed function of the parameters.
                let first = item;
                let target = total * (chunk as u128 + 1);
                while item < plan.items && done * (slots as u128) < target {
                    done += plan.item_weight(item);
                    item += 1;
                }
                let end = plan.item_start(item, out_base + out_rest.len());
                let (mine, rest) = std::mem::take(&mut out_rest).split_at_mut(end - out_base);
                let (slot, scratch_tail) =
                    std::mem::take(&mut scratch_rest).split_at_mut(per_slot);
                let base = out_base;
                out_rest = rest;
                out_base = end;
                scratch_rest = scratch_tail;
                if first < item {
                    s.spawn(move |_| {
                        for i in first..item {
                            let (heads, rows) = plan.item(i);
                            for h in heads {
                                tile(p, h, rows.clone(), q, k, v, mine, base, slot);
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
    let (m, l) = rest.split_at_mut(BLOCK_Q);
    let acc = &mut acc[..n_rows * d];
    acc.fill(0.0);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);

    let q_tile = MatRef {
        data: q,
        offset: h * p.q_head_stride + rows.start * p.q_token_stride,
        row_stride: p.q_token_stride as isize,
        col_stride: 1,
    };
    // Visibility is a prefix per row and grows with the row, so the last row bounds the
    // key tiles this query tile needs; later tiles are skipped entirely.
    let kv_end = p.visible_keys(rows.end - 1);
    for c0 in (0..kv_end).step_by(BLOCK_KV) {
        let cols = BLOCK_KV.min(kv_end - c0);
        // K tile transposed: element (dim, key) of Kᵀ.
        let k_t = MatRef {
            data: k,
            offset: h * p.k_head_stride + c0 * p.k_token_stride,
            row_stride: 1,
            col_stride: p.k_token_stride as isize,
        };
        sgemm(n_rows, cols, d, q_tile, k_t, s, 0, BLOCK_KV, false, p.scale, Threads::One);

        for i in 0..n_rows {
            let visible = p.visible_keys(rows.start + i).saturating_sub(c0).min(cols);
            let s_row = &mut s[i * BLOCK_KV..i * BLOCK_KV + cols];
            if visible == 0 {
                // Masked out: contributes nothing, and must not touch m/l (−∞ − −∞).
                s_row.fill(0.0);
                continue;
            }
            let m_old = m[i];
            let tile_max = row_max(&s_row[..visible]);
            let m_new = if tile_max > m_old { tile_max } else { m_old };
            let sum = exp_shifted_sum(&mut s_row[..visible], m_new);
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

        let p_tile = MatRef::row_major(s, 0, BLOCK_KV);
        let v_tile = MatRef {
            data: v,
            offset: h * p.v_head_stride + c0 * p.v_token_stride,
            row_stride: p.v_token_stride as isize,
            col_stride: 1,
        };
        sgemm(n_rows, d, cols, p_tile, v_tile, acc, 0, d, true, 1.0, Threads::One);
    }

    for i in 0..n_rows {
        let at = h * p.out_head_stride + (rows.start + i) * p.out_token_stride - out_base;
        let dst = &mut out[at..at + d];
        if l[i] > 0.0 {
            let inv = 1.0 / l[i];
            for (o, &a) in dst.iter_mut().zip(&acc[i * d..(i + 1) * d]) {
                *o = a * inv;
            }
        } else {
            dst.fill(0.0);
        }
    }
}
