//! The `vdpbf16ps` path (AVX512_BF16 without AMX): placeholder module until its
//! micro-kernel lands; bf16 GEMM on this path goes through bf16-rounded operands and the
//! `gemm` crate (see [`crate::kernels::gemm::gemm`]).
