//! The CUDA backend of the tensor runtime.
//!
//! Always built (no GPU, driver or toolkit needed): the kernel sources (`kernels/*.cu`,
//! embedded with `include_str!`), NVRTC loaded at run time, the compile of every module
//! for an arch with ptxas's register / spill / shared-memory report, and the on-disk
//! cubin cache. This is what `headroom cuda kernels` and the compile test use.
//!
//! Behind the `cuda` feature: loading the cubins on a device and launching them
//! ([`backend`]), cuBLASLt GEMM, and streams and events.

#[cfg(feature = "cuda")]
pub mod backend;
pub mod cache;
pub mod compile;
pub mod error;
#[cfg(feature = "cuda")]
pub mod gemm;
pub mod modules;
pub mod nvrtc;
pub mod ptxas;
#[cfg(feature = "cuda")]
pub mod selftest;

pub use cache::DiskCache;
pub use compile::{compile_all, compile_module, CompiledModule, KernelStats};
pub use error::{CudaError, Result};
pub use modules::{KernelModule, Op, MODULES};
pub use nvrtc::Nvrtc;
