// dtype casts (contiguous): f32 <-> bf16 / f16 with round to nearest even, u8 -> f32, and
// video values in [-1, 1] to u8 pixels (round half to even, as torch.round).
#include "prelude.cuh"

extern "C" __global__ void f32_to_bf16(const float* in, u16* out, i64 n) {
  HR_FOR(i, n) { out[i] = f32_to_bf16(in[i]); }
}
extern "C" __global__ void bf16_to_f32(const u16* in, float* out, i64 n) {
  HR_FOR(i, n) { out[i] = bf16_to_f32(in[i]); }
}
extern "C" __global__ void f32_to_f16(const float* in, u16* out, i64 n) {
  HR_FOR(i, n) { out[i] = f32_to_f16(in[i]); }
}
extern "C" __global__ void f16_to_f32(const u16* in, float* out, i64 n) {
  HR_FOR(i, n) { out[i] = f16_to_f32(in[i]); }
}
extern "C" __global__ void u8_to_f32(const u8* in, float* out, i64 n) {
  HR_FOR(i, n) { out[i] = (float)in[i]; }
}
extern "C" __global__ void i64_to_f32(const i64* in, float* out, i64 n) {
  HR_FOR(i, n) { out[i] = (float)in[i]; }
}
extern "C" __global__ void f32_to_pixels(const float* in, u8* out, i64 n) {
  HR_FOR(i, n) {
    float v = (in[i] + 1.0f) / 2.0f;
    v = v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v);
    out[i] = (u8)rintf(v * 255.0f);
  }
}
