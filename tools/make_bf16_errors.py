"""PyTorch's own bf16 error on the golden fixtures: the bound of the bf16 golden tests.

For every DiT fixture (`crates/model/tests/fixtures/dit/*`) and VAE fixture
(`crates/model/tests/fixtures/vae/*`) this loads the same diffusers model in bfloat16
(weights and activations, as `torch_dtype=torch.bfloat16` runs it), feeds the fixture's
inputs cast to bf16, and writes `bf16_error.json` beside the fixture:
`{"max_abs_error": max |bf16 output − f32 fixture output|, "torch": …, "diffusers": …}`.
The Rust tests hold headroom's bf16 path to at most twice that.

    source "$(../shared/tools/reference-venv.sh)" && python tools/make_bf16_errors.py
"""

import json
import pathlib

import numpy as np
import torch
import diffusers
from diffusers import AutoencoderKLWan, WanTransformer3DModel

ROOT = pathlib.Path(__file__).resolve().parent.parent / "crates/model/tests/fixtures"


def npy(d, name, dtype=torch.bfloat16):
    return torch.from_numpy(np.load(d / f"{name}.npy")).to(dtype)


def write(d, err):
    info = {"max_abs_error": float(err), "torch": torch.__version__, "diffusers": diffusers.__version__}
    (d / "bf16_error.json").write_text(json.dumps(info, indent=1) + "\n")
    print(d.name, info["max_abs_error"])


def main():
    torch.set_num_threads(2)
    with torch.inference_mode():
        for d in sorted((ROOT / "dit").iterdir()):
            if not (d / "config.json").exists():
                continue
            model = WanTransformer3DModel.from_pretrained(d, torch_dtype=torch.bfloat16).eval()
            x, t, text = npy(d, "latents"), npy(d, "timestep", torch.float32), npy(d, "text")
            out = model(hidden_states=x, timestep=t, encoder_hidden_states=text[None]).sample
            write(d, (out.float() - npy(d, "out_text", torch.float32)).abs().max().item())
        for d in sorted((ROOT / "vae").iterdir()):
            if not (d / "config.json").exists():
                continue
            vae = AutoencoderKLWan.from_pretrained(d, torch_dtype=torch.bfloat16).eval()
            out = vae.decode(npy(d, "latents")).sample
            write(d, (out.float() - npy(d, "decoded", torch.float32)).abs().max().item())


if __name__ == "__main__":
    main()
