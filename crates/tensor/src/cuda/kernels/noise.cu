// The counter-based normal generator of `ops::random` (splitmix64 hash of (seed, counter
// pair), Box-Muller in f64), bit for bit. The f64 math uses no library function: ln, sin
// and cos are the same polynomial code as the CPU's `portable_ln` / `portable_sincos_turns`,
// and this module is compiled with --fmad=false so no multiply-add is contracted; every
// remaining operation (+, -, *, /, sqrt, int <-> double) is IEEE correctly rounded on both.
#include "prelude.cuh"

__device__ __forceinline__ u64 splitmix64(u64 z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// ln(x) for finite x > 0 (see random.rs for the derivation).
__device__ double portable_ln(double x) {
  const double LN2_HI = 0.6931471803691238;
  const double LN2_LO = 1.9082149292705877e-10;
  i64 bits = __double_as_longlong(x);
  i64 k = 0;
  if ((bits >> 52) == 0) {  // subnormal: scale into the normal range
    x *= 18014398509481984.0;  // 2^54
    bits = __double_as_longlong(x);
    k = -54;
  }
  k += ((bits >> 52) & 0x7ff) - 1023;
  bits = (bits & 0x000fffffffffffffll) | 0x3ff0000000000000ll;  // m in [1, 2)
  double m = __longlong_as_double(bits);
  if (m > 1.4142135623730951) {
    m = m * 0.5;
    k += 1;
  }
  double f = m - 1.0;
  double s = f / (2.0 + f);
  double z = s * s;
  double r = z * (0.6666666666666666 +
                  z * (0.4 + z * (0.2857142857142857 +
                                  z * (0.2222222222222222 +
                                       z * (0.18181818181818182 +
                                            z * (0.15384615384615385 +
                                                 z * (0.13333333333333333 +
                                                      z * (0.11764705882352941 +
                                                           z * (0.10526315789473684 +
                                                                z * 0.09523809523809523)))))))));
  double hfsq = 0.5 * f * f;
  double dk = (double)k;
  return dk * LN2_HI + (f - (hfsq - (s * (hfsq + r) + dk * LN2_LO)));
}

// sin and cos of 2*pi*t for t in [-1/8, 1/8] (|x| <= pi/4), Taylor to x^21 / x^20.
__device__ void sincos_small(double t, double* s, double* c) {
  const double TWO_PI_HI = 6.283185307179586;
  const double TWO_PI_LO = 2.4492935982947064e-16;
  double x = t * TWO_PI_HI + t * TWO_PI_LO;
  double z = x * x;
  double ps = -1.0 / 6.0 + z * (1.0 / 120.0 + z * (-1.0 / 5040.0 + z * (1.0 / 362880.0 +
              z * (-1.0 / 39916800.0 + z * (1.0 / 6227020800.0 + z * (-1.0 / 1307674368000.0 +
              z * (1.0 / 355687428096000.0 + z * (-1.0 / 121645100408832000.0 +
              z * (1.0 / 51090942171709440000.0)))))))));
  double pc = 1.0 / 24.0 + z * (-1.0 / 720.0 + z * (1.0 / 40320.0 + z * (-1.0 / 3628800.0 +
              z * (1.0 / 479001600.0 + z * (-1.0 / 87178291200.0 + z * (1.0 / 20922789888000.0 +
              z * (-1.0 / 6402373705728000.0 + z * (1.0 / 2432902008176640000.0 +
              z * (-1.0 / 1124000727777607680000.0)))))))));
  *s = x + x * (z * ps);
  *c = 1.0 - (0.5 * z - z * (z * pc));
}

// sin and cos of 2*pi*u where u = n / 2^32, n a u32: exact quadrant reduction on n.
__device__ void sincos_turns(u32 n, double* s, double* c) {
  u32 q = n >> 30;
  u32 rem = n & 0x3fffffffu;
  double t = (double)rem / 4294967296.0;  // [0, 1/4)
  if (rem >= 0x20000000u) {
    t -= 0.25;
    q += 1;
  }
  double sx, cx;
  sincos_small(t, &sx, &cx);
  switch (q & 3u) {
    case 0: *s = sx; *c = cx; break;
    case 1: *s = cx; *c = -sx; break;
    case 2: *s = -sx; *c = -cx; break;
    default: *s = -cx; *c = sx; break;
  }
}

__device__ float normal_at(u64 seed, u64 counter) {
  u64 pair = counter / 2;
  u64 bits = splitmix64(splitmix64(seed) ^ (pair * 0xD1B54A32D192ED03ull));
  double u1 = ((double)(bits >> 32) + 1.0) / 4294967296.0;
  double r = sqrt(-2.0 * portable_ln(u1));
  double s, c;
  sincos_turns((u32)(bits & 0xffffffffull), &s, &c);
  return (float)((counter % 2 == 0) ? r * c : r * s);
}

// out[i] = normal_at(seed, offset + i) for i < n.
extern "C" __global__ void randn_f32(float* out, i64 n, u64 seed, u64 offset) {
  HR_FOR(i, n) { out[i] = normal_at(seed, offset + (u64)i); }
}
