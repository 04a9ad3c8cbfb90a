// Causal 3-D convolution as an implicit GEMM in f32 (no im2col scratch):
// out[co][p] = bias[co] + sum_k w[co][k] * col[k][p], where k runs over (ci, dt, dy, dx),
// p over (batch, to, ho, wo), and col is gathered from the input on the fly with the
// causal front pad in time (zeros or copies of frame 0) and symmetric zero pad in space.
// Tiles of 64 output channels x 64 positions x 16 depth in shared memory (8 KiB), 256
// threads each owning a 4 x 4 block of the tile.
#include "prelude.cuh"

struct Conv3d {
  i64 batch, cin, t, h, w;     // input
  i64 cout, kt, kh, kw;        // weight
  i64 st, sh, sw;              // strides
  i64 pad_t, pad_h, pad_w;     // front time pad; spatial pad on both sides
  i64 ot, oh, ow;              // output dims
  i32 replicate;               // time pad copies frame 0 instead of zeros
};

#define BM 64
#define BN 64
#define BK 16

__device__ __forceinline__ float gather(const float* x, const Conv3d& c, i64 k, i64 p) {
  i64 taps = c.kt * c.kh * c.kw;
  i64 ci = k / taps, r = k % taps;
  i64 dt = r / (c.kh * c.kw), dy = (r / c.kw) % c.kh, dx = r % c.kw;
  i64 xo = p % c.ow, yo = (p / c.ow) % c.oh, to = (p / (c.ow * c.oh)) % c.ot;
  i64 b = p / (c.ow * c.oh * c.ot);
  i64 ti = to * c.st + dt - c.pad_t;
  i64 yi = yo * c.sh + dy - c.pad_h;
  i64 xi = xo * c.sw + dx - c.pad_w;
  if (ti < 0) {
    if (!c.replicate) return 0.0f;
    ti = 0;
  }
  if (yi < 0 || yi >= c.h || xi < 0 || xi >= c.w) return 0.0f;
  return x[(((b * c.cin + ci) * c.t + ti) * c.h + yi) * c.w + xi];
}

extern "C" __global__ void __launch_bounds__(256) conv3d_f32(const float* x, const float* wgt,
                                                             const float* bias, float* out,
                                                             Conv3d c) {
  __shared__ float As[BK][BM];
  __shared__ float Bs[BK][BN];
  i64 K = c.cin * c.kt * c.kh * c.kw;
  i64 P = c.batch * c.ot * c.oh * c.ow;
  i64 co0 = (i64)blockIdx.y * BM, p0 = (i64)blockIdx.x * BN;
  int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  for (i64 k0 = 0; k0 < K; k0 += BK) {
    for (int l = threadIdx.x; l < BK * BM; l += blockDim.x) {
      int kk = l % BK, m = l / BK;
      i64 co = co0 + m, k = k0 + kk;
      As[kk][m] = (co < c.cout && k < K) ? wgt[co * K + k] : 0.0f;
    }
    for (int l = threadIdx.x; l < BK * BN; l += blockDim.x) {
      int nn = l % BN, kk = l / BN;
      i64 p = p0 + nn, k = k0 + kk;
      Bs[kk][nn] = (p < P && k < K) ? gather(x, c, k, p) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[4], b[4];
      for (int i = 0; i < 4; ++i) a[i] = As[kk][ty * 4 + i];
      for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx * 4 + j];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
  i64 plane = c.ot * c.oh * c.ow;
  for (int i = 0; i < 4; ++i) {
    i64 co = co0 + ty * 4 + i;
    if (co >= c.cout) continue;
    float bv = bias ? bias[co] : 0.0f;
    for (int j = 0; j < 4; ++j) {
      i64 p = p0 + tx * 4 + j;
      if (p >= P) continue;
      i64 b = p / plane, q = p % plane;
      out[(b * c.cout + co) * plane + q] = acc[i][j] + bv;
    }
  }
}
