//! The [`Launcher`] of a real GPU (feature `cuda`): kernel launches through the driver
//! (`cuLaunchKernel` with the arguments' bytes), cuBLASLt GEMMs with a workspace block
//! from the device's `CachingAllocator`, and copies, all on one stream.
//!
//! One stream orders everything: a tensor block freed to the caching allocator and handed
//! out again is only touched by work submitted after the work that used it, so reuse is
//! stream-ordered without a synchronisation per free (PyTorch's rule for a block used on
//! its own stream). Host reads wait for the stream; uploads wait for their copy, since
//! the host buffer is the caller's.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result;
use headroom_mem::{Allocation, Platform};

use super::backend::{driver, CudaKernels};
use super::error::{CudaError, Result};
use super::gemm::{CublasLt, Workspace};
use super::launch::{Arg, GemmOperands, GemmShape, Launch, Launcher};

/// cuBLASLt's workspace: 32 MiB, NVIDIA's recommendation for Hopper.
pub const GEMM_WORKSPACE_BYTES: u64 = 32 << 20;

/// Kernels, cuBLASLt and one stream on one GPU.
pub struct CudaRuntime {
    kernels: CudaKernels,
    blas: CublasLt,
    workspace: Allocation,
}

impl std::fmt::Debug for CudaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRuntime")
            .field("kernels", &self.kernels)
            .field("blas", &self.blas)
            .finish()
    }
}

impl CudaRuntime {
    /// Opens GPU `ordinal` (compiling or loading every kernel) with cuBLASLt, its
    /// workspace taken from `platform`'s allocator (the `cuda` platform of that GPU).
    pub fn new(ordinal: usize, platform: &Arc<dyn Platform>) -> Result<Self> {
        let kernels = CudaKernels::new(ordinal)?;
        let blas = CublasLt::new()?;
        let workspace = platform
            .allocator()
            .allocate(GEMM_WORKSPACE_BYTES, 0)
            .map_err(|e| CudaError::Driver {
                call: "cuBLASLt workspace",
                reason: e.to_string(),
            })?;
        Ok(Self {
            kernels,
            blas,
            workspace,
        })
    }

    fn bind(&self) -> Result<()> {
        self.kernels
            .context()
            .bind_to_thread()
            .map_err(driver("cuCtxSetCurrent"))
    }

    fn stream(&self) -> cudarc::driver::sys::CUstream {
        self.kernels.stream().cu_stream()
    }
}

impl Launcher for CudaRuntime {
    fn cuda_stream(&self) -> Option<u64> {
        Some(self.stream() as u64)
    }

    fn describe(&self) -> String {
        format!(
            "{} ({}, kernels for {})",
            self.kernels.device_name(),
            "cuda",
            self.kernels.arch()
        )
    }

    fn launch(&self, l: &Launch) -> Result<()> {
        self.bind()?;
        let f = self.kernels.function(l.kernel)?.cu_function();
        // Each parameter as the bytes the kernel reads: pointers as u64 device addresses,
        // values as their C-layout bytes. They live until the call returns, and the
        // driver copies them at launch.
        let addrs: Vec<u64> = l
            .args
            .iter()
            .map(|a| match a {
                Arg::Ptr { addr, .. } => *addr,
                Arg::Value(_) => 0,
            })
            .collect();
        let mut params: Vec<*mut c_void> = l
            .args
            .iter()
            .zip(&addrs)
            .map(|(a, addr)| match a {
                Arg::Ptr { .. } => (addr as *const u64).cast_mut().cast(),
                Arg::Value(bytes) => bytes.as_ptr().cast_mut().cast(),
            })
            .collect();
        // SAFETY: `f` is a loaded kernel of this context; `params` holds one pointer per
        // kernel parameter, each to at least the parameter's size in bytes (the argument
        // lists are built per kernel signature and checked against the cubins' parameter
        // tables by the checked launcher's tests); the buffers the device pointers name
        // are live tensor blocks, kept alive by their tensors until later stream work.
        unsafe {
            result::launch_kernel(
                f,
                (l.grid[0], l.grid[1], l.grid[2]),
                (l.block[0], l.block[1], l.block[2]),
                l.shared,
                self.stream(),
                &mut params,
            )
        }
        .map_err(driver("cuLaunchKernel"))
    }

    fn gemm(&self, shape: &GemmShape, operands: &GemmOperands) -> Result<()> {
        self.bind()?;
        let workspace = Workspace {
            ptr: self.workspace.addr(),
            bytes: GEMM_WORKSPACE_BYTES as usize,
        };
        // SAFETY: the operands are live tensor blocks of the sizes `shape` implies (the
        // dispatch side makes them dense and of the input dtype); the workspace block is
        // owned by `self` and used by one GEMM at a time on this one stream.
        unsafe {
            self.blas
                .matmul(self.kernels.stream(), shape, *operands, workspace)
        }
    }

    fn fp8_gemm(&self) -> bool {
        self.kernels.capability() >= (8, 9)
    }

    fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` is a live block of at least `src.len()` bytes; the copy is waited
        // for before `src` (the caller's) can go away.
        unsafe { result::memcpy_htod_async(dst, src, self.stream()) }
            .map_err(driver("cuMemcpyHtoDAsync"))?;
        self.synchronize()
    }

    fn download(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `src` is a live block of at least `dst.len()` bytes, read after the
        // stream's earlier work; the copy is waited for before `dst` is returned.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream()) }
            .map_err(driver("cuMemcpyDtoHAsync"))?;
        self.synchronize()
    }

    fn zero(&self, dst: u64, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` is a live block of at least `bytes` bytes.
        unsafe { result::memset_d8_async(dst, 0, bytes as usize, self.stream()) }
            .map_err(driver("cuMemsetD8Async"))
    }

    fn synchronize(&self) -> Result<()> {
        self.kernels.synchronize()
    }
}
