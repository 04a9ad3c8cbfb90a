//! A device handle: the platform whose allocator every tensor byte comes from.

use std::fmt;
use std::sync::Arc;

use headroom_mem::{AllocatorConfig, CachingPlatform, Platform, ReclaimPolicy};

use crate::cuda::launch::Launcher;
use crate::error::Result;

/// A cheap, shared handle to a [`Platform`], and the [`Launcher`] that computes on it when
/// its bytes live on a GPU.
#[derive(Clone)]
pub struct Device {
    platform: Arc<dyn Platform>,
    meta: bool,
    launcher: Option<Arc<dyn Launcher>>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("platform", &self.platform.kind())
            .field("meta", &self.meta)
            .field("launcher", &self.launcher.as_ref().map(|l| l.describe()))
            .finish()
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.platform, &other.platform)
    }
}

impl Device {
    /// A device over `platform`; meta (shape-only) when its allocator holds no bytes.
    pub fn new(platform: Arc<dyn Platform>) -> Self {
        let meta = !platform.allocator().holds_bytes();
        Self {
            platform,
            meta,
            launcher: None,
        }
    }

    /// A GPU device: bytes from `platform`'s allocator (device addresses), every op
    /// computed by `launcher`.
    pub fn with_launcher(platform: Arc<dyn Platform>, launcher: Arc<dyn Launcher>) -> Self {
        Self {
            platform,
            meta: false,
            launcher: Some(launcher),
        }
    }

    /// A GPU device without a GPU: a modelled device of `capacity` bytes whose every op
    /// goes through the launch path and is validated by a
    /// [`CheckedLauncher`](crate::cuda::check::CheckedLauncher) (no values are computed).
    pub fn checked_gpu(
        capacity: u64,
        config: AllocatorConfig,
        reclaim: ReclaimPolicy,
    ) -> Result<Self> {
        let platform = CachingPlatform::sim(capacity, config, reclaim)?;
        let launcher = crate::cuda::check::CheckedLauncher::new()?;
        Ok(Self::with_launcher(Arc::new(platform), Arc::new(launcher)))
    }

    /// GPU `ordinal`: the caching allocator over its memory (`config`, `reclaim`) and the
    /// CUDA runtime (every kernel loaded, cuBLASLt) computing on it (feature `cuda`).
    #[cfg(feature = "cuda")]
    pub fn cuda(ordinal: usize, config: AllocatorConfig, reclaim: ReclaimPolicy) -> Result<Self> {
        let platform: Arc<dyn Platform> =
            Arc::new(CachingPlatform::cuda(ordinal, config, reclaim)?);
        let runtime = crate::cuda::runtime::CudaRuntime::new(ordinal, &platform)?;
        Ok(Self::with_launcher(platform, Arc::new(runtime)))
    }

    /// Waits until the work submitted on this device is done (a no-op on the host, whose
    /// ops return finished): what a wall-clock timing of GPU work needs first.
    pub fn synchronize(&self) -> Result<()> {
        if let Some(l) = &self.launcher {
            l.synchronize()?;
        }
        Ok(())
    }

    /// The launcher that computes on this device (`None` on host and meta devices).
    pub fn launcher(&self) -> Option<&Arc<dyn Launcher>> {
        self.launcher.as_ref()
    }

    /// Host memory with the default allocator and no reclaim (tests, tools).
    pub fn cpu() -> Result<Self> {
        let platform =
            CachingPlatform::cpu(None, AllocatorConfig::default(), ReclaimPolicy::Never)?;
        Ok(Self::new(Arc::new(platform)))
    }

    /// A modelled device of `capacity` bytes: ops check shapes and allocate, compute nothing.
    pub fn sim(capacity: u64) -> Result<Self> {
        let platform =
            CachingPlatform::sim(capacity, AllocatorConfig::default(), ReclaimPolicy::Never)?;
        Ok(Self::new(Arc::new(platform)))
    }

    /// The platform.
    pub fn platform(&self) -> &Arc<dyn Platform> {
        &self.platform
    }

    /// What this device is, in words (`cpu`, `sim`, or the GPU launcher's own words).
    pub fn describe(&self) -> String {
        match &self.launcher {
            Some(l) => l.describe(),
            None => self.platform.kind().name().to_string(),
        }
    }

    /// Whether tensors here are shapes only (no values are computed).
    pub fn is_meta(&self) -> bool {
        self.meta
    }
}
