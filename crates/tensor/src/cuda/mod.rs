//! The CUDA backend of the tensor runtime.
//!
//! Always built (no GPU, driver or toolkit needed): the kernel sources (`kernels/*.cu`,
//! embedded with `include_str!`), NVRTC loaded at run time, the compile of every module
//! for an arch with ptxas's register / spill / shared-memory report, and the on-disk
//! cubin cache. This is what `headroom cuda kernels` and the compile test use.
//!
//! Also always built: the [`launch::Launcher`] interface that the GPU side of every
//! tensor op ([`crate::ops::dispatch`]) launches on, and the [`check::CheckedLauncher`]
//! that validates those launches against the cubins' parameter tables on a machine
//! without a GPU.
//!
//! Behind the `cuda` feature: loading the cubins on a device and launching them
//! (`backend`), cuBLASLt GEMM, and the `runtime::CudaRuntime` launcher. The op-level
//! GPU-vs-host self-test is [`crate::ops::selftest`].

#[cfg(feature = "cuda")]
pub mod backend;
pub mod cache;
pub mod check;
pub mod compile;
pub mod cubin;
pub mod error;
#[cfg(feature = "cuda")]
pub mod gemm;
pub mod launch;
pub mod modules;
pub mod nvrtc;
pub mod ptxas;
#[cfg(feature = "cuda")]
pub mod runtime;

pub use cache::DiskCache;
pub use compile::{compile_all, compile_module, CompiledModule, KernelStats};
pub use error::{CudaError, Result};
pub use modules::{KernelModule, Op, MODULES};
pub use nvrtc::Nvrtc;
