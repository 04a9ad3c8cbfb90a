//! headroom's memory core: platforms, a PyTorch-compatible caching allocator, its
//! statistics and snapshots, and the reclaim policies consulted at phase boundaries.
//!
//! Every tensor byte in headroom comes from a [`CachingAllocator`] owned by a
//! [`Platform`]; the platform says whether it caches device memory, and its
//! [`ReclaimPolicy`] decides at each named [`Phase`] whether to give the cache back.
//!
//! The trade-off: headroom writes its own allocator instead of borrowing one, so every
//! byte is measured, planned and reclaimed exactly, at the price of keeping PyTorch's
//! accounting (and its caching rules, under the `pytorch` policy) byte for byte.
#![warn(missing_docs, missing_debug_implementations)]

pub mod allocator;
pub mod device;
pub mod error;
pub mod history;
pub mod pickle;
pub mod platform;
pub mod policy;
pub mod reclaim;
pub mod replay;
pub mod required;
pub mod rss;
pub mod size;
pub mod snapshot;
pub mod stats;

pub use allocator::planner::{PlacementOrder, Plan, PlanEntry, PlanRequest, Slot};
pub use allocator::{
    Allocation, AllocatorConfig, AllocatorPolicy, CachingAllocator, PlanBook, PlannedOptions,
    SpanCommitments, SpanGuard, SpanId, SpanStart, StreamId, MISS_LIMIT, POISON_BYTE,
};
#[cfg(feature = "cuda")]
pub use device::{cuda_device_count, nvml_used_bytes, CudaMemory};
pub use device::{DeviceMemory, HostMemory, ModelledMemory};
pub use error::{MemError, Result};
pub use history::{History, TraceAction, TraceEvent};
pub use platform::reclaim_at;
pub use platform::{CachingPlatform, Platform, PlatformCall, PlatformKind, RecordingPlatform};
pub use reclaim::{Phase, Pressure, Reclaim, ReclaimPolicy};
pub use replay::{
    parse_jsonl, parse_pytorch_snapshot, parse_trace, replay, replay_on_sim, replay_planned,
    ReplayOptions, ReplayReport, TraceOp,
};
pub use rss::{process_minor_faults, process_peak_rss_bytes, process_rss_bytes};
pub use size::{format_bytes, parse_size, GIB, KIB, MIB};
pub use snapshot::{BlockSnapshot, BlockState, SegmentSnapshot, Snapshot};
pub use stats::{MemoryStats, Stat, StatArray, StatType};
