//! The `expandable` policy's device side: one segment per (pool, stream) over a reserved
//! address range as large as the device (plus an eighth, as PyTorch reserves), grown by
//! mapping pages (2 MiB small, 20 MiB large) at the lowest free address and shrunk by
//! unmapping the whole free pages inside cached blocks on `empty_cache`.
//!
//! It wastes at most one partial page per segment end and keeps live blocks from
//! pinning whole segments, which is what the PyTorch devlog example shows: 8 × 16 MiB
//! freed then 4 × 32 MiB reserves 140 MiB instead of 256 MiB.

use super::block::{Block, BlockId, PoolKind};
use super::state::{SegmentInfo, State};
use crate::history::TraceAction;

impl State {
    /// The lowest-address run of free and unmapped blocks on `stream` that can hold
    /// `size` bytes once mapped; a new segment when there is none.
    fn find_expandable_block(&mut self, pool: PoolKind, stream: u32, size: u64) -> Option<BlockId> {
        let unmapped: Vec<BlockId> = self.pools[pool as usize]
            .unmapped
            .range((stream, 0, 0)..)
            .take_while(|key| key.0 == stream)
            .map(|key| key.2)
            .collect();
        for id in unmapped {
            let mut candidate = id;
            if let Some(prev) = self.blocks.get(id).prev {
                if !self.blocks.get(prev).allocated {
                    candidate = prev;
                }
            }
            if self.free_run_bytes(candidate, size) >= size {
                return Some(candidate);
            }
        }
        self.new_expandable_segment(pool, stream)
    }

    /// Bytes of free (mapped or not) address space starting at `id`, counted up to `size`.
    fn free_run_bytes(&self, mut id: BlockId, size: u64) -> u64 {
        let mut bytes = 0;
        loop {
            let b = self.blocks.get(id);
            if b.allocated {
                return bytes;
            }
            bytes += b.size;
            match b.next {
                Some(next) if bytes < size => id = next,
                _ => return bytes,
            }
        }
    }

    fn new_expandable_segment(&mut self, pool: PoolKind, stream: u32) -> Option<BlockId> {
        let page = pool.page_size();
        let capacity = self.device.capacity();
        let span = capacity
            .saturating_add(capacity / 8)
            .div_ceil(page)
            .max(1)
            .saturating_mul(page);
        let base = self.device.reserve(span)?;
        let id = self.blocks.insert(Block {
            addr: base,
            size: span,
            requested: 0,
            stream,
            pool,
            allocated: false,
            mapped: false,
            expandable: true,
            arena: false,
            segment: base,
            prev: None,
            next: None,
        });
        self.segments.insert(
            base,
            SegmentInfo {
                size: span,
                stream,
                pool,
                expandable: true,
                head: id,
            },
        );
        self.stats.segment.increase(pool.is_small(), 1);
        self.insert_unmapped(id);
        Some(id)
    }

    /// Maps enough pages after a free block (or at an unmapped one) to hold `size`.
    pub(crate) fn try_allocate_expandable_block(
        &mut self,
        pool: PoolKind,
        stream: u32,
        size: u64,
    ) -> Option<BlockId> {
        let mut candidate = self.find_expandable_block(pool, stream, size)?;
        if !self.blocks.get(candidate).mapped {
            let to_map = self.blocks.get(candidate).size.min(size);
            if !self.map_block(candidate, to_map) {
                return None;
            }
        }
        while self.blocks.get(candidate).size < size {
            // Invariant: a free mapped block followed by unmapped space; mapping some of
            // it merges it into the free block.
            let remaining = size - self.blocks.get(candidate).size;
            let next = self.blocks.get(candidate).next?;
            if self.blocks.get(next).mapped || self.blocks.get(next).allocated {
                return None;
            }
            let to_map = remaining.min(self.blocks.get(next).size);
            if !self.map_block(next, to_map) {
                return None;
            }
            candidate = next;
        }
        self.remove_free(candidate);
        Some(candidate)
    }

    /// Maps the first `size` bytes (rounded up to pages) of unmapped block `id`, splits
    /// off the rest, and merges the mapped part with free neighbours.
    fn map_block(&mut self, id: BlockId, size: u64) -> bool {
        let b = self.blocks.get(id);
        debug_assert!(!b.mapped && size <= b.size);
        let page = b.pool.page_size();
        let map_size = size.div_ceil(page).saturating_mul(page).min(b.size);
        let (addr, block_size, stream, small, next) =
            (b.addr, b.size, b.stream, b.pool.is_small(), b.next);
        if !self.device.map(addr, map_size) {
            return false;
        }
        self.remove_unmapped(id);
        self.blocks.get_mut(id).mapped = true;
        if map_size < block_size {
            let rest = Block {
                addr: addr + map_size,
                size: block_size - map_size,
                mapped: false,
                ..self.blocks.get(id).clone()
            };
            let rest_id = self.splice(rest, Some(id), next);
            self.insert_unmapped(rest_id);
            self.blocks.get_mut(id).size = map_size;
        }
        let (prev, next) = (self.blocks.get(id).prev, self.blocks.get(id).next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.insert_free(id);
        self.stats.reserved_bytes.increase(small, map_size);
        self.stats.num_device_alloc += 1;
        self.history
            .record(TraceAction::SegmentMap, addr, map_size, stream);
        true
    }

    /// Unmaps the whole pages inside free block `id`; the partial pages at its ends stay
    /// mapped as free blocks of their own.
    pub(crate) fn unmap_block(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let page = b.pool.page_size();
        let (addr, size, base) = (b.addr, b.size, b.segment);
        let begin = base + (addr - base).div_ceil(page) * page;
        let end = base + (addr + size - base) / page * page;
        if end <= begin {
            return;
        }
        let (prev, next, stream, small) = (b.prev, b.next, b.stream, b.pool.is_small());
        self.remove_free(id);
        if begin > addr {
            let before = Block {
                addr,
                size: begin - addr,
                ..self.blocks.get(id).clone()
            };
            let before_id = self.splice(before, prev, Some(id));
            self.insert_free(before_id);
        }
        if addr + size > end {
            let after = Block {
                addr: end,
                size: addr + size - end,
                ..self.blocks.get(id).clone()
            };
            let after_id = self.splice(after, Some(id), next);
            self.insert_free(after_id);
        }
        {
            let b = self.blocks.get_mut(id);
            b.addr = begin;
            b.size = end - begin;
            b.mapped = false;
        }
        self.refresh_head(id);
        let (prev, next) = (self.blocks.get(id).prev, self.blocks.get(id).next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.insert_unmapped(id);
        self.device.unmap(begin, end - begin);
        self.stats.reserved_bytes.decrease(small, end - begin);
        self.stats.num_device_free += 1;
        self.history
            .record(TraceAction::SegmentUnmap, begin, end - begin, stream);
    }

    /// Gives back the address range of an expandable segment with nothing mapped.
    pub(crate) fn release_expandable_segment(&mut self, id: BlockId) {
        self.remove_unmapped(id);
        let b = self.blocks.remove(id);
        self.device.release_reservation(b.addr, b.size);
        self.segments.remove(&b.addr);
        self.stats.segment.decrease(b.pool.is_small(), 1);
    }
}
