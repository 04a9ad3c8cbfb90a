//! Tensor operations: shape checks, output allocation from the device's allocator, and
//! calls into the kernels. On a meta device every op checks shapes and allocates the
//! same sizes in the same order, and computes nothing.

pub mod attention;
pub mod conv;
pub(crate) mod copy;
pub mod elementwise;
pub mod matmul;
pub mod norm;
pub mod pixels;
pub mod random;
pub mod reduce;
pub mod resample;
