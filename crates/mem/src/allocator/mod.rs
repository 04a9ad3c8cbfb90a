//! `CachingAllocator`: one caching allocator, two policies.
//!
//! Requests are rounded to 512 B and served best-fit from per-pool caches of free blocks
//! ordered by (stream, size, address); misses get new device memory, and only after
//! releasing cached blocks does a request fail with [`MemError::OutOfMemory`]. The
//! `pytorch` policy reproduces PyTorch's CUDA caching allocator rule for rule (segment
//! sizes, split thresholds, `max_split_size`, the slow path, the statistics); the
//! `expandable` policy grows one segment per (pool, stream) by pages instead.
//!
//! What it wastes: up to 511 B of rounding per block and the cached blocks themselves,
//! which is the point — a cached hit is a tree lookup under a mutex, no system call.

mod block;
mod expandable;
mod fit;
mod inspect;
pub mod periodic;
mod planned;
pub mod planner;
mod segments;
mod state;

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::device::DeviceMemory;
use crate::error::{MemError, Result};
use crate::history::TraceEvent;
use crate::snapshot::Snapshot;
use crate::stats::MemoryStats;
use block::BlockId;
pub use planned::{
    PlanBook, PlannedOptions, SpanCommitments, SpanGuard, SpanId, SpanStart, MISS_LIMIT,
    POISON_BYTE,
};
use state::State;

pub use crate::policy::AllocatorPolicy;

/// Construction-time settings of a [`CachingAllocator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatorConfig {
    /// How device memory is obtained.
    pub policy: AllocatorPolicy,
    /// PyTorch's `max_split_size_mb` in bytes: blocks at least this large are never split
    /// and never serve smaller requests. `None` = unlimited (PyTorch's default).
    pub max_split_size: Option<u64>,
    /// Number of trace events kept for snapshots (0 = no history).
    pub history: usize,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        Self {
            policy: AllocatorPolicy::Pytorch,
            max_split_size: None,
            history: 0,
        }
    }
}

impl AllocatorConfig {
    /// A default configuration with the given policy.
    pub fn with_policy(policy: AllocatorPolicy) -> Self {
        Self {
            policy,
            ..Self::default()
        }
    }

    /// Checks the rules PyTorch enforces on the same settings.
    pub fn validate(&self) -> Result<()> {
        if let Some(max_split) = self.max_split_size {
            if max_split <= block::LARGE_BUFFER {
                return Err(MemError::InvalidConfig {
                    field: "max_split_size",
                    rule: format!("must be larger than 20 MiB (PyTorch's rule), got {max_split} B"),
                });
            }
        }
        Ok(())
    }
}

/// Identifies a stream; blocks are reused only on the stream they were allocated on.
pub type StreamId = u32;

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    holds_bytes: bool,
    /// Allocations left before an injected out-of-memory error (tests of failure paths).
    fail_after: std::sync::atomic::AtomicI64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than losing the allocator, so keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A thread-safe caching allocator over a [`DeviceMemory`]; cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct CachingAllocator {
    shared: Arc<Shared>,
}

impl CachingAllocator {
    /// An allocator over `device` with `config`, or the rule the config breaks.
    pub fn new(device: Arc<dyn DeviceMemory>, config: AllocatorConfig) -> Result<Self> {
        config.validate()?;
        let holds_bytes = device.holds_bytes();
        Ok(Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::new(config, device)),
                holds_bytes,
                fail_after: std::sync::atomic::AtomicI64::new(-1),
            }),
        })
    }

    /// Allocates `size` bytes on `stream`. Zero bytes gives an empty allocation that
    /// touches nothing, as PyTorch does.
    pub fn allocate(&self, size: u64, stream: StreamId) -> Result<Allocation> {
        if size == 0 {
            return Ok(Allocation {
                shared: None,
                block: 0,
                addr: 0,
                host: 0,
                size: 0,
                requested: 0,
                stream,
            });
        }
        let entered = planned::entered_span();
        let mut state = self.shared.lock();
        if self
            .shared
            .fail_after
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 0
            && self
                .shared
                .fail_after
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed)
                == 0
        {
            return Err(state.injected_oom(size, stream));
        }
        let id = if state.config.policy == AllocatorPolicy::Planned {
            state.planned_malloc(size, stream, entered)?
        } else {
            state.malloc(size, stream)?
        };
        let b = state.blocks.get(id);
        // Resolved once here, so reading the bytes costs no lookup.
        let host = if self.shared.holds_bytes {
            state
                .device
                .host_ptr(b.addr)
                .map_or(0, |p| p.as_ptr() as usize)
        } else {
            0
        };
        Ok(Allocation {
            shared: Some(Arc::clone(&self.shared)),
            block: id,
            host,
            addr: b.addr,
            size: b.size,
            requested: size,
            stream,
        })
    }

    /// Makes the allocation after the next `count` ones fail with out of memory, once
    /// (`None` cancels): how tests reach the failure paths of the code above.
    pub fn inject_oom_after(&self, count: Option<u64>) {
        let value = count.map_or(-1, |c| i64::try_from(c).unwrap_or(i64::MAX));
        self.shared
            .fail_after
            .store(value, std::sync::atomic::Ordering::Relaxed);
    }

    /// Freed blocks still waiting for events on the streams that used them.
    pub fn pending_frees(&self) -> usize {
        self.shared.lock().pending_frees.len()
    }

    /// The policy chosen at construction.
    pub fn policy(&self) -> AllocatorPolicy {
        self.shared.lock().config.policy
    }

    /// The configuration chosen at construction.
    pub fn config(&self) -> AllocatorConfig {
        self.shared.lock().config.clone()
    }

    /// Capacity of the underlying device.
    pub fn capacity(&self) -> u64 {
        self.shared.lock().device.capacity()
    }

    /// Bytes the device has given out (segments and mapped pages).
    pub fn device_used(&self) -> u64 {
        self.shared.lock().device.used()
    }

    /// `(free, total)` from the device's driver (`cuMemGetInfo`), where it has one.
    pub fn driver_mem_info(&self) -> Option<(u64, u64)> {
        let device = Arc::clone(&self.shared.lock().device);
        device.driver_mem_info()
    }

    /// Name of the underlying device (`cpu`, `sim`, `cuda`).
    pub fn device_name(&self) -> &'static str {
        self.shared.lock().device.name()
    }

    /// Whether allocations point at real bytes.
    pub fn holds_bytes(&self) -> bool {
        self.shared.holds_bytes
    }

    /// Waits for outstanding device work.
    pub fn synchronize(&self) {
        let device = Arc::clone(&self.shared.lock().device);
        device.synchronize();
    }

    /// Returns every cached segment with no live block (and every free page of
    /// expandable segments) to the device, after synchronising.
    pub fn empty_cache(&self) {
        let mut state = self.shared.lock();
        state
            .history
            .record(crate::history::TraceAction::EmptyCache, 0, 0, 0);
        state.release_cached_blocks();
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> MemoryStats {
        self.shared.lock().stats.clone()
    }

    /// Sets every peak to its current value.
    pub fn reset_peak_stats(&self) {
        self.shared.lock().stats.reset_peaks();
    }

    /// Marks a named phase in the history (a `phase` trace event).
    pub fn record_phase(&self, name: &str) {
        let entered = planned::entered_span();
        let mut state = self.shared.lock();
        if state.config.policy == AllocatorPolicy::Planned {
            state.planned_phase(name, entered);
        }
        state.phase_mark = (state.phase_mark.0 + 1, Some(name.to_string()));
        state.history.push(
            crate::history::TraceAction::Phase,
            0,
            0,
            0,
            Some(name.to_string()),
            None,
        );
    }

    /// How many phase boundaries were crossed, and the last one's name: lets a sampler
    /// see boundaries without keeping a history.
    pub fn phase_mark(&self) -> (u64, Option<String>) {
        self.shared.lock().phase_mark.clone()
    }

    /// Counts one reclaim that took `duration` and released `released_bytes`.
    pub fn record_reclaim(&self, duration: Duration, released_bytes: u64) {
        self.shared.lock().count_reclaim(duration, released_bytes);
    }

    /// Turns the `fit` policy's allocation-time reclaim on (`Some(slack)`: keep reserved
    /// bytes within `1 + slack` of the allocated peak where cached memory allows) or off.
    pub fn set_fit_slack(&self, slack: Option<f64>) {
        self.shared.lock().fit_slack = slack;
    }

    /// Turns the event history on (`capacity` > 0) or off.
    pub fn set_history(&self, capacity: usize) {
        let mut state = self.shared.lock();
        state.config.history = capacity;
        state.history.set_capacity(capacity);
    }

    /// The recorded events, oldest first.
    pub fn trace(&self) -> Vec<TraceEvent> {
        self.shared.lock().history.events()
    }

    /// Verifies the allocator's internal invariants (segments tiled by their blocks, pools
    /// consistent, statistics matching the blocks); for tests and debugging.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.shared.lock().check_invariants()
    }

    /// Starts a planned span named `key` (a session's shape) as the only one: ends every
    /// live span first, then opens this one (see [`CachingAllocator::open_span`]).
    pub fn begin_span(&self, key: &str) -> Result<SpanStart> {
        self.end_span();
        self.open_span(key).map(|(_, start)| start)
    }

    /// Starts a planned span named `key` beside the live ones: replays its plan,
    /// reserving its arenas now, or records it when there is none. The span ends at a
    /// `session_end` or `error` phase recorded by a thread in it, or at
    /// [`CachingAllocator::close_span`]. Out of memory when the arenas do not fit. Under
    /// other policies it does nothing and returns `(0, Record)`.
    pub fn open_span(&self, key: &str) -> Result<(SpanId, SpanStart)> {
        let mut state = self.shared.lock();
        if state.config.policy != AllocatorPolicy::Planned {
            return Ok((0, SpanStart::Record));
        }
        state.open_span(key, false)
    }

    /// [`CachingAllocator::open_span`] for work several spans' owners share (a batched
    /// round of sessions): its plan places that work, and admission counts its arenas
    /// as planned but no peak of its own (the owners' committed peaks stand for it).
    pub fn open_shared_span(&self, key: &str) -> Result<(SpanId, SpanStart)> {
        let mut state = self.shared.lock();
        if state.config.policy != AllocatorPolicy::Planned {
            return Ok((0, SpanStart::Record));
        }
        state.open_span(key, true)
    }

    /// Forgets the plan of `key`: its next span records unless a plan is installed.
    pub fn remove_plan(&self, key: &str) {
        self.shared.lock().planned.remove(key);
    }

    /// Ends span `id` (a recording becomes a plan, a replay's arenas go back once empty)
    /// and empties the cache; nothing when it already ended.
    pub fn close_span(&self, id: SpanId) {
        let mut state = self.shared.lock();
        if state.planned.span_ids().contains(&id) {
            state.close_span(id);
            state.release_cached_blocks();
        }
    }

    /// Detaches span `id` from its plan (work the plan does not describe, such as a
    /// session stepped in a batch with others): its arenas go back once empty, its
    /// requests go to the cache, and [`CachingAllocator::span_commitments`] still counts
    /// its planned peak until it closes.
    pub fn detach_span(&self, id: SpanId) {
        self.shared.lock().detach_span(id);
    }

    /// Ends every live span and empties the cache.
    pub fn end_span(&self) {
        let mut state = self.shared.lock();
        let ids = state.planned.span_ids();
        if !ids.is_empty() {
            for id in ids {
                state.close_span(id);
            }
            state.release_cached_blocks();
        }
    }

    /// Sends the calling thread's allocations to span `id` until the guard drops (`None`:
    /// to no span in particular).
    pub fn enter_span(&self, id: Option<SpanId>) -> SpanGuard {
        SpanGuard::enter(id)
    }

    /// The key of the span the calling thread's allocations go to, if any.
    pub fn span_key(&self) -> Option<String> {
        self.shared
            .lock()
            .planned
            .span_key(planned::entered_span())
            .map(str::to_string)
    }

    /// What the live spans have committed (see [`SpanCommitments`]).
    pub fn span_commitments(&self) -> SpanCommitments {
        let state = self.shared.lock();
        let (planned_peaks, planned_arenas) = state.planned.commitments();
        SpanCommitments {
            live_spans: state.planned.span_ids().len(),
            planned_peaks,
            planned_arenas,
            arena_bytes: state.arena_bytes(),
            arena_allocated: state.arena_allocated_bytes(),
        }
    }

    /// A copy of the plans made so far.
    pub fn plans(&self) -> PlanBook {
        self.shared.lock().planned.book().clone()
    }

    /// Adds plans made elsewhere (meta execution, another rank's recording).
    pub fn install_plans(&self, book: &PlanBook) {
        self.shared.lock().planned.install(book);
    }

    /// Whether a plan for `key` should be made elsewhere before its span: the planned
    /// policy is on, no plan is stored, and no re-recording of the real run is due.
    pub fn wants_plan(&self, key: &str) -> bool {
        let state = self.shared.lock();
        state.config.policy == AllocatorPolicy::Planned && state.planned.wants_plan(key)
    }

    /// Bytes the plan of `key` needs beyond what is live before its span (arenas plus
    /// long-lived tensors), if there is a plan.
    pub fn planned_peak(&self, key: &str) -> Option<u64> {
        self.shared
            .lock()
            .planned
            .book()
            .get(key)
            .map(planner::Plan::peak_bytes)
    }

    /// Bytes of planned arenas currently reserved.
    pub fn arena_bytes(&self) -> u64 {
        self.shared.lock().arena_bytes()
    }

    /// The planned policy's debugging options.
    pub fn planned_options(&self) -> PlannedOptions {
        self.shared.lock().planned.options.clone()
    }

    /// Sets the planned policy's debugging options (poison, arena shift, one order).
    pub fn set_planned_options(&self, options: PlannedOptions) {
        self.shared.lock().planned.options = options;
    }

    /// Makes the replayed request after the next `count` ones miss its plan, once
    /// (`None` cancels): how tests reach the fallback path mid-span.
    pub fn inject_plan_miss_after(&self, count: Option<u64>) {
        self.shared.lock().planned.miss_after = count;
    }

    /// Segments, blocks and the recorded trace at this moment.
    pub fn snapshot(&self) -> Snapshot {
        self.shared.lock().snapshot()
    }
}

/// A live block of device memory; dropping it returns the block to the allocator.
pub struct Allocation {
    shared: Option<Arc<Shared>>,
    block: BlockId,
    addr: u64,
    /// Host address of the bytes (0: none).
    host: usize,
    size: u64,
    requested: u64,
    stream: StreamId,
}

impl fmt::Debug for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocation")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size)
            .field("requested", &self.requested)
            .field("stream", &self.stream)
            .finish()
    }
}

impl Allocation {
    /// Device address of the block (0 for an empty allocation).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes of the block, rounded as the allocator rounds.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes the caller asked for.
    pub fn requested_size(&self) -> u64 {
        self.requested
    }

    /// Stream the block belongs to.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Notes that work on `stream` (other than the block's own) uses this block, as
    /// PyTorch's `record_stream`: once freed, the block is reused only after events
    /// recorded on those streams at the free have completed, with no synchronisation.
    pub fn record_stream(&self, stream: StreamId) {
        if let Some(shared) = &self.shared {
            shared.lock().record_stream(self.block, stream);
        }
    }

    /// Pointer to the bytes when the device holds real bytes and the block is not empty.
    pub fn as_ptr(&self) -> Option<NonNull<u8>> {
        match &self.shared {
            Some(shared) if shared.holds_bytes => NonNull::new(self.host as *mut u8),
            _ => None,
        }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.lock().free(self.block);
        }
    }
}
