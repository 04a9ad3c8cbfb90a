//! Errors of the CUDA backend: finding and calling NVRTC, compiling a kernel module, the
//! on-disk compile cache, and (with the `cuda` feature) the driver and cuBLASLt.

use std::path::PathBuf;

/// What went wrong in the CUDA backend; each variant says what to change.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    /// No NVRTC library was found in any searched folder: install the pinned wheel
    /// (`pip install nvidia-cuda-nvrtc==13.0.88`) or point `HEADROOM_CUDA_LIB_DIR` at it.
    #[error(
        "NVRTC (libnvrtc.so.13) not found; looked in: {}. Set HEADROOM_CUDA_LIB_DIR to the \
         folder holding libnvrtc.so.13 and libnvrtc-builtins.so.13.* (for example \
         `pip install nvidia-cuda-nvrtc==13.0.88` then .../site-packages/nvidia/cu13/lib)",
        looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NvrtcNotFound {
        /// Every folder that was searched, in order.
        looked: Vec<PathBuf>,
    },
    /// The NVRTC library was found but could not be loaded or lacks an entry point: the
    /// folder holds a broken or too old NVRTC.
    #[error("NVRTC at {path}: {reason}")]
    NvrtcLoad {
        /// The library file.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// An NVRTC call failed outside compilation (out of memory, invalid option).
    #[error("NVRTC {call}: {reason}")]
    Nvrtc {
        /// The NVRTC entry point.
        call: &'static str,
        /// NVRTC's error string.
        reason: String,
    },
    /// A kernel module did not compile: the log says which line; a bug in the embedded
    /// source or an arch that NVRTC does not know.
    #[error("compiling CUDA module {module} for {arch} failed:\n{log}")]
    Compile {
        /// The module (one `.cu` file).
        module: String,
        /// The target arch (`sm_90`).
        arch: String,
        /// NVRTC's compile log.
        log: String,
    },
    /// An arch name NVRTC is not asked for: use `sm_80`, `sm_90` or `sm_90a`.
    #[error("unsupported CUDA arch {0:?}: expected sm_80, sm_86, sm_89, sm_90 or sm_90a")]
    Arch(String),
    /// The compile cache folder could not be read or written; compiling still works with
    /// `HEADROOM_CUDA_CACHE` pointed at a writable folder.
    #[error("CUDA compile cache {path}: {reason}")]
    Cache {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        reason: String,
    },
    /// A driver or library call failed on the GPU (feature `cuda`).
    #[error("CUDA {call}: {reason}")]
    Driver {
        /// The driver or cuBLASLt call.
        call: &'static str,
        /// The error name.
        reason: String,
    },
    /// A launch, GEMM or copy the kernels do not take (wrong argument sizes, a buffer
    /// out of bounds or read before it was written), found by the checked launcher.
    #[error("GPU launch {kernel}: {reason}")]
    Launch {
        /// The kernel, GEMM or copy.
        kernel: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An op or dtype the GPU path does not implement.
    #[error("{op} on a GPU: {reason}")]
    Unsupported {
        /// The op.
        op: &'static str,
        /// What is missing.
        reason: String,
    },
    /// No usable GPU: the driver is missing, has no device, or this build lacks the
    /// `cuda` feature.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
}

/// Result alias of the CUDA backend.
pub type Result<T> = std::result::Result<T, CudaError>;
