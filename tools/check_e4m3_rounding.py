"""The CUDA kernels' f32 -> float8_e4m3fn rounding (`f32_to_e4m3_sat` in
crates/tensor/src/cuda/kernels/quant.cu), written again in numpy step for step, against
PyTorch's own cast on every f32 bit pattern near the ends of [0, 448) and 20 M random ones
between (the kernel saturates at 448, where PyTorch gives NaN; the row scales never reach it).

    ~/.headroom-reference/bin/python tools/check_e4m3_rounding.py
    -> mismatches 0 of 22097152

It checks the algorithm, not the compiled kernel: that runs on a GPU in `headroom cuda
selftest`.
"""

import numpy as np
import torch


def kernel_rounding(a: np.ndarray) -> np.ndarray:
    """The kernel's code bits for f32 magnitudes `a` in [0, 448)."""
    out = np.zeros(a.shape, np.int64)
    # Below the smallest normal (2^-6): a multiple of 2^-9, rounded to nearest even.
    sub = a < np.float32(0.015625)
    out[sub] = np.rint(a[sub] * np.float32(512)).astype(np.int64)
    n = ~sub
    an = a[n]
    e = ((an.view(np.uint32) >> 23) & 0xFF).astype(np.int64) - 127
    # a / 2^e in [1, 2) times 8, exactly (a power-of-two scale), rounded to nearest even.
    scale = ((127 + 3 - e) << 23).astype(np.uint32).view(np.float32)
    q = np.rint(an * scale)
    carry = q >= 16
    q[carry] = 8
    e[carry] += 1
    out[n] = ((e + 7) << 3) | (q.astype(np.int64) - 8)
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    hi = np.float32(448).view(np.uint32)
    bits = np.concatenate(
        [
            rng.integers(0, hi, 20_000_000, dtype=np.uint32),
            np.arange(0, 1 << 20, dtype=np.uint32),
            np.arange(hi - (1 << 20), hi, dtype=np.uint32),
        ]
    )
    a = bits.view(np.float32)
    ours = kernel_rounding(a)
    ref = torch.from_numpy(a).to(torch.float8_e4m3fn).view(torch.uint8).numpy().astype(np.int64)
    print("mismatches", int((ours != ref).sum()), "of", len(a))


if __name__ == "__main__":
    main()
