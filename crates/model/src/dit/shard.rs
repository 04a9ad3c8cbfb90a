//! Sharded execution of the transformer on a TP × SP mesh of ranks.
//!
//! Tensor parallelism (TP) splits every attention layer's heads and the FFN's hidden
//! units across the ranks of a TP group: q/k/v and the FFN's first layer are split by
//! output rows, the output projections by input columns and summed by an all-reduce
//! (their bias added once, after it); the q/k RMS norms, which span all heads, sum their
//! squares across the group. Ulysses sequence parallelism (SP) splits a block's tokens
//! across the ranks of an SP group and, around self-attention only, exchanges them for
//! heads (all-to-all), so each rank attends the whole sequence with `heads / (tp·sp)`
//! heads — which is also the share of the KV cache it keeps. Cross-attention needs no
//! exchange: every rank attends its own tokens over the whole text with its TP heads.
//! The velocity tokens are gathered across the SP group at the end, so every rank
//! leaves a forward with the whole result (and decodes it, replicated).

use std::sync::Arc;

use headroom_tensor::comm::{CommMeter, Communicator, InProcessGroup, Metered};
use headroom_tensor::Tensor;

use super::embed::Linear;
use crate::error::Result;

/// One rank's place on the mesh: its TP group and its SP group.
#[derive(Debug, Clone)]
pub struct Sharding {
    /// The ranks sharing this rank's tokens, splitting heads and FFN units.
    pub tp: Arc<dyn Communicator>,
    /// The ranks sharing this rank's TP shard, splitting the tokens.
    pub sp: Arc<dyn Communicator>,
    /// What this rank's TP and SP collectives moved and how long they took.
    pub meter: Arc<CommMeter>,
}

impl Sharding {
    /// An in-process mesh of `tp × sp` ranks, indexed by world rank
    /// `sp_rank · tp + tp_rank` (a TP group is `tp` consecutive ranks, as NCCL
    /// deployments place TP within a node).
    pub fn in_process_mesh(tp: usize, sp: usize) -> Vec<Sharding> {
        let (tp, sp) = (tp.max(1), sp.max(1));
        let tp_groups: Vec<_> = (0..sp).map(|_| InProcessGroup::ranks(tp)).collect();
        let sp_groups: Vec<_> = (0..tp).map(|_| InProcessGroup::ranks(sp)).collect();
        (0..tp * sp)
            .map(|w| {
                let (s, t) = (w / tp, w % tp);
                Sharding::metered(Arc::clone(&tp_groups[s][t]), Arc::clone(&sp_groups[t][s]))
            })
            .collect()
    }

    /// A rank's place from its TP and SP groups, each counted in a new meter.
    pub fn metered(tp: Arc<dyn Communicator>, sp: Arc<dyn Communicator>) -> Sharding {
        let meter = Arc::new(CommMeter::default());
        Sharding {
            tp: Metered::wrap(tp, Arc::clone(&meter)),
            sp: Metered::wrap(sp, Arc::clone(&meter)),
            meter,
        }
    }

    /// This rank's index on the mesh.
    pub fn world_rank(&self) -> usize {
        self.sp.rank() * self.tp.size() + self.tp.rank()
    }
}

/// (index, parts) of this rank's TP shard; (0, 1) unsharded.
pub(crate) fn tp_part(shard: Option<&Sharding>) -> (usize, usize) {
    shard.map_or((0, 1), |s| (s.tp.rank(), s.tp.size()))
}

/// (index, parts) of this rank's SP shard; (0, 1) unsharded.
pub(crate) fn sp_part(shard: Option<&Sharding>) -> (usize, usize) {
    shard.map_or((0, 1), |s| (s.sp.rank(), s.sp.size()))
}

/// The sum of `x` over the TP group (itself unsharded).
pub(crate) fn tp_sum(shard: Option<&Sharding>, x: Tensor) -> Result<Tensor> {
    match shard {
        Some(s) if s.tp.size() > 1 => Ok(s.tp.all_reduce_sum(&x)?),
        _ => Ok(x),
    }
}

/// `x · Wᵀ + b` for a `linear` whose inputs are split across the TP group
/// (`Split::Cols`): the partial products are summed across the group and the bias is
/// added once, after the sum.
pub(crate) fn col_split_forward(
    shard: Option<&Sharding>,
    linear: &Linear,
    x: &Tensor,
) -> Result<Tensor> {
    if tp_part(shard).1 > 1 {
        let partial = linear.forward_no_bias(x)?;
        Ok(tp_sum(shard, partial)?.add(&linear.bias)?)
    } else {
        linear.forward(x)
    }
}

/// RMS norm over the full feature axis of `x [B, L, d/tp]`, whose other features live on
/// the other TP ranks: the sums of squares are added across the group.
pub(crate) fn rms_norm(
    shard: Option<&Sharding>,
    x: &Tensor,
    weight: &Tensor,
    full_dim: usize,
    eps: f32,
) -> Result<Tensor> {
    match shard {
        Some(s) if s.tp.size() > 1 => {
            let axis = x.rank() - 1;
            let squares = x.mul(x)?.sum(axis, true)?;
            let total = s.tp.all_reduce_sum(&squares)?;
            let inv = total
                .mul_scalar(1.0 / full_dim as f32)?
                .add_scalar(eps)?
                .rsqrt()?;
            Ok(x.mul(&inv)?.mul(weight)?)
        }
        _ => Ok(x.rms_norm(Some(weight), eps)?),
    }
}

/// Ulysses' exchange before attention: `[1, L/sp, H, D]` → `[1, L, H/sp, D]`.
pub(crate) fn seq_to_heads(shard: Option<&Sharding>, x: Tensor) -> Result<Tensor> {
    match shard {
        Some(s) if s.sp.size() > 1 => Ok(s.sp.all_to_all(&x, 2, 1)?),
        _ => Ok(x),
    }
}

/// Ulysses' exchange after attention: `[1, L, H/sp, D]` → `[1, L/sp, H, D]`.
pub(crate) fn heads_to_seq(shard: Option<&Sharding>, x: Tensor) -> Result<Tensor> {
    match shard {
        Some(s) if s.sp.size() > 1 => Ok(s.sp.all_to_all(&x, 1, 2)?),
        _ => Ok(x),
    }
}

/// Every SP rank's tokens `[1, L/sp, F]` gathered into `[1, L, F]`.
pub(crate) fn gather_tokens(shard: Option<&Sharding>, x: Tensor) -> Result<Tensor> {
    match shard {
        Some(s) if s.sp.size() > 1 => Ok(s.sp.all_gather(&x, 1)?),
        _ => Ok(x),
    }
}
