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
import math
import pathlib

import numpy as np
import torch
from safetensors.torch import save_file

from make_taehv_fixtures import decode, fit_into_clamp, load_reference, narrow_decoder

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "crates" / "model" / "tests" / "fixtures" / "taehv" / "two_stage"

SEED = 4
WIDTHS = (12, 8, 6)  # each stage's and the output conv's
STRIDES = (2, 2)  # frames each stage's TGrow makes of one: 4 a latent frame
LATENTS = (16, 3, 3, 5)  # [C, T, h, w]


def seeded_model(t):
    torch.manual_seed(SEED)
    model = t.TAEHV(checkpoint_path=None)
    model.decoder = narrow_decoder(t, model, WIDTHS, STRIDES)
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
    expected, inside = fit_into_clamp(model, latents, "two_stage")
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
