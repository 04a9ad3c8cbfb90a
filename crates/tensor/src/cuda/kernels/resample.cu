// Resampling and padding (f32, contiguous): nearest x2 upsampling of the last two axes,
// pixel shuffle / unshuffle (`[B, C r^2, H, W]` <-> `[B, C, H r, W r]`), and zero or
// replicate padding of up to HR_MAX_RANK axes. One thread per output element.
#include "prelude.cuh"

extern "C" __global__ void upsample_nearest2x_f32(const float* in, float* out, i64 planes, i64 h,
                                                  i64 w) {
  i64 oh = 2 * h, ow = 2 * w;
  HR_FOR(i, planes * oh * ow) {
    i64 x = i % ow, y = (i / ow) % oh, p = i / (oh * ow);
    out[i] = in[(p * h + y / 2) * w + x / 2];
  }
}

// out[b, c, y r + i, x r + j] = in[b, c r^2 + i r + j, y, x]
extern "C" __global__ void pixel_shuffle_f32(const float* in, float* out, i64 bc, i64 h, i64 w,
                                             i64 r) {
  i64 oh = h * r, ow = w * r;
  HR_FOR(o, bc * oh * ow) {
    i64 xx = o % ow, yy = (o / ow) % oh, p = o / (oh * ow);
    i64 x = xx / r, j = xx % r, y = yy / r, i = yy % r;
    out[o] = in[((p * r * r + i * r + j) * h + y) * w + x];
  }
}

// out[b, c r^2 + i r + j, y, x] = in[b, c, y r + i, x r + j]
extern "C" __global__ void pixel_unshuffle_f32(const float* in, float* out, i64 bc, i64 h, i64 w,
                                               i64 r) {
  i64 ih = h * r, iw = w * r;
  HR_FOR(o, bc * r * r * h * w) {
    i64 x = o % w, y = (o / w) % h, q = o / (h * w);
    i64 p = q / (r * r), ij = q % (r * r), i = ij / r, j = ij % r;
    out[o] = in[(p * ih + y * r + i) * iw + x * r + j];
  }
}

// Padding: `in_shape` (in `vin.shape`) padded by `before[d]` in front of each axis to
// `vout.shape`; `replicate` != 0 copies the nearest edge value instead of writing zeros.
extern "C" __global__ void pad_f32(const float* in, float* out, i64 n, View vin, View vout,
                                   i32 replicate) {
  HR_FOR(o, n) {
    i64 rest = o, src = 0, mul = 1;
    bool inside = true;
#pragma unroll
    for (int d = HR_MAX_RANK - 1; d >= 0; --d) {
      if (d >= vout.rank) continue;
      i64 idx = rest % vout.shape[d];
      rest /= vout.shape[d];
      i64 s = idx - vin.stride[d];  // vin.stride carries the front pad of each axis
      if (s < 0 || s >= vin.shape[d]) {
        inside = false;
        s = s < 0 ? 0 : vin.shape[d] - 1;
      }
      src += s * mul;
      mul *= vin.shape[d];
    }
    out[o] = (inside || replicate) ? in[src] : 0.0f;
  }
}
