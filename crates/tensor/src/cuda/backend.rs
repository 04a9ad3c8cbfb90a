//! Loading the compiled kernel modules on a GPU and launching them (feature `cuda`).
//!
//! [`CudaKernels`] opens a device through cudarc (after `headroom-mem` has checked that the
//! driver and every symbol are there, so cudarc never panics on a missing library),
//! compiles every module for the device's arch through the disk cache and loads the
//! cubins. Launches go to one stream; buffers here are cudarc's (`CudaSlice`), which is
//! what the self-test uses. Routing tensor ops on a `cuda` platform through these kernels,
//! with every byte from the `CachingAllocator`, is not wired yet.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use super::cache::DiskCache;
use super::compile::{compile_all, ARCHS};
use super::error::{CudaError, Result};

/// Threads per block of the element-wise (grid-stride) kernels.
pub const BLOCK: u32 = 256;

/// A strided view for the kernels (`View` of `prelude.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceView {
    /// Number of axes used (≤ 6).
    pub rank: i32,
    /// Extent per axis.
    pub shape: [i64; 6],
    /// Element stride per axis.
    pub stride: [i64; 6],
}

// SAFETY: plain `repr(C)` data with the layout of the CUDA struct `View`.
unsafe impl DeviceRepr for DeviceView {}

impl DeviceView {
    /// A view of `shape` with element `strides` (rank ≤ 6).
    pub fn new(shape: &[usize], strides: &[usize]) -> Result<Self> {
        if shape.len() > 6 || strides.len() != shape.len() {
            return Err(CudaError::Driver {
                call: "DeviceView::new",
                reason: format!("rank {} (at most 6, strides must match)", shape.len()),
            });
        }
        let mut v = DeviceView {
            rank: shape.len() as i32,
            ..Default::default()
        };
        for (i, (&s, &t)) in shape.iter().zip(strides).enumerate() {
            v.shape[i] = s as i64;
            v.stride[i] = t as i64;
        }
        Ok(v)
    }

    /// The row-major contiguous view of `shape`.
    pub fn contiguous(shape: &[usize]) -> Result<Self> {
        let mut strides = vec![1usize; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        Self::new(shape, &strides)
    }
}

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
            name,
            functions,
        })
    }

    /// The arch the kernels were compiled for.
    pub fn arch(&self) -> &'static str {
        self.arch
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

    /// Copies `data` to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        self.stream.clone_htod(data).map_err(driver("cuMemcpyHtoD"))
    }

    /// A zeroed device buffer of `len` elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros(len.max(1))
            .map_err(driver("cuMemAlloc"))
    }

    /// Copies a device buffer back (after the stream's work on it is done).
    pub fn download<T: DeviceRepr>(&self, data: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream.clone_dtoh(data).map_err(driver("cuMemcpyDtoH"))
    }

    /// Waits for every launch so far.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }
}

/// The launch shape of a grid-stride kernel over `n` elements.
pub fn grid_for(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, 1 << 20) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of 256 threads per row, at most 65 535 · 16 blocks (rows beyond loop).
pub fn rows_grid(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.clamp(1, 1 << 20) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}
