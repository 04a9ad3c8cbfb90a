//! Compute kernels on plain contiguous f32 buffers. They know nothing of tensors,
//! dtypes or allocators: the op layer checks shapes, takes every buffer (outputs and
//! scratch) from the allocator, and calls them.

pub mod activation;
pub mod attention;
pub mod conv;
pub mod cpu;
pub mod gelu;
pub mod gemm;
pub mod matrix;
pub mod resample;
pub mod rope;
pub mod simd;
pub mod softmax;
#[cfg(test)]
mod test_rng;
