//! Tensor operations: shape checks, output allocation from the device's allocator, and
//! calls into the kernels. On a meta device every op checks shapes and allocates the
//! same sizes in the same order, and computes nothing.

pub mod attention;
pub mod conv;
pub(crate) mod copy;
pub mod elementwise;
pub mod fused;
pub mod matmul;
pub mod norm;
pub mod packed;
pub mod pixels;
pub mod random;
pub mod reduce;
pub mod resample;

use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// The f32 form of a float tensor (itself when already f32; strides kept), or a dtype
/// error naming `op`: how ops read their float inputs.
pub(crate) fn float_f32(op: &'static str, t: &Tensor) -> Result<Tensor> {
    t.require_float(op)?;
    t.to_dtype(DType::F32)
}
