//! Reading the allocator's state out: snapshots of segments and blocks.

use super::state::State;
use crate::snapshot::{BlockSnapshot, BlockState, SegmentSnapshot, Snapshot};

impl State {
    /// Segments (for expandable segments: each contiguous mapped run), their blocks and
    /// the trace, in address order.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut segments = Vec::new();
        for info in self.segments.values() {
            let mut current: Option<SegmentSnapshot> = None;
            let mut cursor = Some(info.head);
            while let Some(id) = cursor {
                let b = self.blocks.get(id);
                cursor = b.next;
                if !b.mapped {
                    segments.extend(current.take());
                    continue;
                }
                let segment = current.get_or_insert_with(|| SegmentSnapshot {
                    address: b.addr,
                    total_size: 0,
                    stream: info.stream,
                    segment_type: if info.pool.is_small() {
                        "small"
                    } else {
                        "large"
                    },
                    allocated_size: 0,
                    active_size: 0,
                    requested_size: 0,
                    is_expandable: info.expandable,
                    blocks: Vec::new(),
                });
                segment.total_size += b.size;
                if b.allocated {
                    segment.allocated_size += b.size;
                    segment.active_size += b.size;
                    segment.requested_size += b.requested;
                }
                segment.blocks.push(BlockSnapshot {
                    address: b.addr,
                    size: b.size,
                    requested_size: b.requested,
                    state: if b.allocated {
                        BlockState::ActiveAllocated
                    } else {
                        BlockState::Inactive
                    },
                });
            }
            segments.extend(current);
        }
        Snapshot {
            device: self.device.name().to_string(),
            capacity: self.device.capacity(),
            policy: self.config.policy,
            segments,
            trace: self.history.events(),
            stats: self.stats.clone(),
        }
    }
}

impl State {
    /// Checks the structural invariants: block chains tile their segments exactly, the
    /// free and unmapped sets hold exactly the free blocks, adjacent free blocks of equal
    /// mapping are merged, and the byte statistics match the blocks.
    pub(crate) fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut allocated = 0u64;
        let mut reserved = 0u64;
        let mut free_seen = 0usize;
        let mut unmapped_seen = 0usize;
        for (&base, info) in &self.segments {
            let mut cursor = Some(info.head);
            let mut expected_addr = base;
            let mut previous: Option<usize> = None;
            let mut total = 0u64;
            while let Some(id) = cursor {
                let b = self.blocks.get(id);
                if b.addr != expected_addr {
                    return Err(format!(
                        "block {id} at {:#x}, expected {expected_addr:#x}",
                        b.addr
                    ));
                }
                if b.prev != previous {
                    return Err(format!("block {id} has a broken prev link"));
                }
                if b.segment != base || b.stream != info.stream || b.pool != info.pool {
                    return Err(format!("block {id} disagrees with its segment {base:#x}"));
                }
                if let Some(p) = previous {
                    let pb = self.blocks.get(p);
                    if !pb.allocated && !b.allocated && pb.mapped == b.mapped {
                        return Err(format!("free neighbours {p} and {id} were not merged"));
                    }
                }
                let pool = &self.pools[b.pool as usize];
                if b.allocated {
                    allocated += b.size;
                } else if b.arena {
                    // Free arena space belongs to the plan, never to a pool.
                    if pool.free.contains(&(b.stream, b.size, b.addr, id)) {
                        return Err(format!("free arena block {id} is in a pool"));
                    }
                } else if b.mapped {
                    free_seen += 1;
                    if !pool.free.contains(&(b.stream, b.size, b.addr, id)) {
                        return Err(format!("free block {id} missing from its pool"));
                    }
                } else {
                    unmapped_seen += 1;
                    if !pool.unmapped.contains(&(b.stream, b.addr, id)) {
                        return Err(format!("unmapped block {id} missing from its pool"));
                    }
                }
                if b.mapped {
                    reserved += b.size;
                }
                total += b.size;
                expected_addr = b.addr + b.size;
                previous = Some(id);
                cursor = b.next;
            }
            if total != info.size {
                return Err(format!(
                    "segment {base:#x} blocks sum to {total}, segment is {}",
                    info.size
                ));
            }
        }
        let pooled: usize = self.pools.iter().map(|p| p.free.len()).sum();
        let unmapped: usize = self.pools.iter().map(|p| p.unmapped.len()).sum();
        if pooled != free_seen || unmapped != unmapped_seen {
            return Err(format!(
                "pools hold {pooled} free / {unmapped} unmapped blocks, segments {free_seen} / {unmapped_seen}"
            ));
        }
        let stats_allocated = self.stats.allocated_bytes.all().current as u64;
        let stats_reserved = self.stats.reserved_bytes.all().current as u64;
        if stats_allocated != allocated || stats_reserved != reserved {
            return Err(format!(
                "stats say {stats_allocated} allocated / {stats_reserved} reserved, blocks {allocated} / {reserved}"
            ));
        }
        if reserved != self.device.used() {
            return Err(format!(
                "reserved {reserved} but the device has {} in use",
                self.device.used()
            ));
        }
        Ok(())
    }
}
