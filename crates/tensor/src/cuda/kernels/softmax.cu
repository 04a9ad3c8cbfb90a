// Softmax over the last axis of `[rows, n]` (f32): one block per row, max then sum of
// exp(x - max) in f32, both as block reductions; the row is read three times from L2.
#include "prelude.cuh"

extern "C" __global__ void __launch_bounds__(256) softmax_f32(const float* x, float* y, i64 rows,
                                                              i64 n) {
  __shared__ float scratch[32];
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* in = x + row * n;
    float* out = y + row * n;
    float m = -HR_INF;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, in[j]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) s += expf(in[j] - m);
    s = block_sum(s, scratch);
    float inv = 1.0f / s;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) out[j] = expf(in[j] - m) * inv;
  }
}
