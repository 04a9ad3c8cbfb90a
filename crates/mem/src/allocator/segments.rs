//! The `pytorch` policy's device side: one device allocation per segment, sized by
//! PyTorch's rules (2 MiB small, 20 MiB for large requests under 10 MiB, else rounded to
//! 2 MiB), returned to the device only when it holds no live block.

use super::block::{segment_size_for, Block, BlockId, PoolKind};
use super::state::{SegmentInfo, State};
use crate::history::TraceAction;

impl State {
    /// `cudaMalloc` path: asks the device for a new segment that holds `size`.
    pub(crate) fn alloc_segment(
        &mut self,
        pool: PoolKind,
        stream: u32,
        size: u64,
    ) -> Option<BlockId> {
        // The planned policy's caching path holds what no plan places: the weights and
        // pools made before any session, tensors that outlive their session, and misses.
        // Most of it is never freed, so a segment rounded up for reuse would stay partly
        // empty for good: it gets exactly what it asked for.
        let segment_size = if self.config.policy == super::AllocatorPolicy::Planned {
            size
        } else {
            segment_size_for(size)
        };
        let addr = self.device.alloc_segment(segment_size)?;
        let id = self.blocks.insert(Block {
            addr,
            size: segment_size,
            requested: 0,
            stream,
            pool,
            allocated: false,
            mapped: true,
            expandable: false,
            arena: false,
            segment: addr,
            prev: None,
            next: None,
        });
        self.segments.insert(
            addr,
            SegmentInfo {
                size: segment_size,
                stream,
                pool,
                expandable: false,
                head: id,
            },
        );
        let small = pool.is_small();
        self.stats.segment.increase(small, 1);
        self.stats.reserved_bytes.increase(small, segment_size);
        self.stats.num_device_alloc += 1;
        if segment_size >= self.max_split_size() {
            self.stats.oversize_segments.increase(1);
        }
        self.history
            .record(TraceAction::SegmentAlloc, addr, segment_size, stream);
        Some(id)
    }

    /// `cudaFree` path: returns a cached block that spans its whole segment.
    pub(crate) fn release_segment(&mut self, id: BlockId) {
        self.remove_free(id);
        let b = self.blocks.remove(id);
        debug_assert!(!b.is_split() && !b.allocated && !b.expandable);
        self.device.free_segment(b.addr, b.size);
        self.segments.remove(&b.addr);
        let small = b.pool.is_small();
        self.stats.segment.decrease(small, 1);
        self.stats.reserved_bytes.decrease(small, b.size);
        self.stats.num_device_free += 1;
        if b.size >= self.max_split_size() {
            self.stats.oversize_segments.decrease(1);
        }
        self.history
            .record(TraceAction::SegmentFree, b.addr, b.size, b.stream);
    }

    /// With `max_split_size` set, frees cached oversize segments before the full flush:
    /// the smallest one that holds the request, else the largest ones until enough bytes
    /// are released. Returns whether it released enough.
    pub(crate) fn release_available_cached_blocks(
        &mut self,
        pool: PoolKind,
        stream: u32,
        size: u64,
    ) -> bool {
        let Some(max_split) = self.config.max_split_size else {
            return false;
        };
        let key_size = size.max(max_split);
        let free = &self.pools[pool as usize].free;
        let fits = free
            .range((stream, key_size, 0, 0)..)
            .next()
            .filter(|key| key.0 == stream && !self.blocks.get(key.3).expandable)
            .copied();
        if let Some(key) = fits {
            if !self.blocks.get(key.3).is_split() {
                self.release_segment(key.3);
                return true;
            }
            return false;
        }
        // No single block is large enough: free oversize blocks, largest first.
        let candidates: Vec<(u64, BlockId)> = free
            .range(..(stream, key_size, 0, 0))
            .rev()
            .take_while(|key| key.0 == stream && key.1 >= max_split)
            .map(|key| (key.1, key.3))
            .collect();
        let mut released = 0;
        for (block_size, id) in candidates {
            if released >= key_size {
                break;
            }
            let b = self.blocks.get(id);
            // Oversize blocks are never split, so each is a whole segment; check anyway
            // rather than free a segment that still holds live blocks.
            if !b.expandable && !b.is_split() {
                self.release_segment(id);
                released += block_size;
            }
        }
        released >= key_size
    }
}
