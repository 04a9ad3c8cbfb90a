#!/usr/bin/env python3
"""Write the two-stage TAEHV tiny-decoder golden fixture in
crates/model/tests/fixtures/taehv/two_stage/.

A decoder for a VAE with 4x spatial compression (Wan's AutoencoderKLWan with dim_mult
[1, 2, 2]) has two x2 upsample stages instead of the released files' three. Nothing
released has that layout, so, as tools/make_taehv_fixtures.py does for taew2_1 and
taew2_2, this composes madebyollin/taehv's `taehv.py` layer classes (Clamp, conv,
MemBlock, TGrow) into its decoder Sequential with two stages at narrow widths, seeds the
weights and decodes with taehv.py's own `decode_video`. taehv.py is imported from the
path given (it is not vendored here):

    git -C <mirror of madebyollin/taehv> show HEAD:taehv.py > /tmp/taehv.py
    ~/.headroom-reference/bin/pip install tqdm
    ~/.headroom-reference/bin/python tools/make_taehv_stages_fixture.py --taehv /tmp/taehv.py

The folder holds:

  decoder.safetensors  the decoder's state dict (taehv.py's decoder.{index} keys) in f16;
  latents.npy          [1, 16, 3, h, w] seeded randn, the DiT's latent space;
  decoded.npy          taehv.py's decode_video of the f32 model on those values (the
                       f16 weights widened), in headroom's layout [1, 3, T', H, W] and
                       [-1, 1]: T' = 1 + 4 (T - 1) frames, H = 4 h, W = 4 w.
"""

import argparse
import importlib.util
import math
import pathlib

import numpy as np
import torch
import torch.nn as nn
from safetensors.torch import save_file

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "crates" / "model" / "tests" / "fixtures" / "taehv" / "two_stage"

SEED = 4
WIDTHS = (12, 8, 6)  # each stage's and the output conv's
STRIDES = (2, 2)  # frames each stage's TGrow makes of one: 4 a latent frame
LATENTS = (16, 3, 3, 5)  # [C, T, h, w]


def load_reference(path):
    spec = importlib.util.spec_from_file_location("taehv", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def staged_decoder(t, latent_channels, widths, strides):
    """taehv.py's base decoder with len(strides) stages, built from its layer classes."""
    layers = [t.Clamp(), t.conv(latent_channels, widths[0]), nn.ReLU(inplace=True)]
    for k, stride in enumerate(strides):
        layers += [t.MemBlock(widths[k], widths[k]) for _ in range(3)]
        layers += [nn.Upsample(scale_factor=2), t.TGrow(widths[k], stride),
                   t.conv(widths[k], widths[k + 1], bias=False)]
    layers += [nn.ReLU(inplace=True), t.conv(widths[-1], 3)]
    return nn.Sequential(*layers)


def seeded_model(t):
    torch.manual_seed(SEED)
    model = t.TAEHV(checkpoint_path=None)
    model.decoder = staged_decoder(t, model.latent_channels, WIDTHS, STRIDES)
    # taehv.py computes these from its own three-stage decoder in __init__.
    model.t_upscale = math.prod(STRIDES)
    model.frames_to_trim = model.t_upscale - 1
    with torch.no_grad():
        for p in model.decoder.parameters():
            p.normal_(0.0, 1.0 / p[0].numel() ** 0.5)
        # Keep the output spread inside [0, 1] so the clamp does not hide errors.
        model.decoder[-1].weight.mul_(0.3)
        model.decoder[-1].bias.fill_(0.5)
        # Round to f16 once: the file holds these values exactly.
        for p in model.decoder.parameters():
            p.copy_(p.half().float())
    return model.eval()


def decode(model, latents):
    """headroom's [1, C, T, h, w] latents through taehv.py; [1, 3, T', H, W] in [-1, 1]."""
    x = latents.permute(0, 2, 1, 3, 4)  # NTCHW
    with torch.no_grad():
        y = model.decode_video(x, parallel=False, show_progress_bar=False)
    return (y.float() * 2 - 1).permute(0, 2, 1, 3, 4).contiguous()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--taehv", required=True, help="path to taehv.py")
    args = parser.parse_args()
    t = load_reference(args.taehv)
    torch.set_num_threads(2)
    model = seeded_model(t)
    c, frames, h, w = LATENTS
    g = torch.Generator().manual_seed(100 + SEED)
    latents = torch.randn(1, c, frames, h, w, generator=g)
    # As make_taehv_fixtures.py: scale the last conv down (powers of two, exact in f16)
    # until most outputs are inside the clamp.
    for _ in range(12):
        expected = decode(model, latents)
        inside = ((expected > -1) & (expected < 1)).float().mean().item()
        if inside > 0.6:
            break
        with torch.no_grad():
            model.decoder[-1].weight.mul_(0.5)
    assert inside > 0.5, f"only {inside:.0%} of the outputs are inside (-1, 1)"
    assert expected.shape == (1, 3, 1 + 4 * (frames - 1), 4 * h, 4 * w), expected.shape
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    state = {f"decoder.{k}": v.half().contiguous() for k, v in model.decoder.state_dict().items()}
    save_file(state, OUT_DIR / "decoder.safetensors")
    np.save(OUT_DIR / "latents.npy", latents.numpy().astype("<f4"))
    np.save(OUT_DIR / "decoded.npy", expected.numpy().astype("<f4"))
    print(f"{OUT_DIR}: {len(state)} tensors, latents {tuple(latents.shape)} -> "
          f"{tuple(expected.shape)}, {inside:.0%} inside (-1, 1)")


if __name__ == "__main__":
    main()
