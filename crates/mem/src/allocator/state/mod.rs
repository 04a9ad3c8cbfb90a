//! The allocator's state behind its lock and the policy-independent rules: rounding,
//! pools, best fit by (stream, size, address), splitting, merging with neighbours inside
//! a segment, the slow path, and the statistics each step changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::block::{round_size, Block, BlockId, Pool, PoolKind, Slab, MIN_BLOCK_SIZE, SMALL_SIZE};
use super::planned::Planned;

mod spans;
use super::{AllocatorConfig, AllocatorPolicy};
use crate::device::DeviceMemory;
use crate::error::{MemError, Result};
use crate::history::{History, TraceAction};
use crate::stats::MemoryStats;

/// What the allocator knows of one segment (a device allocation or an expandable range).
#[derive(Debug, Clone)]
pub(crate) struct SegmentInfo {
    /// Bytes of the segment (for expandable segments: of its reserved address range).
    pub size: u64,
    pub stream: u32,
    pub pool: PoolKind,
    pub expandable: bool,
    /// The block at the segment's base address.
    pub head: BlockId,
}

/// Everything the allocator's mutex guards.
#[derive(Debug)]
pub(crate) struct State {
    pub config: AllocatorConfig,
    pub device: Arc<dyn DeviceMemory>,
    pub blocks: Slab,
    pub pools: [Pool; 2],
    pub segments: BTreeMap<u64, SegmentInfo>,
    pub stats: MemoryStats,
    pub history: History,
    /// The `fit` policy's slack over the allocated peak, when it is on.
    pub fit_slack: Option<f64>,
    /// Phase boundaries crossed so far, and the last one's name.
    pub phase_mark: (u64, Option<String>),
    /// The planned policy's plans, span and arenas.
    pub planned: Planned,
    /// Streams other than its own that a live block was used on (`record_stream`).
    pub stream_uses: HashMap<BlockId, Vec<u32>>,
    /// Freed blocks waiting for the events recorded on those streams: reused only once
    /// every event has completed.
    pub pending_frees: Vec<(BlockId, Vec<u64>)>,
}

impl State {
    pub(crate) fn new(config: AllocatorConfig, device: Arc<dyn DeviceMemory>) -> Self {
        let stats = MemoryStats {
            max_split_size: config.max_split_size.map_or(-1, |v| v as i64),
            ..MemoryStats::default()
        };
        Self {
            history: History::new(config.history),
            config,
            device,
            blocks: Slab::default(),
            pools: [Pool::default(), Pool::default()],
            segments: BTreeMap::new(),
            stats,
            fit_slack: None,
            phase_mark: (0, None),
            planned: Planned::default(),
            stream_uses: HashMap::new(),
            pending_frees: Vec::new(),
        }
    }

    pub(crate) fn max_split_size(&self) -> u64 {
        self.config.max_split_size.unwrap_or(u64::MAX)
    }

    fn expandable(&self) -> bool {
        self.config.policy == AllocatorPolicy::Expandable
    }

    pub(crate) fn pool(&mut self, kind: PoolKind) -> &mut Pool {
        &mut self.pools[kind as usize]
    }

    pub(crate) fn insert_free(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let key = (b.stream, b.size, b.addr, id);
        let pool = b.pool;
        self.pool(pool).free.insert(key);
    }

    pub(crate) fn remove_free(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let key = (b.stream, b.size, b.addr, id);
        let pool = b.pool;
        self.pool(pool).free.remove(&key);
    }

    pub(crate) fn insert_unmapped(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let key = (b.stream, b.addr, id);
        let pool = b.pool;
        self.pool(pool).unmapped.insert(key);
    }

    pub(crate) fn remove_unmapped(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let key = (b.stream, b.addr, id);
        let pool = b.pool;
        self.pool(pool).unmapped.remove(&key);
    }

    /// Records `id` as its segment's head when nothing precedes it.
    pub(crate) fn refresh_head(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        if b.prev.is_none() {
            let base = b.addr;
            if let Some(segment) = self.segments.get_mut(&base) {
                segment.head = id;
            }
        }
    }

    /// Inserts a new block between `prev` and `next`, fixing their links.
    pub(crate) fn splice(
        &mut self,
        mut block: Block,
        prev: Option<BlockId>,
        next: Option<BlockId>,
    ) -> BlockId {
        block.prev = prev;
        block.next = next;
        let id = self.blocks.insert(block);
        if let Some(p) = prev {
            self.blocks.get_mut(p).next = Some(id);
        }
        if let Some(n) = next {
            self.blocks.get_mut(n).prev = Some(id);
        }
        self.refresh_head(id);
        id
    }

    /// Allocates `requested` bytes on `stream`: best fit from the cache, else new device
    /// memory, else release cached blocks and retry, else out of memory.
    pub(crate) fn malloc(&mut self, requested: u64, stream: u32) -> Result<BlockId> {
        self.process_events();
        let size = round_size(requested);
        let pool = PoolKind::for_size(size);
        let found = match self.get_free_block(pool, stream, size) {
            Some(id) => Some(id),
            None => {
                self.fit_before_growth(size);
                self.alloc_block(pool, stream, size, false)
                    .or_else(|| {
                        self.release_available_cached_blocks(pool, stream, size)
                            .then(|| self.alloc_block(pool, stream, size, false))
                            .flatten()
                    })
                    .or_else(|| {
                        self.release_cached_blocks();
                        self.alloc_block(pool, stream, size, true)
                    })
            }
        };
        match found {
            Some(id) => Ok(self.alloc_found_block(id, size, requested)),
            None => Err(self.out_of_memory(requested, stream)),
        }
    }

    /// An out-of-memory error injected by a test, counted like a real one.
    pub(crate) fn injected_oom(&mut self, requested: u64, stream: u32) -> MemError {
        self.out_of_memory(requested, stream)
    }

    fn out_of_memory(&mut self, requested: u64, stream: u32) -> MemError {
        self.stats.num_ooms += 1;
        let capacity = self.device.capacity();
        let free = capacity.saturating_sub(self.device.used());
        self.history
            .push(TraceAction::Oom, 0, requested, stream, None, Some(free));
        MemError::OutOfMemory {
            requested,
            free,
            reserved: self.stats.reserved_bytes.all().current as u64,
            allocated: self.stats.allocated_bytes.all().current as u64,
            capacity,
            platform: self.device.name(),
        }
    }

    /// Best fit: the smallest cached block of the pool and stream that holds `size`,
    /// lowest address on ties, subject to the `max_split_size` rules.
    fn get_free_block(&mut self, pool: PoolKind, stream: u32, size: u64) -> Option<BlockId> {
        let max_split = self.max_split_size();
        let expandable = self.expandable();
        let id = {
            let free = &self.pools[pool as usize].free;
            let mut iter = free.range((stream, size, 0, 0)..);
            let mut best = *iter.next()?;
            if best.0 != stream {
                return None;
            }
            if expandable {
                // A free block that ends at unmapped space can grow: count that space
                // as part of its size, so a block that cannot grow is preferred.
                let grow = |id: BlockId| {
                    let b = self.blocks.get(id);
                    b.size
                        + b.next
                            .map(|n| self.blocks.get(n))
                            .filter(|n| !n.mapped)
                            .map_or(0, |n| n.size)
                };
                for next in iter {
                    if next.0 != stream || grow(next.3) >= grow(best.3) {
                        break;
                    }
                    best = *next;
                }
            }
            let block_size = best.1;
            // Do not hand an oversize block to a request below max_split_size.
            if size < max_split && block_size >= max_split {
                return None;
            }
            // An oversize request may take a larger block only within 20 MiB.
            if size >= max_split && block_size >= size.saturating_add(super::block::LARGE_BUFFER) {
                return None;
            }
            best.3
        };
        self.remove_free(id);
        Some(id)
    }

    fn should_split(&self, id: BlockId, size: u64) -> bool {
        let b = self.blocks.get(id);
        let remaining = b.size - size;
        if b.pool.is_small() || self.expandable() {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.max_split_size() && remaining > SMALL_SIZE
        }
    }

    /// Hands out block `id` (already out of the free set), splitting off the rest.
    fn alloc_found_block(&mut self, id: BlockId, size: u64, requested: u64) -> BlockId {
        let already_split = self.blocks.get(id).is_split();
        let expandable = self.blocks.get(id).expandable;
        let small = self.blocks.get(id).pool.is_small();
        if self.should_split(id, size) {
            let b = self.blocks.get(id);
            let rest = Block {
                addr: b.addr + size,
                size: b.size - size,
                requested: 0,
                allocated: false,
                prev: None,
                next: None,
                ..b.clone()
            };
            let next = b.next;
            let rest_size = rest.size;
            self.blocks.get_mut(id).size = size;
            let rest_id = self.splice(rest, Some(id), next);
            self.insert_free(rest_id);
            if !expandable {
                if already_split {
                    // An already-split free block shrinks by `size` bytes.
                    self.stats.inactive_split_bytes.decrease(small, size);
                } else {
                    // A whole block becomes split: its rest is a new inactive split block.
                    self.stats.inactive_split_bytes.increase(small, rest_size);
                    self.stats.inactive_split.increase(small, 1);
                }
            }
        } else if already_split && !expandable {
            let block_size = self.blocks.get(id).size;
            self.stats.inactive_split_bytes.decrease(small, block_size);
            self.stats.inactive_split.decrease(small, 1);
        }
        let b = self.blocks.get_mut(id);
        b.allocated = true;
        b.requested = requested;
        let (addr, block_size, stream) = (b.addr, b.size, b.stream);
        self.count_allocation(small, block_size, requested, true);
        self.history
            .record(TraceAction::Alloc, addr, block_size, stream);
        id
    }

    /// Notes that live block `id` is also used by work on `stream` (PyTorch's
    /// `record_stream`): when it is freed, it is reused only after that work is done.
    pub(crate) fn record_stream(&mut self, id: BlockId, stream: u32) {
        if self.blocks.get(id).stream == stream {
            return;
        }
        let uses = self.stream_uses.entry(id).or_default();
        if !uses.contains(&stream) {
            uses.push(stream);
        }
    }

    /// Frees block `id`: the statistics change now; the block goes back to its pool now,
    /// or, when it was used on other streams, once events recorded on them complete.
    pub(crate) fn free(&mut self, id: BlockId) {
        let uses = self.stream_uses.remove(&id).unwrap_or_default();
        if self.blocks.get(id).arena {
            return self.arena_free(id);
        }
        self.planned_note_free(id);
        let b = self.blocks.get(id);
        let (addr, size, requested, stream, small) =
            (b.addr, b.size, b.requested, b.stream, b.pool.is_small());
        self.history.record(TraceAction::Free, addr, size, stream);
        self.blocks.get_mut(id).requested = 0;
        self.count_allocation(small, size, requested, false);
        let events: Vec<u64> = uses
            .iter()
            .filter_map(|&s| self.device.record_event(s))
            .collect();
        if events.is_empty() {
            self.free_block(id);
        } else {
            // Still marked allocated, so no neighbour merges it in the meantime.
            self.pending_frees.push((id, events));
        }
    }

    /// Returns the freed blocks whose events have all completed to their pools.
    pub(crate) fn process_events(&mut self) {
        if self.pending_frees.is_empty() {
            return;
        }
        let device = Arc::clone(&self.device);
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending_frees)
            .into_iter()
            .partition(|(_, events)| events.iter().all(|&e| device.event_done(e)));
        self.pending_frees = waiting;
        for (id, events) in done {
            events.iter().for_each(|&e| device.destroy_event(e));
            self.free_block(id);
        }
    }

    /// Waits for every pending free's events and returns those blocks to their pools.
    pub(crate) fn synchronize_and_free_events(&mut self) {
        let device = Arc::clone(&self.device);
        for (id, events) in std::mem::take(&mut self.pending_frees) {
            for e in events {
                device.wait_event(e);
                device.destroy_event(e);
            }
            self.free_block(id);
        }
    }

    /// Returns freed block `id` to its pool, merging it with free neighbours.
    fn free_block(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let (small, expandable) = (b.pool.is_small(), b.expandable);
        let (prev, next) = (b.prev, b.next);
        self.blocks.get_mut(id).allocated = false;
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for candidate in [prev, next] {
            let subsumed = self.try_merge(id, candidate);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        self.insert_free(id);
        let merged = self.blocks.get(id);
        if merged.is_split() {
            net_blocks += 1;
            net_bytes += merged.size as i64;
        }
        // Free pages of expandable segments can always be returned, so PyTorch keeps
        // them out of inactive_split.
        if !expandable {
            apply_net(&mut self.stats.inactive_split, small, net_blocks);
            apply_net(&mut self.stats.inactive_split_bytes, small, net_bytes);
        }
    }

    /// Counts a block of `size` bytes (`requested` asked for) becoming live or free in
    /// the allocation, active and requested statistics.
    pub(crate) fn count_allocation(&mut self, small: bool, size: u64, requested: u64, live: bool) {
        let oversize = size >= self.max_split_size();
        let stats = &mut self.stats;
        let change = |array: &mut crate::stats::StatArray, amount: u64| {
            if live {
                array.increase(small, amount);
            } else {
                array.decrease(small, amount);
            }
        };
        change(&mut stats.allocation, 1);
        change(&mut stats.allocated_bytes, size);
        change(&mut stats.active, 1);
        change(&mut stats.active_bytes, size);
        change(&mut stats.requested_bytes, requested);
        if oversize {
            if live {
                stats.oversize_allocations.increase(1);
            } else {
                stats.oversize_allocations.decrease(1);
            }
        }
    }

    /// Merges free neighbour `src` into `dst` when both are free and equally mapped;
    /// returns the bytes absorbed (0 when no merge happened).
    pub(crate) fn try_merge(&mut self, dst: BlockId, src: Option<BlockId>) -> u64 {
        let Some(src) = src else { return 0 };
        let s = self.blocks.get(src);
        if s.allocated || s.mapped != self.blocks.get(dst).mapped {
            return 0;
        }
        if s.mapped {
            self.remove_free(src);
        } else {
            self.remove_unmapped(src);
        }
        let s = self.blocks.remove(src);
        let d = self.blocks.get_mut(dst);
        d.size += s.size;
        if d.prev == Some(src) {
            d.addr = s.addr;
            d.prev = s.prev;
            if let Some(p) = s.prev {
                self.blocks.get_mut(p).next = Some(dst);
            }
        } else {
            d.next = s.next;
            if let Some(n) = s.next {
                self.blocks.get_mut(n).prev = Some(dst);
            }
        }
        self.refresh_head(dst);
        s.size
    }

    /// Gets new device memory for a request: a segment, or pages of an expandable one.
    fn alloc_block(
        &mut self,
        pool: PoolKind,
        stream: u32,
        size: u64,
        is_retry: bool,
    ) -> Option<BlockId> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        match self.config.policy {
            // The planned policy's caching path follows PyTorch's rules.
            AllocatorPolicy::Pytorch | AllocatorPolicy::Planned => {
                self.alloc_segment(pool, stream, size)
            }
            AllocatorPolicy::Expandable => self.try_allocate_expandable_block(pool, stream, size),
        }
    }

    /// Synchronises, then returns every cached block that is a whole segment (and every
    /// free page of expandable segments) to the device.
    pub(crate) fn release_cached_blocks(&mut self) {
        self.stats.num_sync_all_streams += 1;
        self.device.synchronize();
        self.synchronize_and_free_events();
        self.release_blocks(PoolKind::Large);
        self.release_blocks(PoolKind::Small);
    }

    fn release_blocks(&mut self, pool: PoolKind) {
        let cached: Vec<BlockId> = self.pools[pool as usize]
            .free
            .iter()
            .map(|key| key.3)
            .collect();
        for id in cached {
            self.release_cached_block(id);
        }
    }

    /// Returns cached block `id` to the device where it can go: a whole segment, or the
    /// whole pages of a free expandable block (and its range once nothing is mapped).
    pub(crate) fn release_cached_block(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        if b.expandable {
            self.unmap_block(id);
            let b = self.blocks.get(id);
            if !b.mapped && !b.is_split() {
                self.release_expandable_segment(id);
            }
        } else if !b.is_split() {
            self.release_segment(id);
        }
    }

    /// Counts one reclaim that took `duration` and gave back `released_bytes`.
    pub(crate) fn count_reclaim(&mut self, duration: std::time::Duration, released_bytes: u64) {
        self.stats.num_reclaims += 1;
        self.stats.reclaim_ns += u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        self.stats.reclaimed_bytes += released_bytes;
    }
}

fn apply_net(array: &mut crate::stats::StatArray, small: bool, net: i64) {
    if net > 0 {
        array.increase(small, net as u64);
    } else if net < 0 {
        array.decrease(small, net.unsigned_abs());
    }
}
