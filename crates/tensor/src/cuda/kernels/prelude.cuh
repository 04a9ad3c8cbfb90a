// headroom's CUDA prelude: fixed-width types, bf16/f16 conversions and block reductions
// without any CUDA header, so a kernel module needs nothing but libnvrtc to compile.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef long long i64;
typedef unsigned long long u64;

#define HR_INF __int_as_float(0x7f800000)
#define HR_MAX_RANK 6

// bf16 -> f32 is exact: the bf16 bits are the top half of the f32.
__device__ __forceinline__ float bf16_to_f32(u16 v) { return __uint_as_float(((u32)v) << 16); }

// f32 -> bf16, round to nearest even; NaN stays a quiet NaN (as the `half` crate does).
__device__ __forceinline__ u16 f32_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}

__device__ __forceinline__ float f16_to_f32(u16 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
  return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// Two f32 as one register of two bf16 (low half = first), the mma.sync operand form.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  return ((u32)f32_to_bf16(hi) << 16) | (u32)f32_to_bf16(lo);
}

// A strided view: shape and element strides per axis (rank <= HR_MAX_RANK), passed by value.
struct View {
  i32 rank;
  i64 shape[HR_MAX_RANK];
  i64 stride[HR_MAX_RANK];
};

// Element offset of the `linear`-th element (row-major over `shape`) of view `v`.
__device__ __forceinline__ i64 view_offset(const View& v, i64 linear) {
  // Unrolled with constant indices so the view stays in registers (a dynamic index would
  // copy it to a local-memory stack frame).
  i64 off = 0;
#pragma unroll
  for (int d = HR_MAX_RANK - 1; d >= 0; --d) {
    if (d < v.rank) {
      i64 n = v.shape[d];
      i64 i = linear % n;
      linear /= n;
      off += i * v.stride[d];
    }
  }
  return off;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the total.
// `scratch` holds 32 doubles of shared memory.
__device__ __forceinline__ double block_sum_f64(double v, double* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum_f64(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double t = lane < warps ? scratch[lane] : 0.0;
  return warp_sum_f64(t);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : -HR_INF;
  return warp_max(t);
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(t);
}

// A grid-stride loop over `n` elements.
#define HR_FOR(i, n) \
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)
