//! headroom's tensor runtime: tensors whose bytes come from headroom's allocator, CPU
//! kernels at GEMM speed, meta (shape-only) execution on a `sim` platform, and
//! deterministic results for a given thread count.
//!
//! The trade-off: a small op set made for the Wan networks rather than a general
//! framework. Every byte comes from the allocator and results repeat bit for bit, at the
//! price of writing and proving the kernels here.
#![warn(missing_docs, missing_debug_implementations)]

pub mod comm;
pub mod compare;
pub mod cuda;
pub mod device;
pub mod dtype;
pub mod error;
pub mod float8;
pub mod io;
pub mod kernels;
pub mod layout;
pub mod ops;
pub mod parallel;
pub mod profile;
pub mod storage;
pub mod tensor;

pub use device::Device;
pub use dtype::{DType, Element};
pub use error::{Result, TensorError};
pub use layout::Layout;
pub use tensor::Tensor;
