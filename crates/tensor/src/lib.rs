//! headroom's tensor runtime: tensors whose bytes come from headroom's allocator, CPU
//! kernels at GEMM speed, meta (shape-only) execution on a `sim` platform, and
//! deterministic results for a given thread count.
#![warn(missing_docs, missing_debug_implementations)]

pub mod dtype;
pub mod kernels;
pub mod parallel;
