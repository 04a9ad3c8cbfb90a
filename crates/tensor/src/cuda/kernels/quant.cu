// 8-bit linears: activations (and weights, at load) quantized per row to float8_e4m3fn or
// int8 (the GEMM's operands), 8-bit weights widened to bf16 exactly (for GPUs without fp8
// GEMMs and unaligned shapes), and the epilogue that scales the GEMM's f32 or i32 sums by
// the row's and the column's scale, adds the bias and applies tanh-GELU in place.
#include "prelude.cuh"

// |f| as float8_e4m3fn bits, rounded to nearest even and saturated at 448 (the scales
// map each row's largest magnitude to 448, so only rounding can reach past it).
__device__ __forceinline__ u8 f32_to_e4m3_sat(float f) {
  u8 sign = (u8)((__float_as_uint(f) >> 24) & 0x80u);
  float a = fabsf(f);
  if (a != a) return sign | 0x7fu;
  if (a >= 448.0f) return sign | 0x7eu;
  // Below the smallest normal (2^-6): a multiple of 2^-9 (q = 8 is 2^-6, code 0x08).
  if (a < 0.015625f) return sign | (u8)rintf(a * 512.0f);
  int e = (int)((__float_as_uint(a) >> 23) & 0xffu) - 127;
  // a / 2^e in [1, 2) times 8, exactly (a power-of-two scale), rounded to an integer.
  float q = rintf(a * __int_as_float((127 + 3 - e) << 23));
  if (q >= 16.0f) {
    q = 8.0f;
    e += 1;
  }
  return sign | (u8)(((e + 7) << 3) | ((int)q - 8));
}

// float8_e4m3fn bits -> f32, exactly (the value; the kernel `e4m3_to_f32` casts arrays).
__device__ __forceinline__ float e4m3_value(u8 b) {
  u32 e = (b >> 3) & 0xfu, m = b & 7u;
  float mag;
  if (e == 0xfu && m == 7u) {
    mag = __int_as_float(0x7fc00000);
  } else if (e == 0u) {
    mag = (float)m * (1.0f / 512.0f);
  } else {
    mag = __uint_as_float(((e + 120u) << 23) | (m << 20));
  }
  return (b & 0x80u) ? -mag : mag;
}

// float8_e5m2 bits -> f32, exactly (an e5m2 value is the top byte of an f16).
__device__ __forceinline__ float e5m2_value(u8 b) { return f16_to_f32((u16)((u16)b << 8)); }

__device__ __forceinline__ float load_f32(float v) { return v; }
__device__ __forceinline__ float load_f32(u16 v) { return bf16_to_f32(v); }

// Each row of `k` values quantized with its own scale `max|x| / LIMIT`: `q = code(x · LIMIT /
// max|x|)`, `scale[row] = max|x| / LIMIT`; a row of zeros (or without a finite maximum)
// gives zero codes and scale 0. LIMIT is 448 for float8_e4m3fn codes and 127 for int8
// (rounded to nearest even, clamped to ±127, as the CPU's int8 quantizer). One block per row.
template <bool INT8, typename T>
__device__ __forceinline__ void quantize_rows(const T* x, u8* q, float* scale, i64 rows, i64 k) {
  const float limit = INT8 ? 127.0f : 448.0f;
  __shared__ float scratch[32];
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* in = x + row * k;
    u8* out = q + row * k;
    float m = 0.0f;
    for (i64 j = threadIdx.x; j < k; j += blockDim.x) m = fmaxf(m, fabsf(load_f32(in[j])));
    float amax = block_max(m, scratch);
    bool zero = !(amax > 0.0f) || amax == HR_INF;
    float inv = zero ? 0.0f : limit / amax;
    for (i64 j = threadIdx.x; j < k; j += blockDim.x) {
      float v = load_f32(in[j]) * inv;
      u8 c;
      if (zero) {
        c = 0;
      } else if (INT8) {
        c = (u8)(signed char)(int)fminf(fmaxf(rintf(v), -127.0f), 127.0f);
      } else {
        c = f32_to_e4m3_sat(v);
      }
      out[j] = c;
    }
    if (threadIdx.x == 0) scale[row] = zero ? 0.0f : amax / limit;
  }
}

extern "C" __global__ void __launch_bounds__(256) quantize_rows_e4m3_f32(const float* x, u8* q,
                                                                         float* scale, i64 rows,
                                                                         i64 k) {
  quantize_rows<false>(x, q, scale, rows, k);
}

extern "C" __global__ void __launch_bounds__(256) quantize_rows_e4m3_bf16(const u16* x, u8* q,
                                                                          float* scale,
                                                                          i64 rows, i64 k) {
  quantize_rows<false>(x, q, scale, rows, k);
}

extern "C" __global__ void __launch_bounds__(256) quantize_rows_i8_f32(const float* x, u8* q,
                                                                       float* scale, i64 rows,
                                                                       i64 k) {
  quantize_rows<true>(x, q, scale, rows, k);
}

extern "C" __global__ void __launch_bounds__(256) quantize_rows_i8_bf16(const u16* x, u8* q,
                                                                        float* scale, i64 rows,
                                                                        i64 k) {
  quantize_rows<true>(x, q, scale, rows, k);
}

// float8_e4m3fn codes widened to bf16 (exact: every e4m3 value is a bf16 value).
extern "C" __global__ void e4m3_to_bf16(const u8* in, u16* out, i64 n) {
  HR_FOR(i, n) { out[i] = f32_to_bf16(e4m3_value(in[i])); }
}

// 8-bit values widened to f32 (exact): casts of 8-bit tensors read as floats.
extern "C" __global__ void e4m3_to_f32(const u8* in, float* out, i64 n) {
  HR_FOR(i, n) { out[i] = e4m3_value(in[i]); }
}
extern "C" __global__ void e5m2_to_f32(const u8* in, float* out, i64 n) {
  HR_FOR(i, n) { out[i] = e5m2_value(in[i]); }
}
extern "C" __global__ void i8_to_f32(const signed char* in, float* out, i64 n) {
  HR_FOR(i, n) { out[i] = (float)in[i]; }
}

// int8 codes widened to bf16 (exact: |v| <= 128 fits bf16's 8 significant bits).
extern "C" __global__ void i8_to_bf16(const signed char* in, u16* out, i64 n) {
  HR_FOR(i, n) { out[i] = f32_to_bf16((float)in[i]); }
}

// float8_e5m2 codes widened to bf16 (exact: every e5m2 value is a bf16 value).
extern "C" __global__ void e5m2_to_bf16(const u8* in, u16* out, i64 n) {
  HR_FOR(i, n) { out[i] = f32_to_bf16(e5m2_value(in[i])); }
}

// In place on the `rows × n` sums of an 8-bit GEMM (f32, or i32 when `sums_i32`, each
// read as an i32 and written back as an f32): `y = act(y · row_scale[r] · col_scale[c] +
// bias[c])`. `row_scale` may be null (1), `col_scale` holds one value (`col_scales` 1) or
// one per column, `bias` may be null, `gelu` 1 applies tanh-GELU (the formula of
// `gelu_tanh_f32`).
extern "C" __global__ void scale_bias_act_f32(float* y, const float* row_scale,
                                              const float* col_scale, i64 col_scales,
                                              const float* bias, i64 rows, i64 n, i32 gelu,
                                              i32 sums_i32) {
  HR_FOR(i, rows * n) {
    i64 r = i / n, c = i % n;
    float v = sums_i32 ? (float)((const i32*)y)[i] : y[i];
    if (row_scale) v *= row_scale[r];
    v *= col_scale[col_scales == 1 ? 0 : c];
    if (bias) v += bias[c];
    if (gelu) v = 0.5f * v * (1.0f + tanhf(0.7978846f * (v + 0.044715f * v * v * v)));
    y[i] = v;
  }
}
