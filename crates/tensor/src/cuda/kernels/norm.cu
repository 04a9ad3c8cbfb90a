// Normalisations in f32 with f64 statistics (as the CPU kernels): layer norm and RMS norm
// over the last axis (one block per row; weight/bias may be null), and Wan's channel RMS
// norm of the VAE, x / max(||x||_2 over axis 1, 1e-12) * sqrt(C) * gamma_c.
#include "prelude.cuh"

extern "C" __global__ void __launch_bounds__(256) layer_norm_f32(const float* x, const float* w,
                                                                 const float* b, float* y,
                                                                 i64 rows, i64 n, float eps) {
  __shared__ double scratch[32];
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* in = x + row * n;
    float* out = y + row * n;
    double s = 0.0;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) s += (double)in[j];
    double mean = block_sum_f64(s, scratch) / (double)n;
    double v = 0.0;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
      double d = (double)in[j] - mean;
      v += d * d;
    }
    double var = block_sum_f64(v, scratch) / (double)n;
    float inv = (float)(1.0 / sqrt(var + (double)eps));
    float meanf = (float)mean;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
      float o = (in[j] - meanf) * inv;
      if (w) o *= w[j];
      if (b) o += b[j];
      out[j] = o;
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) rms_norm_f32(const float* x, const float* w,
                                                               float* y, i64 rows, i64 n,
                                                               float eps) {
  __shared__ double scratch[32];
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* in = x + row * n;
    float* out = y + row * n;
    double s = 0.0;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) s += (double)in[j] * (double)in[j];
    double ms = block_sum_f64(s, scratch) / (double)n;
    float inv = (float)(1.0 / sqrt(ms + (double)eps));
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
      out[j] = w ? in[j] * inv * w[j] : in[j] * inv;
    }
  }
}

// `[batch, channels, inner]`: one thread per (batch, position), walking the channels with
// coalesced reads across neighbouring positions.
extern "C" __global__ void rms_norm_channels_f32(const float* x, const float* gamma, float* y,
                                                 i64 batch, i64 channels, i64 inner,
                                                 float scale) {
  HR_FOR(i, batch * inner) {
    i64 b = i / inner, p = i % inner;
    const float* in = x + b * channels * inner + p;
    float* out = y + b * channels * inner + p;
    double s = 0.0;
    for (i64 c = 0; c < channels; ++c) {
      double v = (double)in[c * inner];
      s += v * v;
    }
    float norm = fmaxf((float)sqrt(s), 1e-12f);
    for (i64 c = 0; c < channels; ++c) out[c * inner] = in[c * inner] / norm * scale * gamma[c];
  }
}
