"""Fits the division-free tanh-GELU of crates/tensor/src/kernels/gelu.rs and prints its
coefficient table: on each of 16 intervals of 0.75 over (-6, 6) a degree-6 polynomial in
r = t - floor(t), t = (x + 6) * 4/3, for the factor 0.5 * (1 + tanh(sqrt(2/pi) * (x +
0.044715 x^3))), least squares on 200 Chebyshev nodes per interval in f64, rounded to
f32. Prints the worst error of x * p(r) evaluated in f32 against the f64 GELU.

Run: ~/.headroom-reference/bin/python tools/fit_gelu.py
"""
import numpy as np

HI, N, DEG = 6.0, 16, 6
W = 2 * HI / N


def factor(x):
    return 0.5 * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def fit():
    c = np.zeros((DEG + 1, N))
    k = np.arange(200)
    r = 0.5 - 0.5 * np.cos(np.pi * (k + 0.5) / 200)
    for i in range(N):
        v = np.vander(r, DEG + 1, increasing=True)
        c[:, i], *_ = np.linalg.lstsq(v, factor(-HI + (i + r) * W), rcond=None)
    return c.astype(np.float32)


def evaluate(c, x):
    t = np.float32(x + np.float32(HI)) * np.float32(1 / W)
    i = np.minimum(t.astype(np.int64), N - 1)
    r = np.float32(t - i.astype(np.float32))
    p = c[-1][i]
    for k in range(DEG - 1, -1, -1):
        p = np.float32(np.float32(p * r) + c[k][i])
    return np.float32(x * p)


c = fit()
x = np.linspace(-5.999, 5.999, 2_000_001).astype(np.float32)
err = np.abs(evaluate(c, x) - x.astype(np.float64) * factor(x.astype(np.float64)))
print(f"// worst |error| {err.max():.3e} over (-6, 6)")
print(f"const GELU_COEFFS: [[f32; {N}]; {DEG + 1}] = [")
for row in c:
    print("    [" + ", ".join(str(np.float32(v)) for v in row) + "],")
print("];")
