//! Platforms: where memory lives and how it is measured and reclaimed.
//!
//! Every method exists on every platform; reclaiming code asks
//! [`Platform::caches_device_memory`] (the Rust form of vLLM-Omni's "non-CPU device
//! guard") rather than comparing device names.

mod caching;
mod recording;

pub use caching::CachingPlatform;
pub use recording::{PlatformCall, RecordingPlatform};

use std::time::Instant;

use serde::Serialize;

use crate::allocator::CachingAllocator;
use crate::reclaim::{Phase, Pressure, Reclaim, ReclaimPolicy};
use crate::stats::MemoryStats;

/// Which kind of platform this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlatformKind {
    /// Host memory through the caching allocator.
    Cpu,
    /// A modelled device: accounting only.
    Sim,
    /// An NVIDIA GPU through the CUDA driver (feature `cuda`).
    Cuda,
    /// A test platform that records calls to another.
    Recording,
}

impl PlatformKind {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PlatformKind::Cpu => "cpu",
            PlatformKind::Sim => "sim",
            PlatformKind::Cuda => "cuda",
            PlatformKind::Recording => "recording",
        }
    }
}

/// A device as the engine sees it.
pub trait Platform: Send + Sync + std::fmt::Debug {
    /// Which platform this is.
    fn kind(&self) -> PlatformKind;
    /// Waits for all outstanding work.
    fn synchronize(&self);
    /// `(free, total)` device bytes, like `torch.cuda.mem_get_info`.
    fn mem_info(&self) -> (u64, u64);
    /// The allocator's statistics, like `torch.cuda.memory_stats`.
    fn memory_stats(&self) -> MemoryStats;
    /// Sets every peak statistic to its current value.
    fn reset_peak_stats(&self);
    /// Returns cached, unused memory to the device (an explicit no-op where nothing is
    /// cached).
    fn empty_cache(&self);
    /// Whether this platform keeps freed device memory cached, i.e. whether reclaiming
    /// can ever help.
    fn caches_device_memory(&self) -> bool;
    /// The allocator every tensor byte on this platform comes from.
    fn allocator(&self) -> &CachingAllocator;
    /// The reclaim policy consulted at phase boundaries.
    fn reclaim_policy(&self) -> ReclaimPolicy;
    /// Crosses a phase boundary: the policy may reclaim; returns what it did.
    fn phase(&self, phase: Phase) -> Option<Reclaim> {
        reclaim_at(self, phase)
    }
}

/// Crosses `phase` on `platform`: marks it in the trace, and if the platform caches
/// device memory and its policy says so, reclaims, counts and times it.
pub fn reclaim_at<P: Platform + ?Sized>(platform: &P, phase: Phase) -> Option<Reclaim> {
    let allocator = platform.allocator();
    allocator.record_phase(phase.name());
    if !platform.caches_device_memory() {
        return None;
    }
    let stats = platform.memory_stats();
    let (free, capacity) = platform.mem_info();
    let pressure = Pressure {
        capacity,
        reserved: stats.reserved_bytes.all().current as u64,
        allocated: stats.allocated_bytes.all().current as u64,
        free,
    };
    if !platform.reclaim_policy().should_reclaim(phase, &pressure) {
        return None;
    }
    let start = Instant::now();
    platform.empty_cache();
    let duration = start.elapsed();
    let after = platform.memory_stats().reserved_bytes.all().current as u64;
    let released_bytes = pressure.reserved.saturating_sub(after);
    allocator.record_reclaim(duration, released_bytes);
    Some(Reclaim {
        phase,
        duration,
        released_bytes,
    })
}
