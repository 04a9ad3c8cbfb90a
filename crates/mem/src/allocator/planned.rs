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
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::block::BlockId;
use super::planner::{PlacementOrder, Plan, PlanRequest};

/// Plan positions a request may be ahead of or behind the one expected next.
const LOOKAHEAD: usize = 256;
/// Plan positions before the end at which a request that matches nothing starts the
/// plan's period over.
pub(super) const REWIND_SLACK: usize = 16;
/// Misses in a row after which a replay stops and its plan is re-recorded.
pub const MISS_LIMIT: u64 = 64;
/// Byte written over freed arena ranges in poison mode: 0xFF… is a NaN in f32, bf16 and
/// f16, so a tensor that reads freed memory shows up in its output.
pub const POISON_BYTE: u8 = 0xFF;

/// Identifies one live span; unique across every allocator of the process.
pub type SpanId = u64;

/// The next span id (0 is never used).
pub(super) static NEXT_SPAN: AtomicU64 = AtomicU64::new(1);

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
    pub(super) plans: BTreeMap<String, Arc<Plan>>,
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
pub(super) struct Recorder {
    pub(super) requests: Vec<PlanRequest>,
    pub(super) live: HashMap<BlockId, usize>,
    pub(super) clock: u64,
    /// The clock at each `denoise_end`: the span's chunk boundaries.
    pub(super) marks: Vec<u64>,
}

#[derive(Debug)]
pub(super) struct Replay {
    pub(super) plan: Arc<Plan>,
    /// Stream → (segment base of its arena, address of offset 0).
    pub(super) arenas: HashMap<u32, (u64, u64)>,
    pub(super) queues: HashMap<(u64, u32), VecDeque<usize>>,
    pub(super) expected: usize,
    pub(super) misses_in_a_row: u64,
    pub(super) stopped: bool,
}

impl Replay {
    /// The plan position of the next request of `size` on `stream`, taken from its
    /// queue, if one is within the window around the position expected.
    pub(super) fn take(&mut self, size: u64, stream: u32) -> Option<usize> {
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
    pub(super) fn rewind(&mut self) -> bool {
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
pub(super) enum Mode {
    Record(Recorder),
    Replay(Replay),
    /// Its plan no longer describes its work (a session stepped in a batch with
    /// others): its requests go to the cache, and admission still counts its peak.
    Detached {
        peak: u64,
    },
}

#[derive(Debug)]
pub(super) struct Span {
    pub(super) key: String,
    pub(super) mode: Mode,
    /// Work several sessions share (a batched round): its arenas are planned, but its
    /// peak is not committed for admission (the sessions' own peaks stand for it).
    pub(super) shared: bool,
}

/// One arena segment.
#[derive(Debug)]
pub(super) struct Arena {
    pub(super) size: u64,
    /// Address → id of every block of the arena's chain.
    pub(super) blocks: BTreeMap<u64, BlockId>,
    pub(super) live: usize,
    /// Its span ended: release it once its last block is freed.
    pub(super) retiring: bool,
}

/// The planned policy's part of the allocator state.
#[derive(Debug, Default)]
pub(crate) struct Planned {
    pub(super) book: PlanBook,
    /// Keys whose replay stopped: their next span records the real run.
    pub(super) rerecord: HashSet<String>,
    /// The live spans.
    pub(super) spans: BTreeMap<SpanId, Span>,
    pub(super) arenas: BTreeMap<u64, Arena>,
    pub options: PlannedOptions,
    /// Requests left before one is forced to miss (tests of the fallback path).
    pub miss_after: Option<u64>,
}

/// What the plan says about one request.
pub(super) enum Lookup {
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
