//! The `planned` policy's span operations on the guarded state: opening, entering and
//! closing spans, recording and replaying their requests (see [`crate::allocator::planned`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{SegmentInfo, State};
use crate::allocator::block::{round_size, Block, BlockId, PoolKind};
use crate::allocator::planned::{
    Arena, Lookup, Mode, Recorder, Replay, Span, SpanId, SpanStart, MISS_LIMIT, NEXT_SPAN,
    POISON_BYTE, REWIND_SLACK,
};
use crate::allocator::planner::{plan, PlanRequest, Slot};
use crate::error::{MemError, Result};
use crate::history::TraceAction;

impl State {
    /// Allocates under the planned policy: the plan's offset when the request matches,
    /// else the caching path.
    pub(crate) fn planned_malloc(
        &mut self,
        requested: u64,
        stream: u32,
        entered: Option<SpanId>,
    ) -> Result<BlockId> {
        let size = round_size(requested);
        let sid = self.planned.span_for(entered);
        let detached = matches!(self.span_mode(sid), Some(Mode::Detached { .. }));
        if detached || (sid.is_none() && !self.planned.spans.is_empty()) {
            self.stats.planned_unattributed += 1;
        }
        let in_replay = matches!(self.span_mode(sid), Some(Mode::Replay(_)));
        match self.lookup(sid, size, stream) {
            Lookup::Arena(base, offset) => {
                if let Some(id) = self.arena_take(base, offset, size, requested, stream) {
                    self.stats.planned_hits += 1;
                    self.note_hit(sid);
                    return Ok(id);
                }
                self.note_miss(sid);
            }
            Lookup::Fallback => {
                let id = self.malloc(requested, stream)?;
                self.stats.planned_hits += 1;
                self.stats.fallback_bytes += self.blocks.get(id).size;
                self.note_hit(sid);
                return Ok(id);
            }
            Lookup::Miss => {
                if self.replaying(sid) {
                    self.note_miss(sid);
                }
            }
        }
        let id = self.malloc(requested, stream)?;
        if in_replay {
            self.stats.fallback_bytes += self.blocks.get(id).size;
        }
        if let Some(Mode::Record(r)) = self.span_mode_mut(sid) {
            r.live.insert(id, r.requests.len());
            r.requests.push(PlanRequest {
                size,
                stream,
                start: r.clock,
                end: None,
            });
            r.clock += 1;
        }
        Ok(id)
    }

    fn span_mode(&self, sid: Option<SpanId>) -> Option<&Mode> {
        self.planned.spans.get(&sid?).map(|s| &s.mode)
    }

    fn span_mode_mut(&mut self, sid: Option<SpanId>) -> Option<&mut Mode> {
        self.planned.spans.get_mut(&sid?).map(|s| &mut s.mode)
    }

    fn replaying(&self, sid: Option<SpanId>) -> bool {
        matches!(self.span_mode(sid), Some(Mode::Replay(r)) if !r.stopped)
    }

    fn lookup(&mut self, sid: Option<SpanId>, size: u64, stream: u32) -> Lookup {
        let mut forced = false;
        if self.replaying(sid) {
            match self.planned.miss_after {
                Some(0) => {
                    // The request is served elsewhere, as if it had not matched; its
                    // plan entry is used up all the same.
                    self.planned.miss_after = None;
                    forced = true;
                }
                Some(left) => self.planned.miss_after = Some(left - 1),
                None => {}
            }
        }
        let found = self.lookup_plan(sid, size, stream);
        if forced {
            Lookup::Miss
        } else {
            found
        }
    }

    fn lookup_plan(&mut self, sid: Option<SpanId>, size: u64, stream: u32) -> Lookup {
        let Some(Mode::Replay(r)) = self.span_mode_mut(sid) else {
            return Lookup::Miss;
        };
        if r.stopped {
            return Lookup::Miss;
        }
        if r.expected >= r.plan.entries.len() {
            r.rewind();
        }
        let index = match r.take(size, stream) {
            Some(index) => index,
            // The period's last requests did not come: the next period has begun.
            None if r.expected + REWIND_SLACK >= r.plan.entries.len() && r.rewind() => {
                match r.take(size, stream) {
                    Some(index) => index,
                    None => return Lookup::Miss,
                }
            }
            None => return Lookup::Miss,
        };
        match r.plan.entries[index].slot {
            Slot::Fallback => Lookup::Fallback,
            Slot::Arena(offset) => match r.arenas.get(&stream) {
                Some(&(base, origin)) => Lookup::Arena(base, origin + offset),
                None => Lookup::Miss,
            },
        }
    }

    fn note_hit(&mut self, sid: Option<SpanId>) {
        if let Some(Mode::Replay(r)) = self.span_mode_mut(sid) {
            r.misses_in_a_row = 0;
        }
    }

    fn note_miss(&mut self, sid: Option<SpanId>) {
        self.stats.planned_misses += 1;
        let Some(id) = sid else { return };
        if let Some(Span {
            key,
            mode: Mode::Replay(r),
            ..
        }) = self.planned.spans.get_mut(&id)
        {
            r.misses_in_a_row += 1;
            if r.misses_in_a_row > MISS_LIMIT && !r.stopped {
                // The plan no longer describes this workload: serve the rest of the
                // span from the cache and record the next one.
                r.stopped = true;
                self.planned.book.plans.remove(key.as_str());
                self.planned.rerecord.insert(key.clone());
            }
        }
    }

    /// Called on every free of a non-arena block: ends its recorded lifetime.
    pub(crate) fn planned_note_free(&mut self, id: BlockId) {
        for span in self.planned.spans.values_mut() {
            if let Mode::Record(r) = &mut span.mode {
                if let Some(index) = r.live.remove(&id) {
                    r.requests[index].end = Some(r.clock);
                    r.clock += 1;
                    return;
                }
            }
        }
    }

    /// Starts span `key` beside the live ones: reserves the arenas of its plan, or
    /// records it. A `shared` span commits no peak of its own.
    pub(crate) fn open_span(&mut self, key: &str, shared: bool) -> Result<(SpanId, SpanStart)> {
        let id = NEXT_SPAN.fetch_add(1, Ordering::Relaxed);
        let Some(plan) = self.planned.book.plans.get(key).cloned() else {
            self.planned.spans.insert(
                id,
                Span {
                    key: key.to_string(),
                    mode: Mode::Record(Recorder {
                        requests: Vec::new(),
                        live: HashMap::new(),
                        marks: Vec::new(),
                        clock: 0,
                    }),
                    shared,
                },
            );
            return Ok((id, SpanStart::Record));
        };
        let shift = match self.planned.options.arena_shift_bytes {
            0 => 0,
            bytes => round_size(bytes),
        };
        let mut arenas = HashMap::new();
        for &(stream, bytes) in &plan.arenas {
            if bytes == 0 {
                continue;
            }
            match self.new_arena(stream, bytes + shift) {
                Some(base) => {
                    arenas.insert(stream, (base, base + shift));
                }
                None => {
                    for (base, _) in arenas.into_values() {
                        self.release_arena(base);
                    }
                    return Err(self.out_of_memory_for(plan.arena_bytes(), stream));
                }
            }
        }
        let mut queues: HashMap<(u64, u32), VecDeque<usize>> = HashMap::new();
        for (i, e) in plan.entries.iter().enumerate() {
            queues.entry((e.size, e.stream)).or_default().push_back(i);
        }
        let start = SpanStart::Replay {
            arena_bytes: plan.arena_bytes(),
            fallback_bytes: plan.fallback_bytes,
        };
        self.planned.spans.insert(
            id,
            Span {
                key: key.to_string(),
                mode: Mode::Replay(Replay {
                    plan,
                    arenas,
                    queues,
                    expected: 0,
                    misses_in_a_row: 0,
                    stopped: false,
                }),
                shared,
            },
        );
        Ok((id, start))
    }

    /// Ends span `id`: a recording becomes its key's plan; a replay's arenas go back to
    /// the device once empty.
    pub(crate) fn close_span(&mut self, id: SpanId) {
        let Some(span) = self.planned.spans.remove(&id) else {
            return;
        };
        match span.mode {
            Mode::Record(r) => {
                if let Some(mut p) = plan(&r.requests, self.planned.options.order) {
                    p.marks = r.marks;
                    self.planned.rerecord.remove(&span.key);
                    self.planned.book.plans.insert(span.key, Arc::new(p));
                }
            }
            Mode::Replay(r) => {
                for (base, _) in r.arenas.into_values() {
                    self.release_arena(base);
                }
            }
            Mode::Detached { .. } => {}
        }
    }

    /// Detaches span `id` from its plan: its arenas go back once empty, a recording is
    /// dropped unplanned, and its requests go to the cache until it closes, while its
    /// planned peak stays committed.
    pub(crate) fn detach_span(&mut self, id: SpanId) {
        let Some(span) = self.planned.spans.get_mut(&id) else {
            return;
        };
        let peak = match &span.mode {
            Mode::Replay(r) => r.plan.peak_bytes(),
            Mode::Record(_) | Mode::Detached { .. } => 0,
        };
        let mode = std::mem::replace(&mut span.mode, Mode::Detached { peak });
        if let Mode::Replay(r) = mode {
            for (base, _) in r.arenas.into_values() {
                self.release_arena(base);
            }
        }
    }

    fn out_of_memory_for(&mut self, bytes: u64, stream: u32) -> MemError {
        self.injected_oom(bytes, stream)
    }

    /// A new arena segment of `size` bytes on `stream`, releasing cached blocks first
    /// if the device is full.
    fn new_arena(&mut self, stream: u32, size: u64) -> Option<u64> {
        let base = match self.device.alloc_segment(size) {
            Some(base) => base,
            None => {
                self.release_cached_blocks();
                self.device.alloc_segment(size)?
            }
        };
        let id = self.blocks.insert(Block {
            addr: base,
            size,
            requested: 0,
            stream,
            pool: PoolKind::Large,
            allocated: false,
            mapped: true,
            expandable: false,
            arena: true,
            segment: base,
            prev: None,
            next: None,
        });
        self.segments.insert(
            base,
            SegmentInfo {
                size,
                stream,
                pool: PoolKind::Large,
                expandable: false,
                head: id,
            },
        );
        self.planned.arenas.insert(
            base,
            Arena {
                size,
                blocks: BTreeMap::from([(base, id)]),
                live: 0,
                retiring: false,
            },
        );
        self.stats.segment.increase(false, 1);
        self.stats.reserved_bytes.increase(false, size);
        self.stats.num_device_alloc += 1;
        self.history
            .record(TraceAction::SegmentAlloc, base, size, stream);
        Some(base)
    }

    /// Gives arena `base` back to the device if nothing in it is live; otherwise marks
    /// it to go when its last block is freed.
    fn release_arena(&mut self, base: u64) {
        let Some(arena) = self.planned.arenas.get_mut(&base) else {
            return;
        };
        if arena.live > 0 {
            arena.retiring = true;
            return;
        }
        let size = arena.size;
        if let Some(arena) = self.planned.arenas.remove(&base) {
            for id in arena.blocks.into_values() {
                self.blocks.remove(id);
            }
        }
        let stream = self.segments.remove(&base).map_or(0, |s| s.stream);
        self.device.free_segment(base, size);
        self.stats.segment.decrease(false, 1);
        self.stats.reserved_bytes.decrease(false, size);
        self.stats.num_device_free += 1;
        self.history
            .record(TraceAction::SegmentFree, base, size, stream);
    }

    /// Hands out `[addr, addr + size)` of arena `base` if it is free right now.
    fn arena_take(
        &mut self,
        base: u64,
        addr: u64,
        size: u64,
        requested: u64,
        stream: u32,
    ) -> Option<BlockId> {
        let arena = self.planned.arenas.get(&base)?;
        let (_, &id) = arena.blocks.range(..=addr).next_back()?;
        let b = self.blocks.get(id);
        if b.allocated || b.addr + b.size < addr + size {
            return None;
        }
        let (block_addr, block_size, prev, next) = (b.addr, b.size, b.prev, b.next);
        let template = b.clone();
        let mut added = Vec::new();
        if addr > block_addr {
            let before = Block {
                addr: block_addr,
                size: addr - block_addr,
                ..template.clone()
            };
            added.push(self.splice(before, prev, Some(id)));
        }
        if block_addr + block_size > addr + size {
            let after = Block {
                addr: addr + size,
                size: block_addr + block_size - addr - size,
                ..template
            };
            added.push(self.splice(after, Some(id), next));
        }
        let b = self.blocks.get_mut(id);
        b.addr = addr;
        b.size = size;
        b.allocated = true;
        b.requested = requested;
        self.refresh_head(id);
        let arena = self.planned.arenas.get_mut(&base)?;
        arena.blocks.remove(&block_addr);
        arena.blocks.insert(addr, id);
        arena.live += 1;
        for new in added {
            let a = self.blocks.get(new).addr;
            if let Some(arena) = self.planned.arenas.get_mut(&base) {
                arena.blocks.insert(a, new);
            }
        }
        let small = PoolKind::for_size(size).is_small();
        self.count_allocation(small, size, requested, true);
        self.history.record(TraceAction::Alloc, addr, size, stream);
        Some(id)
    }

    /// Returns arena block `id`: poisons it if asked, merges it with free neighbours,
    /// and releases a retiring arena once it is empty.
    pub(crate) fn arena_free(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let (addr, size, requested, stream, base) =
            (b.addr, b.size, b.requested, b.stream, b.segment);
        self.history.record(TraceAction::Free, addr, size, stream);
        if self.planned.options.poison {
            if let Some(ptr) = self.device.host_ptr(addr) {
                // SAFETY: `[addr, addr + size)` is this block's range inside an arena
                // segment the allocator owns; its only owner has just dropped it and no
                // other block overlaps it, so nothing reads or writes it concurrently.
                unsafe { std::ptr::write_bytes(ptr.as_ptr(), POISON_BYTE, size as usize) };
            }
        }
        {
            let b = self.blocks.get_mut(id);
            b.allocated = false;
            b.requested = 0;
        }
        for neighbour in [self.blocks.get(id).prev, self.blocks.get(id).next] {
            let Some(n) = neighbour else { continue };
            if self.blocks.get(n).allocated {
                continue;
            }
            let nb = self.blocks.remove(n);
            if let Some(arena) = self.planned.arenas.get_mut(&base) {
                arena.blocks.remove(&nb.addr);
            }
            let current_addr = self.blocks.get(id).addr;
            let d = self.blocks.get_mut(id);
            d.size += nb.size;
            if nb.addr < current_addr {
                if let Some(arena) = self.planned.arenas.get_mut(&base) {
                    arena.blocks.remove(&current_addr);
                    arena.blocks.insert(nb.addr, id);
                }
                let d = self.blocks.get_mut(id);
                d.addr = nb.addr;
                d.prev = nb.prev;
                if let Some(p) = nb.prev {
                    self.blocks.get_mut(p).next = Some(id);
                }
            } else {
                d.next = nb.next;
                if let Some(nn) = nb.next {
                    self.blocks.get_mut(nn).prev = Some(id);
                }
            }
            self.refresh_head(id);
        }
        let small = PoolKind::for_size(size).is_small();
        self.count_allocation(small, size, requested, false);
        let retire = self.planned.arenas.get_mut(&base).is_some_and(|arena| {
            arena.live -= 1;
            arena.live == 0 && arena.retiring
        });
        if retire {
            self.release_arena(base);
        }
    }

    /// Crossing `session_end` or `error`: the thread's span ends and the cache goes back.
    pub(crate) fn planned_phase(&mut self, name: &str, entered: Option<SpanId>) {
        let sid = self.planned.span_for(entered);
        if name == "denoise_end" {
            if let Some(Mode::Record(r)) = self.span_mode_mut(sid) {
                r.marks.push(r.clock);
            }
        }
        if name == "session_end" || name == "error" {
            if let Some(id) = sid {
                self.close_span(id);
            }
            self.release_cached_blocks();
        }
    }

    /// Bytes of the arenas that are still reserved.
    pub(crate) fn arena_bytes(&self) -> u64 {
        self.planned.arenas.values().map(|a| a.size).sum()
    }

    /// Bytes allocated inside the arenas now.
    pub(crate) fn arena_allocated_bytes(&self) -> u64 {
        self.planned
            .arenas
            .values()
            .flat_map(|a| a.blocks.values())
            .map(|&id| self.blocks.get(id))
            .filter(|b| b.allocated)
            .map(|b| b.size)
            .sum()
    }
}
