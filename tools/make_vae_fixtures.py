#!/usr/bin/env python3
"""Write the Wan 2.1 VAE golden fixtures in crates/model/tests/fixtures/vae/.

For each tiny config below this builds diffusers' ``AutoencoderKLWan`` (the
reference the Rust VAE re-implements), fills its weights from a seeded random
init and writes one folder holding:

  config.json, diffusion_pytorch_model.safetensors
      exactly what ``save_pretrained`` writes, so the Rust loader reads a real
      diffusers model folder;
  latents.npy   [1, z_dim, T_lat, h, w]  decode input (seeded randn);
  decoded.npy   ``vae.decode(latents).sample``          [1, 3, T', H, W];
  video.npy     [1, 3, T, H, W] in [-1, 1]  encode input (seeded uniform);
  encoded_mean.npy  ``vae.encode(video).latent_dist.mean``.

All tensors are float32 on the CPU and the .npy files are C-order ``<f4``.
A ``versions.txt`` next to the folders records the torch/diffusers versions.

It needs the reference environment (torch + diffusers 0.42.1), which CI never
has; CI never runs this script, it only reads the committed fixtures. Run it
from anywhere:

    ~/.headroom-reference/bin/python tools/make_vae_fixtures.py
"""

import json
import math
import pathlib
import platform

import numpy as np
import safetensors
import torch
import diffusers
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "crates" / "model" / "tests" / "fixtures" / "vae"

# name -> (seed, model config, latents shape, video shape). The encoder always
# takes a 1-frame chunk then 4-frame chunks (WAN.md §2.9), so T = 1 + 4k.
CONFIGS = {
    # WAN.md §2.11: temporal x2, spatial x2. 3 latents -> 5 frames; 9 frames -> 5 latents.
    "tiny_t1": (1, dict(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1,
                        temperal_downsample=[True], attn_scales=[]),
                (1, 4, 3, 4, 4), (1, 3, 9, 8, 8)),
    # Temporal x4, spatial x4; attention only in the two mid blocks. attn_scales
    # must stay []: [0.5] does build an encoder WanAttentionBlock (the running
    # scale is 0.5 in stage 1), but Encoder3d.forward passes it feat_cache=...,
    # which WanAttentionBlock.forward does not accept, so encode() raises a
    # TypeError in diffusers 0.42.1. No diffusers output exists for that case.
    "tiny_t2_attn": (2, dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1,
                             temperal_downsample=[True, True], attn_scales=[]),
                     (1, 4, 3, 4, 4), (1, 3, 9, 16, 16)),
    # No temporal compression (downsample2d / upsample2d only): 3 latents -> 3 frames.
    # base_dim=4 keeps the file small and checks that the loader reads base_dim.
    "tiny_t0": (3, dict(base_dim=4, z_dim=4, dim_mult=[1, 2], num_res_blocks=1,
                        temperal_downsample=[False], attn_scales=[]),
                (1, 4, 3, 4, 4), (1, 3, 5, 8, 8)),
}

# Extra gain on the last decoder conv so few decoded values reach the final
# clamp(-1, 1); everything else uses the plain 1/sqrt(fan_in) scale.
CONV_OUT_GAIN = 0.5


def init_weights(vae, gen):
    """Seeded random init that keeps activations O(1) and non-trivial.

    The default init leaves every RMS gamma at exactly 1, which would hide a
    missing or misplaced gamma; random gammas, biases and weights make every
    parameter matter, so a wrong key or layout in the Rust loader shows up as a
    numeric mismatch.
    """
    for name, p in sorted(vae.named_parameters()):
        if name.endswith(".gamma"):
            p.data = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        elif name.endswith(".bias"):
            p.data = 0.05 * torch.randn(p.shape, generator=gen)
        else:  # conv weight [Cout, Cin, *kernel]: unit-variance output for unit input
            fan_in = math.prod(p.shape[1:])
            gain = CONV_OUT_GAIN if name == "decoder.conv_out.weight" else 1.0
            p.data = gain * torch.randn(p.shape, generator=gen) / math.sqrt(fan_in)


def save_npy(path, t):
    np.save(path, np.ascontiguousarray(t.detach().numpy(), dtype="<f4"))


def make(name, seed, cfg, lat_shape, vid_shape):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # module construction draws from the global RNG too
    z = cfg["z_dim"]
    # Non-default normalisation stats of length z_dim: the loader must read them
    # (they are unused inside encode/decode, WAN.md §2.10). Rounded for a readable config.json.
    mean = [round(v, 4) for v in (0.5 * torch.randn(z, generator=gen)).tolist()]
    std = [round(v, 4) for v in (1.0 + torch.rand(z, generator=gen)).tolist()]
    vae = AutoencoderKLWan(**cfg, latents_mean=mean, latents_std=std).eval()
    init_weights(vae, gen)
    assert all(p.dtype == torch.float32 for p in vae.parameters()), name

    # Attention blocks live only in the mid blocks (see tiny_t2_attn above).
    assert not any(isinstance(m, WanAttentionBlock) for m in vae.encoder.down_blocks), name
    n_attn = sum(isinstance(m, WanAttentionBlock) for m in vae.modules())

    latents = torch.randn(lat_shape, generator=gen)
    video = torch.rand(vid_shape, generator=gen) * 2 - 1
    with torch.no_grad():
        decoded = vae.decode(latents).sample
        enc_mean = vae.encode(video).latent_dist.mean

    d = OUT_DIR / name
    d.mkdir(parents=True, exist_ok=True)
    vae.save_pretrained(d)  # safe_serialization=True by default -> .safetensors
    for fname, t in (("latents", latents), ("decoded", decoded),
                     ("video", video), ("encoded_mean", enc_mean)):
        save_npy(d / f"{fname}.npy", t)

    # Round trip: the saved folder alone must reproduce the outputs bit for bit,
    # so the fixtures are self-consistent (nothing lives only in memory).
    again = AutoencoderKLWan.from_pretrained(d).eval()
    with torch.no_grad():
        assert torch.equal(again.decode(latents).sample, decoded), name
        assert torch.equal(again.encode(video).latent_dist.mean, enc_mean), name
    assert json.loads((d / "config.json").read_text())["latents_std"] == std

    n_tensors = len(vae.state_dict())
    at_one = (decoded.abs() == 1.0).float().mean().item()
    print(f"{name}: {n_tensors} tensors, {n_attn} attention blocks (mid blocks)")
    print(f"  latents {list(latents.shape)} -> decoded {list(decoded.shape)}"
          f"  max|decoded| {decoded.abs().max().item():.4f}  at +-1: {at_one:.2%}")
    print(f"  video {list(video.shape)} -> encoded_mean {list(enc_mean.shape)}"
          f"  max|encoded_mean| {enc_mean.abs().max().item():.4f}")
    print(f"  max|latents| {latents.abs().max().item():.4f}  max|video| {video.abs().max().item():.4f}")
    if at_one > 0.05:
        print(f"  WARNING: {at_one:.2%} of decoded values are clamped; lower CONV_OUT_GAIN")


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
    for name, (seed, cfg, lat_shape, vid_shape) in CONFIGS.items():
        make(name, seed, cfg, lat_shape, vid_shape)


if __name__ == "__main__":
    main()
