//! The `cpu` and `sim` platforms: a caching allocator over host memory or over a modelled
//! device.

use std::sync::Arc;

use super::{Platform, PlatformKind};
use crate::allocator::{AllocatorConfig, CachingAllocator};
use crate::device::{DeviceMemory, HostMemory, ModelledMemory};
use crate::error::{MemError, Result};
use crate::reclaim::ReclaimPolicy;
use crate::stats::MemoryStats;

/// A platform whose memory comes through a [`CachingAllocator`].
#[derive(Debug, Clone)]
pub struct CachingPlatform {
    kind: PlatformKind,
    allocator: CachingAllocator,
    reclaim: ReclaimPolicy,
}

impl CachingPlatform {
    /// Host memory (real bytes, real RSS) limited to `capacity` bytes, physical memory
    /// when `None`.
    pub fn cpu(
        capacity: Option<u64>,
        config: AllocatorConfig,
        reclaim: ReclaimPolicy,
    ) -> Result<Self> {
        let capacity = capacity.unwrap_or_else(HostMemory::physical_memory);
        Self::over(
            PlatformKind::Cpu,
            Arc::new(HostMemory::new(capacity)),
            capacity,
            config,
            reclaim,
        )
    }

    /// A modelled device of `capacity` bytes: same decisions, no bytes.
    pub fn sim(capacity: u64, config: AllocatorConfig, reclaim: ReclaimPolicy) -> Result<Self> {
        Self::over(
            PlatformKind::Sim,
            Arc::new(ModelledMemory::new(capacity)),
            capacity,
            config,
            reclaim,
        )
    }

    /// GPU `ordinal` through the CUDA driver: segments are real device memory.
    /// [`MemError::NoDevice`] when the driver cannot be loaded or the device is absent.
    #[cfg(feature = "cuda")]
    pub fn cuda(ordinal: usize, config: AllocatorConfig, reclaim: ReclaimPolicy) -> Result<Self> {
        let device = crate::device::CudaMemory::new(ordinal)?;
        let capacity = device.capacity();
        Self::over(
            PlatformKind::Cuda,
            Arc::new(device),
            capacity,
            config,
            reclaim,
        )
    }

    fn over(
        kind: PlatformKind,
        device: Arc<dyn DeviceMemory>,
        capacity: u64,
        config: AllocatorConfig,
        reclaim: ReclaimPolicy,
    ) -> Result<Self> {
        if capacity == 0 {
            return Err(MemError::InvalidConfig {
                field: "capacity",
                rule: "must be more than 0 bytes".to_string(),
            });
        }
        let allocator = CachingAllocator::new(device, config)?;
        allocator.set_fit_slack(reclaim.fit_slack());
        Ok(Self {
            kind,
            allocator,
            reclaim,
        })
    }
}

impl Platform for CachingPlatform {
    fn kind(&self) -> PlatformKind {
        self.kind
    }
    fn synchronize(&self) {
        self.allocator.synchronize();
    }
    fn mem_info(&self) -> (u64, u64) {
        if let Some(info) = self.allocator.driver_mem_info() {
            return info;
        }
        let total = self.allocator.capacity();
        (total.saturating_sub(self.allocator.device_used()), total)
    }
    fn memory_stats(&self) -> MemoryStats {
        self.allocator.stats()
    }
    fn reset_peak_stats(&self) {
        self.allocator.reset_peak_stats();
    }
    fn empty_cache(&self) {
        self.allocator.empty_cache();
    }
    fn caches_device_memory(&self) -> bool {
        true
    }
    fn allocator(&self) -> &CachingAllocator {
        &self.allocator
    }
    fn reclaim_policy(&self) -> ReclaimPolicy {
        self.reclaim
    }
}
