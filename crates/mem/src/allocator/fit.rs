//! The `fit` reclaim policy's allocation-time half: before the allocator grows its
//! reserved memory, it gives back just enough cached memory that reserved bytes stay
//! within `1 + slack` of the allocated peak (the peak so far, or this request's
//! allocated total when that is higher).
//!
//! Unlike a flush at a phase boundary, nothing is released while the cache can serve
//! requests, and only the bytes over the bound are released when it cannot: whole free
//! segments under `pytorch` (largest first, so few device calls), free pages under
//! `expandable`. What cannot be released (free space inside partly used segments) stays,
//! so the bound is a target, not a guarantee. Every such release is counted and timed
//! as a reclaim.

use std::time::Instant;

use super::block::{segment_size_for, FreeKey, PoolKind};
use super::state::State;
use super::AllocatorPolicy;

impl State {
    /// Releases cached memory before a growth of the reserved bytes for a request of
    /// `size` (rounded) bytes would take them past the `fit` bound.
    pub(crate) fn fit_before_growth(&mut self, size: u64) {
        let Some(slack) = self.fit_slack else { return };
        let growth = match self.config.policy {
            AllocatorPolicy::Pytorch => segment_size_for(size),
            AllocatorPolicy::Expandable | AllocatorPolicy::Planned => size,
        };
        let allocated = self.stats.allocated_bytes.all();
        let peak = (allocated.peak as u64).max(allocated.current as u64 + size);
        let bound = (peak as f64 * (1.0 + slack)) as u64;
        let reserved = self.stats.reserved_bytes.all().current as u64;
        let excess = (reserved + growth).saturating_sub(bound);
        if excess == 0 {
            return;
        }
        let start = Instant::now();
        let released = self.release_largest_cached(excess);
        if released > 0 {
            self.count_reclaim(start.elapsed(), released);
        }
    }

    /// Gives back releasable cached blocks, largest first, until at least `goal` bytes
    /// are released or none is left; returns the bytes released.
    fn release_largest_cached(&mut self, goal: u64) -> u64 {
        let mut candidates: Vec<(PoolKind, FreeKey)> = [PoolKind::Large, PoolKind::Small]
            .into_iter()
            .flat_map(|pool| {
                self.pools[pool as usize]
                    .free
                    .iter()
                    .map(move |k| (pool, *k))
            })
            .collect();
        // Largest first; address and id break ties so the order is deterministic.
        candidates.sort_unstable_by_key(|c| std::cmp::Reverse((c.1 .1, c.1 .2, c.1 .3)));
        let before = self.stats.reserved_bytes.all().current as u64;
        for (pool, key) in candidates {
            let released = before.saturating_sub(self.stats.reserved_bytes.all().current as u64);
            if released >= goal {
                break;
            }
            // An earlier unmap may have merged this block into another.
            if !self.pools[pool as usize].free.contains(&key) {
                continue;
            }
            self.release_cached_block(key.3);
        }
        before.saturating_sub(self.stats.reserved_bytes.all().current as u64)
    }
}
