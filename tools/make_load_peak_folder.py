#!/usr/bin/env python3
"""Write a Wan2.1-T2V-1.3B-shaped f32 transformer (seeded random weights, ~5.7 GB) to
measure peak resident memory while loading (docs/checkpoints.md).

    ~/.headroom-reference/bin/python tools/make_load_peak_folder.py OUT [--pt]

OUT/transformer/ gets diffusers' config.json and diffusion_pytorch_model.safetensors,
written tensor by tensor (never the whole model in memory). With --pt, OUT also gets
self_forcing.pt: the same weights in original Wan names under generator_ema/model.,
saved by torch.save from tensors memory-mapped from the safetensors file.
Delete OUT afterwards; nothing here is committed.
"""

import json
import pathlib
import struct
import sys

import numpy as np
import torch
from diffusers import WanTransformer3DModel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_import_fixtures import dit_to_original  # noqa: E402


def main():
    out = pathlib.Path(sys.argv[1])
    d = out / "transformer"
    d.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        model = WanTransformer3DModel(num_attention_heads=12, ffn_dim=8960, num_layers=30)
    model.save_config(d)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    header, offset = {}, 0
    for k in sorted(shapes):
        n = int(np.prod(shapes[k])) * 4
        header[k] = {"dtype": "F32", "shape": list(shapes[k]), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path = d / "diffusion_pytorch_model.safetensors"
    rng = np.random.default_rng(17)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for k in sorted(shapes):
            n = int(np.prod(shapes[k]))
            for start in range(0, n, 1 << 24):
                m = min(1 << 24, n - start)
                f.write((rng.standard_normal(m, dtype=np.float32) * 0.02).tobytes())
    print(f"{path}: {len(shapes)} tensors, {offset / 1e9:.2f} GB")
    if "--pt" in sys.argv:
        data = np.memmap(path, dtype=np.uint8, mode="r")
        base = 8 + len(text)
        sd = {}
        for k, h in header.items():
            a, b = h["data_offsets"]
            arr = np.frombuffer(data[base + a: base + b], dtype=np.float32).reshape(h["shape"])
            sd["model." + dit_to_original(k)] = torch.from_numpy(arr)
        torch.save({"generator_ema": sd}, out / "self_forcing.pt")
        print(f"{out / 'self_forcing.pt'} written")


if __name__ == "__main__":
    main()
