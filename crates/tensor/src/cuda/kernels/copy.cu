// Copies of strided views by element size (bit copies, so any dtype of that width):
// `src` and `dst` are views of the same shape, walked in row-major order of that shape.
// A contiguous destination view with an element offset is how `cat` writes each part.
#include "prelude.cuh"

#define COPY(NAME, T)                                                                    \
  extern "C" __global__ void NAME(const T* src, T* dst, i64 n, View vs, View vd) {       \
    HR_FOR(i, n) { dst[view_offset(vd, i)] = src[view_offset(vs, i)]; }                  \
  }

COPY(copy_strided_b8, u64)
COPY(copy_strided_b4, u32)
COPY(copy_strided_b2, u16)
COPY(copy_strided_b1, u8)

// Fills `n` 4-byte elements with one bit pattern (zeros, or a float constant).
extern "C" __global__ void fill_b4(u32* dst, i64 n, u32 bits) {
  HR_FOR(i, n) { dst[i] = bits; }
}
