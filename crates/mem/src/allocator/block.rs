//! Blocks, the slab that owns them, and the free pools ordered for best fit.
//!
//! A segment is a doubly linked chain of blocks over contiguous addresses; a block is
//! either handed out (`allocated`), free and cached in its pool, or (in expandable
//! segments) unmapped address space. Ids index a slab so that links survive moves and
//! a freed id is reused, keeping replays deterministic.

use std::collections::BTreeSet;

/// Index of a block in the slab.
pub(crate) type BlockId = usize;

/// Requests of at most this many bytes (after rounding) use the small pool.
pub(crate) const SMALL_SIZE: u64 = 1 << 20;
/// Every request is rounded up to a multiple of this (and at least this).
pub(crate) const MIN_BLOCK_SIZE: u64 = 512;
/// Segment size for the small pool; page size of small expandable segments.
pub(crate) const SMALL_BUFFER: u64 = 2 << 20;
/// Segment size for large requests under 10 MiB; page size of large expandable segments.
pub(crate) const LARGE_BUFFER: u64 = 20 << 20;
/// Large requests below this get a `LARGE_BUFFER` segment.
pub(crate) const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Larger segments are rounded up to a multiple of this.
pub(crate) const ROUND_LARGE: u64 = 2 << 20;

/// Which pool a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum PoolKind {
    Small = 0,
    Large = 1,
}

impl PoolKind {
    /// The pool for a rounded request size.
    pub(crate) fn for_size(rounded: u64) -> Self {
        if rounded <= SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    pub(crate) fn is_small(self) -> bool {
        self == PoolKind::Small
    }

    /// Page size of an expandable segment of this pool.
    pub(crate) fn page_size(self) -> u64 {
        match self {
            PoolKind::Small => SMALL_BUFFER,
            PoolKind::Large => LARGE_BUFFER,
        }
    }
}

/// PyTorch's `round_size`: at least 512 B, a multiple of 512 B.
pub(crate) fn round_size(size: u64) -> u64 {
    size.max(1).div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
}

/// PyTorch's `get_allocation_size`: the segment to request for a rounded size.
pub(crate) fn segment_size_for(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// One contiguous range of a segment.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub addr: u64,
    pub size: u64,
    /// Bytes the caller asked for (0 when free).
    pub requested: u64,
    pub stream: u32,
    pub pool: PoolKind,
    pub allocated: bool,
    /// False only for unmapped address space of an expandable segment.
    pub mapped: bool,
    pub expandable: bool,
    /// Whether the block lies in a planned arena (placed by the plan, never pooled).
    pub arena: bool,
    /// Base address of the segment this block belongs to.
    pub segment: u64,
    pub prev: Option<BlockId>,
    pub next: Option<BlockId>,
}

impl Block {
    /// Whether the block shares its segment with other blocks.
    pub(crate) fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}

/// Key of a cached free block: best fit is the first key at or above (stream, size).
pub(crate) type FreeKey = (u32, u64, u64, BlockId);
/// Key of unmapped address space: lowest address first, per stream.
pub(crate) type UnmappedKey = (u32, u64, BlockId);

/// The cached free blocks and unmapped ranges of one pool.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    pub free: BTreeSet<FreeKey>,
    pub unmapped: BTreeSet<UnmappedKey>,
}

/// Owner of every block; ids are reused lowest-first.
#[derive(Debug, Default)]
pub(crate) struct Slab {
    slots: Vec<Option<Block>>,
    vacant: Vec<BlockId>,
}

impl Slab {
    pub(crate) fn insert(&mut self, block: Block) -> BlockId {
        match self.vacant.pop() {
            Some(id) => {
                self.slots[id] = Some(block);
                id
            }
            None => {
                self.slots.push(Some(block));
                self.slots.len() - 1
            }
        }
    }

    pub(crate) fn remove(&mut self, id: BlockId) -> Block {
        let block = self.slots[id].take().expect("removed block id is live");
        self.vacant.push(id);
        block
    }

    pub(crate) fn get(&self, id: BlockId) -> &Block {
        self.slots[id].as_ref().expect("block id is live")
    }

    pub(crate) fn get_mut(&mut self, id: BlockId) -> &mut Block {
        self.slots[id].as_mut().expect("block id is live")
    }
}
