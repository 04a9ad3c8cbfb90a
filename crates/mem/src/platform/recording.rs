//! A platform for tests: forwards to another platform and records every call, so a test
//! can prove that a reclaim branch ran (or did not), and in which order.

use std::sync::{Arc, Mutex};

use super::reclaim_at;
use super::{Platform, PlatformKind};
use crate::allocator::CachingAllocator;
use crate::reclaim::{Phase, Reclaim, ReclaimPolicy};
use crate::stats::MemoryStats;

/// One call made on a [`RecordingPlatform`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlatformCall {
    /// `synchronize()`.
    Synchronize,
    /// `mem_info()`.
    MemInfo,
    /// `memory_stats()`.
    MemoryStats,
    /// `reset_peak_stats()`.
    ResetPeakStats,
    /// `empty_cache()`.
    EmptyCache,
    /// `phase(..)` with the phase crossed.
    Phase(Phase),
}

/// Forwards to an inner platform and records the calls made on it.
#[derive(Debug)]
pub struct RecordingPlatform {
    inner: Arc<dyn Platform>,
    caches_device_memory: bool,
    calls: Mutex<Vec<PlatformCall>>,
}

impl RecordingPlatform {
    /// Records calls to `inner`, reporting that it caches device memory as `inner` does.
    pub fn new(inner: Arc<dyn Platform>) -> Self {
        let caches_device_memory = inner.caches_device_memory();
        Self::with_caching(inner, caches_device_memory)
    }

    /// Records calls to `inner`, overriding whether it reports caching device memory
    /// (false gives a non-caching platform, which must never be asked to reclaim).
    pub fn with_caching(inner: Arc<dyn Platform>, caches_device_memory: bool) -> Self {
        Self {
            inner,
            caches_device_memory,
            calls: Mutex::new(Vec::new()),
        }
    }

    fn push(&self, call: PlatformCall) {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(call);
    }

    /// The calls so far, oldest first.
    pub fn calls(&self) -> Vec<PlatformCall> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many times `call` was made.
    pub fn count(&self, call: PlatformCall) -> usize {
        self.calls().iter().filter(|&&c| c == call).count()
    }

    /// Forgets the calls recorded so far.
    pub fn clear(&self) {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl Platform for RecordingPlatform {
    fn kind(&self) -> PlatformKind {
        PlatformKind::Recording
    }
    fn synchronize(&self) {
        self.push(PlatformCall::Synchronize);
        self.inner.synchronize();
    }
    fn mem_info(&self) -> (u64, u64) {
        self.push(PlatformCall::MemInfo);
        self.inner.mem_info()
    }
    fn memory_stats(&self) -> MemoryStats {
        self.push(PlatformCall::MemoryStats);
        self.inner.memory_stats()
    }
    fn reset_peak_stats(&self) {
        self.push(PlatformCall::ResetPeakStats);
        self.inner.reset_peak_stats();
    }
    fn empty_cache(&self) {
        self.push(PlatformCall::EmptyCache);
        self.inner.empty_cache();
    }
    fn caches_device_memory(&self) -> bool {
        self.caches_device_memory
    }
    fn allocator(&self) -> &CachingAllocator {
        self.inner.allocator()
    }
    fn reclaim_policy(&self) -> ReclaimPolicy {
        self.inner.reclaim_policy()
    }
    fn phase(&self, phase: Phase) -> Option<Reclaim> {
        self.push(PlatformCall::Phase(phase));
        reclaim_at(self, phase)
    }
}
