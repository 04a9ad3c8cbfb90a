//! Loading the compiled kernel modules on a GPU and launching them (feature `cuda`).
//!
//! [`CudaKernels`] opens a device through cudarc (after `headroom-mem` has checked that the
//! driver and every symbol are there, so cudarc never panics on a missing library),
//! compiles every module for the device's arch through the disk cache and loads the
//! cubins, with one stream for every launch. [`super::runtime::CudaRuntime`] launches
//! through it on tensor blocks from the `CachingAllocator`.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;

use super::cache::DiskCache;
use super::compile::{compile_all, ARCHS};
use super::error::{CudaError, Result};

/// A driver error as [`CudaError::Driver`].
pub fn driver(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        reason: format!("{e:?}"),
    }
}

/// The arch to compile for on a device of compute capability `major.minor`.
pub fn arch_for(major: i32, minor: i32) -> Result<&'static str> {
    let exact = format!("sm_{major}{minor}");
    if let Some(a) = ARCHS.iter().find(|&&a| a == exact) {
        return Ok(a);
    }
    match major {
        8 => Ok("sm_80"),
        m if m >= 9 => Ok("sm_90"),
        _ => Err(CudaError::Arch(exact)),
    }
}

/// Every kernel of every module, loaded on one device.
pub struct CudaKernels {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: &'static str,
    capability: (i32, i32),
    name: String,
    functions: HashMap<&'static str, CudaFunction>,
}

impl std::fmt::Debug for CudaKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKernels")
            .field("device", &self.name)
            .field("arch", &self.arch)
            .field("kernels", &self.functions.len())
            .finish()
    }
}

impl CudaKernels {
    /// Opens GPU `ordinal`, compiles (or reads from the cache) and loads every module.
    pub fn new(ordinal: usize) -> Result<Self> {
        let count = headroom_mem::cuda_device_count().map_err(|e| match e {
            headroom_mem::MemError::NoDevice { reason, .. } => CudaError::NoDevice(reason),
            other => CudaError::NoDevice(other.to_string()),
        })?;
        if ordinal >= count {
            return Err(CudaError::NoDevice(format!(
                "cuda:{ordinal} asked, the driver sees {count} device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("cuCtxCreate"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("cuDeviceGetAttribute"))?;
        let arch = arch_for(major, minor)?;
        let name = ctx.name().map_err(driver("cuDeviceGetName"))?;
        let cache = DiskCache::default_location();
        let mut functions = HashMap::new();
        for compiled in compile_all(arch, cache.as_ref())? {
            let module = ctx
                .load_module(Ptx::from_binary(compiled.cubin))
                .map_err(driver("cuModuleLoadData"))?;
            for &(kernel, _) in compiled.module.kernels {
                let f = module
                    .load_function(kernel)
                    .map_err(driver("cuModuleGetFunction"))?;
                functions.insert(kernel, f);
            }
        }
        let stream = ctx.default_stream();
        Ok(Self {
            ctx,
            stream,
            arch,
            capability: (major, minor),
            name,
            functions,
        })
    }

    /// The arch the kernels were compiled for.
    pub fn arch(&self) -> &'static str {
        self.arch
    }

    /// The device's compute capability (`(9, 0)` on an H100).
    pub fn capability(&self) -> (i32, i32) {
        self.capability
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The kernel `name`.
    pub fn function(&self, name: &str) -> Result<&CudaFunction> {
        self.functions.get(name).ok_or_else(|| CudaError::Driver {
            call: "cuModuleGetFunction",
            reason: format!("no kernel {name} in the catalog"),
        })
    }

    /// Waits for every launch so far.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }
}
