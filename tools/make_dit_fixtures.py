#!/usr/bin/env python3
"""Write the Wan 2.1 transformer golden fixtures in crates/model/tests/fixtures/dit/.

For each tiny config below this builds diffusers' ``WanTransformer3DModel``
(the reference the Rust DiT re-implements, WAN.md §3), fills every parameter
from a seeded random init and writes one folder holding:

  config.json, diffusion_pytorch_model.safetensors
      exactly what ``save_pretrained`` writes, so the Rust loader reads a real
      diffusers model folder;
  latents.npy   [1, in_channels, F, H, W]  model input (seeded randn);
  timestep.npy  [1]                        the scheduler timestep, unscaled;
  text.npy      [S, text_dim]              text context, S = 7 (seeded randn);
  out_text.npy    ``model(latents, t, text[None]).sample``  [1, out_channels, F, H, W];
  out_notext.npy  the same with one all-zero context token ``[1, 1, text_dim]``.

"No text" is a zero context. Any number of identical zero tokens gives the same
output (cross-attention averages identical values); the script checks this by
also running 5 zero tokens.

All tensors are float32 on the CPU and the .npy files are C-order ``<f4``.
A ``versions.txt`` next to the folders records the torch/diffusers versions.

It needs the reference environment (torch + diffusers 0.42.1), which CI never
has; CI never runs this script, it only reads the committed fixtures. Run it
from anywhere:

    ~/.headroom-reference/bin/python tools/make_dit_fixtures.py
"""

import json
import math
import pathlib
import platform

import numpy as np
import safetensors
import torch
import diffusers
from diffusers import WanTransformer3DModel
from safetensors.torch import load_file

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "crates" / "model" / "tests" / "fixtures" / "dit"

TEXT_LEN = 7  # tokens in the "with text" context

# WAN.md §3.2's tiny config; the other configs override a few keys.
BASE = dict(patch_size=(1, 2, 2), num_attention_heads=3, attention_head_dim=12,
            in_channels=16, out_channels=16, text_dim=20, freq_dim=32, ffn_dim=72,
            num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
            eps=1e-6, rope_max_seq_len=1024)

# name -> (seed, config overrides, latents shape, timestep).
CONFIGS = {
    # 3*2*3 = 18 tokens. 937.5 is a DMD-shifted (non-integer) timestep.
    "t2v": (1, {}, (1, 16, 3, 4, 6), 937.5),
    # Image-conditioned input: 16 noise + 4 mask + 16 image-latent channels on
    # the channel axis; no CLIP image embedder (image_dim=None). 6*2*2 = 24 tokens.
    "i2v36": (2, dict(in_channels=36, out_channels=16), (1, 36, 6, 4, 4), 250.0),
    # head_dim 16 gives a rope split t/h/w = 8/4/4 (not the 4/4/4 of head_dim 12);
    # H' = 3 != W' = 2 catches a swapped h/w axis. 5*3*2 = 30 tokens.
    "h2d16": (3, dict(num_attention_heads=2, attention_head_dim=16, ffn_dim=64),
              (1, 16, 5, 6, 4), 999.0),
}

NORM_WEIGHTS = (".norm_q.weight", ".norm_k.weight", ".norm2.weight")


def init_weights(model, gen):
    """Seeded random init that makes every parameter matter.

    diffusers leaves the RMS/LayerNorm weights at exactly 1 and the LayerNorm
    bias at 0, and draws the scale_shift_tables from the *global* RNG as
    randn/sqrt(dim); redrawing all of them from one generator means a missing,
    misplaced or transposed term in the Rust port shows up as a numeric mismatch.
    """
    for name, p in sorted(model.named_parameters()):
        if name.endswith("scale_shift_table"):
            p.data = 0.1 * torch.randn(p.shape, generator=gen)
        elif name.endswith(NORM_WEIGHTS):
            p.data = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        elif name.endswith(".bias"):
            p.data = 0.05 * torch.randn(p.shape, generator=gen)
        else:  # Linear [out, in] or Conv3d [out, in, kt, kh, kw]: O(1) outputs for O(1) inputs
            assert p.ndim >= 2, name
            fan_in = math.prod(p.shape[1:])
            p.data = torch.randn(p.shape, generator=gen) / math.sqrt(fan_in)


def save_npy(path, t):
    np.save(path, np.ascontiguousarray(t.detach().numpy(), dtype="<f4"))


def run(model, latents, t, ctx):
    with torch.no_grad():
        return model(hidden_states=latents, timestep=t, encoder_hidden_states=ctx).sample


def make(name, seed, overrides, lat_shape, t_value):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # module construction draws from the global RNG too
    cfg = {**BASE, **overrides}
    model = WanTransformer3DModel(**cfg).eval()
    init_weights(model, gen)
    assert all(p.dtype == torch.float32 for p in model.parameters()), name
    rope = model.rope
    split = (rope.t_dim, rope.h_dim, rope.w_dim)
    hd = cfg["attention_head_dim"]
    assert split == (hd - 4 * (hd // 6), 2 * (hd // 6), 2 * (hd // 6)), (name, split)  # WAN.md §3.4

    text_dim = cfg["text_dim"]
    latents = torch.randn(lat_shape, generator=gen)
    text = torch.randn(TEXT_LEN, text_dim, generator=gen)
    t = torch.tensor([t_value], dtype=torch.float32)
    out_text = run(model, latents, t, text[None])
    out_notext = run(model, latents, t, torch.zeros(1, 1, text_dim))
    out_notext5 = run(model, latents, t, torch.zeros(1, 5, text_dim))
    zero_tok_diff = (out_notext - out_notext5).abs().max().item()
    assert zero_tok_diff <= 1e-6, (name, zero_tok_diff)
    text_diff = (out_text - out_notext).abs().max().item()
    assert text_diff > 1e-2, (name, text_diff)  # the text path must visibly matter
    _, c_in, f, h, w = lat_shape
    assert out_text.shape == (1, cfg["out_channels"], f, h, w), (name, out_text.shape)

    d = OUT_DIR / name
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d)  # safe_serialization=True by default -> .safetensors
    for fname, x in (("latents", latents), ("timestep", t), ("text", text),
                     ("out_text", out_text), ("out_notext", out_notext)):
        save_npy(d / f"{fname}.npy", x)

    # Round trip: the saved folder alone must reproduce the outputs bit for bit,
    # so the fixtures are self-consistent (the rope buffers are recomputed on load).
    # Not from_pretrained: without `accelerate` (absent from the venv) it forces
    # low_cpu_mem_usage=False, which WanTransformer3DModel's _keep_in_fp32_modules
    # rejects with a ValueError. Config + strict state-dict load is the same thing in fp32.
    again = WanTransformer3DModel.from_config(WanTransformer3DModel.load_config(d)).eval()
    again.load_state_dict(load_file(d / "diffusion_pytorch_model.safetensors"), strict=True)
    assert torch.equal(run(again, latents, t, text[None]), out_text), name
    assert torch.equal(run(again, latents, t, torch.zeros(1, 1, text_dim)), out_notext), name
    saved = json.loads((d / "config.json").read_text())
    assert saved["in_channels"] == c_in and saved["image_dim"] is None, name
    n_tensors = len(again.state_dict())
    assert n_tensors == len(model.state_dict()), name

    pt, ph, pw = cfg["patch_size"]
    tokens = (f // pt) * (h // ph) * (w // pw)
    print(f"{name}: {n_tensors} tensors, dim {cfg['num_attention_heads'] * hd} "
          f"({cfg['num_attention_heads']}x{hd}), rope t/h/w {split[0]}/{split[1]}/{split[2]}, "
          f"t = {t_value}")
    print(f"  latents {list(latents.shape)} ({tokens} tokens), text {list(text.shape)}"
          f" -> out {list(out_text.shape)}")
    for label, o in (("out_text", out_text), ("out_notext", out_notext)):
        print(f"  {label:10s} std {o.std().item():.4f}  max|.| {o.abs().max().item():.4f}")
    print(f"  max|out_text - out_notext| {text_diff:.4f}"
          f"   max|1 vs 5 zero tokens| {zero_tok_diff:.3g}")


def main():
    torch.set_num_threads(1)  # shared machine; also keeps reductions in one fixed order
    torch.set_default_dtype(torch.float32)
    diffusers.utils.logging.set_verbosity_error()  # hide the "install accelerate" notice
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    versions = (f"python {platform.python_version()}\ntorch {torch.__version__}\n"
                f"diffusers {diffusers.__version__}\nnumpy {np.__version__}\n"
                f"safetensors {safetensors.__version__}\n")
    (OUT_DIR / "versions.txt").write_text(versions)
    print(versions, end="")
    for name, (seed, overrides, lat_shape, t_value) in CONFIGS.items():
        make(name, seed, overrides, lat_shape, t_value)


if __name__ == "__main__":
    main()
