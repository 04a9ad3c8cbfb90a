// Flash-style attention, out = softmax(scale Q K^T + mask) V per head, never forming the
// score matrix. Tensor-core path: bf16 Q/K/V, f32 accumulation with mma.sync m16n8k16
// (sm_80+), 4 warps per block each owning 16 query rows of a 64-row tile; key tiles of
// 64 are staged in shared memory (K row-major, V transposed so both mma B operands are
// 32-bit loads), 35 KiB for head_dim 128 whatever the sequence lengths. Online softmax in
// base 2 (scale pre-multiplied by log2 e); the block-causal mask (query i sees key j iff
// j / block_len <= (q_start + i) / block_len) bounds the key loop of each tile and masks
// inside it. A row that sees no key writes zeros. `attention_f32` is the exact f32
// fallback for any head_dim <= 256: one warp per query row.
#include "prelude.cuh"

struct Attn {
  i64 q_len, kv_len;
  i64 block_len, q_start;  // block_len 0: no mask
  float scale_log2;        // scale * log2(e)
  i64 q_batch, q_tok, q_head;
  i64 k_batch, k_tok, k_head;
  i64 v_batch, v_tok, v_head;
  i64 o_batch, o_tok, o_head;
};

// Keys 0..visible(row) are seen by query row `row` (relative to q_start).
__device__ __forceinline__ i64 visible(const Attn& a, i64 row) {
  if (a.block_len == 0) return a.kv_len;
  i64 end = ((a.q_start + row) / a.block_len + 1) * a.block_len;
  return end < a.kv_len ? end : a.kv_len;
}

__device__ __forceinline__ void mma_bf16(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#define BQ 64
#define BKV 64

template <int D>
__device__ __forceinline__ void attention_mma(const u16* q, const u16* k, const u16* v,
                                              float* out, const Attn& a) {
  __shared__ __align__(16) u16 Ks[BKV][D + 8];
  __shared__ __align__(16) u16 Vt[D][BKV + 8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const i64 b = blockIdx.z, h = blockIdx.y;
  const i64 tile0 = (i64)blockIdx.x * BQ;
  const i64 r0 = tile0 + warp * 16 + g, r1 = r0 + 8;
  q += b * a.q_batch + h * a.q_head;
  k += b * a.k_batch + h * a.k_head;
  v += b * a.v_batch + h * a.v_head;
  out += b * a.o_batch + h * a.o_head;

  u32 qf[D / 16][4];
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    int c0 = kc * 16 + 2 * t, c1 = c0 + 8;
    qf[kc][0] = r0 < a.q_len ? *(const u32*)(q + r0 * a.q_tok + c0) : 0u;
    qf[kc][1] = r1 < a.q_len ? *(const u32*)(q + r1 * a.q_tok + c0) : 0u;
    qf[kc][2] = r0 < a.q_len ? *(const u32*)(q + r0 * a.q_tok + c1) : 0u;
    qf[kc][3] = r1 < a.q_len ? *(const u32*)(q + r1 * a.q_tok + c1) : 0u;
  }
  float o[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m[2] = {-HR_INF, -HR_INF}, l[2] = {0.0f, 0.0f};
  const i64 vis0 = visible(a, r0), vis1 = visible(a, r1);
  i64 last = tile0 + BQ - 1 < a.q_len - 1 ? tile0 + BQ - 1 : a.q_len - 1;
  const i64 kv_end = visible(a, last);

  for (i64 kv0 = 0; kv0 < kv_end; kv0 += BKV) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < BKV * (D / 2); idx += blockDim.x) {
      int row = idx / (D / 2), c2 = (idx % (D / 2)) * 2;
      i64 j = kv0 + row;
      u32 kk = j < a.kv_len ? *(const u32*)(k + j * a.k_tok + c2) : 0u;
      u32 vv = j < a.kv_len ? *(const u32*)(v + j * a.v_tok + c2) : 0u;
      *(u32*)&Ks[row][c2] = kk;
      Vt[c2][row] = (u16)(vv & 0xffffu);
      Vt[c2 + 1][row] = (u16)(vv >> 16);
    }
    __syncthreads();

    float s[BKV / 8][4];
#pragma unroll
    for (int nt = 0; nt < BKV / 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) {
        u32 b0 = *(const u32*)&Ks[nt * 8 + g][kc * 16 + 2 * t];
        u32 b1 = *(const u32*)&Ks[nt * 8 + g][kc * 16 + 8 + 2 * t];
        mma_bf16(s[nt], qf[kc], b0, b1);
      }
    }
    float mx[2] = {-HR_INF, -HR_INF};
#pragma unroll
    for (int nt = 0; nt < BKV / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        i64 col = kv0 + nt * 8 + 2 * t + (e & 1);
        bool ok = col < (e < 2 ? vis0 : vis1);
        s[nt][e] = ok ? s[nt][e] * a.scale_log2 : -HR_INF;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
      }
    }
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      float mn = fmaxf(m[r], mx[r]);
      base[r] = mn == -HR_INF ? 0.0f : mn;
      alpha[r] = exp2f(m[r] - base[r]);
      m[r] = mn;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      o[d][0] *= alpha[0];
      o[d][1] *= alpha[0];
      o[d][2] *= alpha[1];
      o[d][3] *= alpha[1];
    }
#pragma unroll
    for (int nt = 0; nt < BKV / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - base[e >> 1]);
        l[e >> 1] += s[nt][e];
      }
    }
#pragma unroll
    for (int kc = 0; kc < BKV / 16; ++kc) {
      u32 pa[4];
      pa[0] = pack_bf16x2(s[2 * kc][0], s[2 * kc][1]);
      pa[1] = pack_bf16x2(s[2 * kc][2], s[2 * kc][3]);
      pa[2] = pack_bf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]);
      pa[3] = pack_bf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        u32 b0 = *(const u32*)&Vt[d * 8 + g][kc * 16 + 2 * t];
        u32 b1 = *(const u32*)&Vt[d * 8 + g][kc * 16 + 8 + 2 * t];
        mma_bf16(o[d], pa, b0, b1);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    l[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
  }
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    int c = d * 8 + 2 * t;
    if (r0 < a.q_len) {
      out[r0 * a.o_tok + c] = o[d][0] * l[0];
      out[r0 * a.o_tok + c + 1] = o[d][1] * l[0];
    }
    if (r1 < a.q_len) {
      out[r1 * a.o_tok + c] = o[d][2] * l[1];
      out[r1 * a.o_tok + c + 1] = o[d][3] * l[1];
    }
  }
}

// grid (ceil(q_len / 64), heads, batch), 128 threads; head vectors contiguous, token and
// head strides even (32-bit loads).
extern "C" __global__ void __launch_bounds__(128) attention_bf16_d64(const u16* q, const u16* k,
                                                                     const u16* v, float* out,
                                                                     Attn a) {
  attention_mma<64>(q, k, v, out, a);
}

extern "C" __global__ void __launch_bounds__(128) attention_bf16_d128(const u16* q, const u16* k,
                                                                      const u16* v, float* out,
                                                                      Attn a) {
  attention_mma<128>(q, k, v, out, a);
}

// f32 fallback: grid (ceil(q_len / 4), heads, batch), 128 threads = 4 rows; head_dim <= 256.
extern "C" __global__ void __launch_bounds__(128) attention_f32(const float* q, const float* k,
                                                                const float* v, float* out,
                                                                Attn a, i32 head_dim) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const i64 row = (i64)blockIdx.x * 4 + warp;
  if (row >= a.q_len) return;
  const i64 b = blockIdx.z, h = blockIdx.y;
  q += b * a.q_batch + h * a.q_head + row * a.q_tok;
  k += b * a.k_batch + h * a.k_head;
  v += b * a.v_batch + h * a.v_head;
  out += b * a.o_batch + h * a.o_head + row * a.o_tok;
  float qv[8], acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    int d = lane + 32 * i;
    qv[i] = d < head_dim ? q[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -HR_INF, l = 0.0f;
  const i64 vis = visible(a, row);
  for (i64 j = 0; j < vis; ++j) {
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int d = lane + 32 * i;
      if (d < head_dim) dot += qv[i] * k[j * a.k_tok + d];
    }
    float s = warp_sum(dot) * a.scale_log2;
    float mn = fmaxf(m, s);
    float alpha = exp2f(m - mn), p = exp2f(s - mn);
    l = l * alpha + p;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int d = lane + 32 * i;
      if (d < head_dim) acc[i] = acc[i] * alpha + p * v[j * a.v_tok + d];
    }
    m = mn;
  }
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    int d = lane + 32 * i;
    if (d < head_dim) out[d] = acc[i] * inv;
  }
}
