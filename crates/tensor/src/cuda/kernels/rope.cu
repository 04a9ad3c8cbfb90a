// Wan's 3-axis RoPE on `[tokens, heads, head_dim]` (f32, in place) with interleaved pairs:
// the first t_pairs pairs rotate by the frame, the next h_pairs by the row, the rest by
// the column. `cos`/`sin` are the CPU RopeTable's: per axis `[max_positions, pairs]`,
// axes concatenated. `pos` is `[tokens, 3]` (frame, row, column). One thread per pair.
#include "prelude.cuh"

extern "C" __global__ void rope_f32(float* x, const float* cos_t, const float* sin_t,
                                    const i32* pos, i64 tokens, i64 heads, i64 head_dim,
                                    i64 max_positions, i64 t_pairs, i64 h_pairs) {
  i64 pairs = head_dim / 2;
  HR_FOR(i, tokens * heads * pairs) {
    i64 j = i % pairs;
    i64 token = i / (heads * pairs);
    int axis = j < t_pairs ? 0 : (j < t_pairs + h_pairs ? 1 : 2);
    i64 before = axis == 0 ? 0 : (axis == 1 ? t_pairs : t_pairs + h_pairs);
    i64 axis_pairs = axis == 0 ? t_pairs : (axis == 1 ? h_pairs : pairs - t_pairs - h_pairs);
    i64 p = pos[token * 3 + axis];
    i64 at = before * max_positions + p * axis_pairs + (j - before);
    float c = cos_t[at], s = sin_t[at];
    float* v = x + i * 2;
    float a = v[0], b = v[1];
    v[0] = a * c - b * s;
    v[1] = a * s + b * c;
  }
}
