// Elementwise ops in f32: binary with NumPy broadcasting (operands as strided views of the
// output shape, stride 0 on broadcast axes), a contiguous fast path, and unary activations.
#include "prelude.cuh"

#define BINARY(NAME, EXPR)                                                               \
  extern "C" __global__ void NAME##_f32(const float* a, const float* b, float* out, i64 n, \
                                        View va, View vb) {                              \
    HR_FOR(i, n) {                                                                       \
      float x = a[view_offset(va, i)], y = b[view_offset(vb, i)];                        \
      out[i] = (EXPR);                                                                   \
    }                                                                                    \
  }                                                                                      \
  extern "C" __global__ void NAME##_contig_f32(const float* a, const float* b, float* out, \
                                               i64 n) {                                  \
    HR_FOR(i, n) {                                                                       \
      float x = a[i], y = b[i];                                                          \
      out[i] = (EXPR);                                                                   \
    }                                                                                    \
  }

BINARY(add, x + y)
BINARY(sub, x - y)
BINARY(mul, x * y)
BINARY(div, x / y)

#define UNARY(NAME, EXPR)                                                             \
  extern "C" __global__ void NAME##_f32(const float* in, float* out, i64 n) {         \
    HR_FOR(i, n) {                                                                    \
      float x = in[i];                                                                \
      out[i] = (EXPR);                                                                \
    }                                                                                 \
  }

UNARY(exp, expf(x))
UNARY(sin, sinf(x))
UNARY(cos, cosf(x))
UNARY(sqrt, sqrtf(x))
UNARY(rsqrt, 1.0f / sqrtf(x))
UNARY(silu, x / (1.0f + expf(-x)))
UNARY(tanh, tanhf(x))
UNARY(gelu_tanh, 0.5f * x * (1.0f + tanhf(0.7978846f * (x + 0.044715f * x * x * x))))
UNARY(gelu_erf, 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)))

// out = x * scale + shift (add_scalar, mul_scalar and affine).
extern "C" __global__ void affine_f32(const float* in, float* out, i64 n, float scale,
                                      float shift) {
  HR_FOR(i, n) { out[i] = in[i] * scale + shift; }
}

// Like the CPU's f32::clamp: NaN stays NaN.
extern "C" __global__ void clamp_f32(const float* in, float* out, i64 n, float lo, float hi) {
  HR_FOR(i, n) {
    float x = in[i];
    out[i] = x < lo ? lo : (x > hi ? hi : x);
  }
}

// DiT modulation in one pass: out = x * (1 + scale) + shift, scale/shift broadcast per row
// of `dim` values (`[rows, dim]` against `[groups, dim]`, row r uses group r / rows_per_group).
extern "C" __global__ void modulate_f32(const float* x, const float* scale, const float* shift,
                                        float* out, i64 rows, i64 dim, i64 rows_per_group) {
  HR_FOR(i, rows * dim) {
    i64 r = i / dim, c = i % dim, g = r / rows_per_group;
    out[i] = x[i] * (1.0f + scale[g * dim + c]) + shift[g * dim + c];
  }
}
