// Reductions of `[outer, n, inner]` over the middle axis in f64 (sum, mean) or f32 (max):
// along the last axis (inner == 1) one block per row; otherwise one thread per output,
// reading neighbouring `inner` positions together.
#include "prelude.cuh"

extern "C" __global__ void __launch_bounds__(256) sum_rows_f32(const float* x, float* out,
                                                               i64 rows, i64 n, double scale) {
  __shared__ double scratch[32];
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    double s = 0.0;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) s += (double)x[row * n + j];
    s = block_sum_f64(s, scratch);
    if (threadIdx.x == 0) out[row] = (float)(s * scale);
  }
}

extern "C" __global__ void __launch_bounds__(256) max_rows_f32(const float* x, float* out,
                                                               i64 rows, i64 n) {
  __shared__ float scratch[32];
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    float m = -HR_INF;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, x[row * n + j]);
    m = block_max(m, scratch);
    if (threadIdx.x == 0) out[row] = m;
  }
}

extern "C" __global__ void sum_axis_f32(const float* x, float* out, i64 outer, i64 n, i64 inner,
                                        double scale) {
  HR_FOR(i, outer * inner) {
    i64 o = i / inner, p = i % inner;
    double s = 0.0;
    for (i64 k = 0; k < n; ++k) s += (double)x[(o * n + k) * inner + p];
    out[i] = (float)(s * scale);
  }
}

extern "C" __global__ void max_axis_f32(const float* x, float* out, i64 outer, i64 n, i64 inner) {
  HR_FOR(i, outer * inner) {
    i64 o = i / inner, p = i % inner;
    float m = -HR_INF;
    for (i64 k = 0; k < n; ++k) m = fmaxf(m, x[(o * n + k) * inner + p]);
    out[i] = m;
  }
}
