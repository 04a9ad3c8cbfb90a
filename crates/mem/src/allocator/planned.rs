//! The `planned` policy: record a span of requests once, place it offline in one arena
//! (see [`super::planner`]), then replay it: while requests match the plan, each gets
//! its planned offset in the arena; anything else goes to the caching allocator
//! underneath (`pytorch` rules) and is counted.
//!
//! A span is what the engine brackets with [`super::CachingAllocator::open_span`]: a
//! whole session, from its admission to `session_end` (or `error`), so every tensor of
//! the session — KV gathers, the decoder's feature cache carried from chunk to chunk,
//! the conditioning, the frames of an overlapped decode — is placed for its whole
//! lifetime, across chunks. What outlives the span (the KV page pool, cached prompt
//! embeddings, the weights) is never placed: the plan marks it `Fallback` and the
//! caching path serves it, so no arena is pinned past its session.
//!
//! Replay matches by (rounded size, stream): a per-key queue of plan positions, taken
//! in order within a window around the position expected next, tolerates reordered or
//! skipped requests (a cached prompt, a second thread). Safety never depends on the
//! match: an arena range is handed out only if it is free in the arena's block chain
//! right now, so a plan that stops matching costs misses, never overlapping tensors.
//! After [`MISS_LIMIT`] misses in a row the replay stops, the plan is dropped and the
//! next span with its key records again. At `session_end` the arena goes back to the
//! device (once its last block is freed) and the fallback cache is emptied, so what is
//! reserved after a session is what is live.
//!
//! Spans coexist: each live session has its own, with its own arenas and its own replay
//! position. A request goes to the span its thread entered
//! ([`super::CachingAllocator::enter_span`]); a thread that entered none uses the only
//! live span, and with several live it goes to the caching path (counted as
//! unattributed, never as a miss).
//!
//! What it wastes: the planner's gap over the live peak (a few per cent), the fallback
//! path's segment rounding for long-lived tensors, and one recording session when no
//! plan comes from elsewhere (meta execution).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::block::{round_size, Block, BlockId, PoolKind};
use super::planner::{plan, PlacementOrder, Plan, PlanRequest, Slot};
use super::state::{SegmentInfo, State};
use crate::error::{MemError, Result};
use crate::history::TraceAction;

/// Plan positions a request may be ahead of or behind the one expected next.
const LOOKAHEAD: usize = 256;
/// Plan positions before the end at which a request that matches nothing starts the
/// plan's period over.
const REWIND_SLACK: usize = 16;
/// Misses in a row after which a replay stops and its plan is re-recorded.
pub const MISS_LIMIT: u64 = 64;
/// Byte written over freed arena ranges in poison mode: 0xFF… is a NaN in f32, bf16 and
/// f16, so a tensor that reads freed memory shows up in its output.
pub const POISON_BYTE: u8 = 0xFF;

/// Identifies one live span; unique across every allocator of the process.
pub type SpanId = u64;

/// The next span id (0 is never used).
static NEXT_SPAN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The span this thread's allocations belong to, if it entered one.
    static ENTERED: Cell<Option<SpanId>> = const { Cell::new(None) };
}

/// The span the calling thread entered, if any.
pub(crate) fn entered_span() -> Option<SpanId> {
    ENTERED.with(Cell::get)
}

/// While alive, the calling thread's allocations go to one span (or, entered with
/// `None`, to none: the cache); dropping it restores what was entered before (guards
/// nest).
#[derive(Debug)]
pub struct SpanGuard {
    previous: Option<SpanId>,
    /// Entered on this thread: the guard must be dropped there.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl SpanGuard {
    /// Enters span `id` on the calling thread (`None`: no span; id 0 is never live).
    pub(crate) fn enter(id: Option<SpanId>) -> Self {
        let previous = ENTERED.with(|e| e.replace(Some(id.unwrap_or(0))));
        Self {
            previous,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for SpanGuard {
    fn drop(&mut self) {
        ENTERED.with(|e| e.set(self.previous));
    }
}

/// What the live spans hold and may still take: what admission weighs a new session
/// against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpanCommitments {
    /// Spans live now.
    pub live_spans: usize,
    /// Sum of the planned peaks (arenas plus long-lived tensors) of the live spans that
    /// replay a plan.
    pub planned_peaks: u64,
    /// Sum of those spans' planned arena bytes (reserved while they live).
    pub planned_arenas: u64,
    /// Arena bytes reserved now (retiring arenas of ended spans included).
    pub arena_bytes: u64,
    /// Bytes allocated inside arenas now.
    pub arena_allocated: u64,
}

/// Settings of the planned policy that tests and debugging turn on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlannedOptions {
    /// Fill every freed arena range with [`POISON_BYTE`] (hosts with real bytes only).
    pub poison: bool,
    /// Start arenas this many bytes (a multiple of 512) after their segment's base.
    pub arena_shift_bytes: u64,
    /// Plan with this order only, instead of keeping the best of all.
    pub order: Option<PlacementOrder>,
}

/// Plans by span key: what a recording or a meta execution produced, to install in
/// another allocator.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanBook {
    plans: BTreeMap<String, Arc<Plan>>,
}

impl PlanBook {
    /// The plan of `key`, if one was made.
    pub fn get(&self, key: &str) -> Option<&Plan> {
        self.plans.get(key).map(Arc::as_ref)
    }

    /// Keys with a plan, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.plans.keys().map(String::as_str)
    }

    /// Number of plans.
    pub fn len(&self) -> usize {
        self.plans.len()
    }

    /// Whether there is no plan.
    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    /// Adds (or replaces) the plan of `key`.
    pub fn insert(&mut self, key: &str, plan: Plan) {
        self.plans.insert(key.to_string(), Arc::new(plan));
    }
}

/// How a span started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanStart {
    /// A plan is replayed: its arenas are reserved now.
    Replay {
        /// Bytes of the arenas.
        arena_bytes: u64,
        /// Bytes the plan leaves to the caching path (long-lived tensors).
        fallback_bytes: u64,
    },
    /// No plan: the span is recorded and planned when it ends.
    Record,
}

#[derive(Debug)]
struct Recorder {
    requests: Vec<PlanRequest>,
    live: HashMap<BlockId, usize>,
    clock: u64,
    /// The clock at each `denoise_end`: the span's chunk boundaries.
    marks: Vec<u64>,
}

#[derive(Debug)]
struct Replay {
    plan: Arc<Plan>,
    /// Stream → (segment base of its arena, address of offset 0).
    arenas: HashMap<u32, (u64, u64)>,
    queues: HashMap<(u64, u32), VecDeque<usize>>,
    expected: usize,
    misses_in_a_row: u64,
    stopped: bool,
}

impl Replay {
    /// The plan position of the next request of `size` on `stream`, taken from its
    /// queue, if one is within the window around the position expected.
    fn take(&mut self, size: u64, stream: u32) -> Option<usize> {
        let queue = self.queues.get_mut(&(size, stream))?;
        while queue
            .front()
            .is_some_and(|&i| i + LOOKAHEAD < self.expected)
        {
            queue.pop_front();
        }
        let &index = queue.front()?;
        if index > self.expected + LOOKAHEAD {
            return None;
        }
        queue.pop_front();
        self.expected = index + 1;
        Some(index)
    }

    /// Starts the plan's period over (its positions queued again, the next one
    /// expected at its start); false for a plan without a period.
    fn rewind(&mut self) -> bool {
        let Some(period) = self.plan.period else {
            return false;
        };
        for queue in self.queues.values_mut() {
            queue.retain(|&i| i < period.start);
        }
        for (i, e) in self.plan.entries.iter().enumerate().skip(period.start) {
            self.queues
                .entry((e.size, e.stream))
                .or_default()
                .push_back(i);
        }
        self.expected = period.start;
        true
    }
}

#[derive(Debug)]
enum Mode {
    Record(Recorder),
    Replay(Replay),
    /// Its plan no longer describes its work (a session stepped in a batch with
    /// others): its requests go to the cache, and admission still counts its peak.
    Detached {
        peak: u64,
    },
}

#[derive(Debug)]
struct Span {
    key: String,
    mode: Mode,
    /// Work several sessions share (a batched round): its arenas are planned, but its
    /// peak is not committed for admission (the sessions' own peaks stand for it).
    shared: bool,
}

/// One arena segment.
#[derive(Debug)]
struct Arena {
    size: u64,
    /// Address → id of every block of the arena's chain.
    blocks: BTreeMap<u64, BlockId>,
    live: usize,
    /// Its span ended: release it once its last block is freed.
    retiring: bool,
}

/// The planned policy's part of the allocator state.
#[derive(Debug, Default)]
pub(crate) struct Planned {
    book: PlanBook,
    /// Keys whose replay stopped: their next span records the real run.
    rerecord: HashSet<String>,
    /// The live spans.
    spans: BTreeMap<SpanId, Span>,
    arenas: BTreeMap<u64, Arena>,
    pub options: PlannedOptions,
    /// Requests left before one is forced to miss (tests of the fallback path).
    pub miss_after: Option<u64>,
}

/// What the plan says about one request.
enum Lookup {
    Arena(u64, u64),
    Fallback,
    Miss,
}

impl Planned {
    pub(crate) fn book(&self) -> &PlanBook {
        &self.book
    }

    pub(crate) fn install(&mut self, book: &PlanBook) {
        for (key, plan) in &book.plans {
            self.rerecord.remove(key);
            self.book.plans.insert(key.clone(), Arc::clone(plan));
        }
    }

    /// Forgets the plan of `key` (its next span records, unless a plan is installed).
    pub(crate) fn remove(&mut self, key: &str) {
        self.book.plans.remove(key);
    }

    /// Whether a plan for `key` should be made elsewhere (meta execution): none is
    /// stored and no re-recording of the real run is due.
    pub(crate) fn wants_plan(&self, key: &str) -> bool {
        !self.book.plans.contains_key(key) && !self.rerecord.contains(key)
    }

    /// The key of the span a request of this thread goes to.
    pub(crate) fn span_key(&self, entered: Option<SpanId>) -> Option<&str> {
        let id = self.span_for(entered)?;
        self.spans.get(&id).map(|s| s.key.as_str())
    }

    /// Ids of the live spans.
    pub(crate) fn span_ids(&self) -> Vec<SpanId> {
        self.spans.keys().copied().collect()
    }

    /// The span of a thread that entered `entered`: that one while it is live (none once
    /// it ended); for a thread that entered nothing, the only live span, else none.
    pub(crate) fn span_for(&self, entered: Option<SpanId>) -> Option<SpanId> {
        if let Some(id) = entered {
            return self.spans.contains_key(&id).then_some(id);
        }
        let mut live = self.spans.keys();
        match (live.next(), live.next()) {
            (Some(&only), None) => Some(only),
            _ => None,
        }
    }

    /// What the live spans have committed: their plans' peaks and the arenas reserved
    /// for them (a recording span has no plan and counts nothing).
    pub(crate) fn commitments(&self) -> (u64, u64) {
        self.spans
            .values()
            .filter_map(|s| match &s.mode {
                Mode::Replay(r) if s.shared => Some((0, r.plan.arena_bytes())),
                Mode::Replay(r) => Some((r.plan.peak_bytes(), r.plan.arena_bytes())),
                Mode::Detached { peak } => Some((*peak, 0)),
                Mode::Record(_) => None,
            })
            .fold((0, 0), |(p, a), (peak, arena)| (p + peak, a + arena))
    }
}

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
