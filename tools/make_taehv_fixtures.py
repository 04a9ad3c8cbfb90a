#!/usr/bin/env python3
"""Write the TAEHV tiny-decoder golden fixtures in crates/model/tests/fixtures/taehv/.

The released taew2_1 / taew2_2 weights are not reachable from our machines, so each
fixture is a file in their exact layout (the full TAEHV state dict, encoder included, as
`torch.save` writes it) with seeded random weights, decoded by the reference
implementation, madebyollin/taehv's `taehv.py`, which this script imports from the path
given (it is not vendored here):

    git -C <mirror of madebyollin/taehv> show HEAD:taehv.py > /tmp/taehv.py
    ~/.headroom-reference/bin/pip install tqdm
    ~/.headroom-reference/bin/python tools/make_taehv_fixtures.py --taehv /tmp/taehv.py

For each case one folder holds:

  decoder.pth              the state dict in f16 (as the released .pth files are; the
                           narrow cases keep only the encoder's first conv);
  decoder_f32.safetensors  the same values in f32 (as the released .safetensors);
  latents.npy              [1, C, T, h, w] seeded randn, the DiT's latent space;
  decoded.npy              taehv.py's decode_video of the f32 model on those values,
                           moved to headroom's layout [1, 3, T', H, W] and to [-1, 1];
  bf16_error.json          max |decode in bf16 - decoded.npy| of PyTorch itself.

The committed cases narrow the widths (taehv.py's layer classes, composed at widths
[32, 16, 8, 8]) to keep the files small; `--full DIR` writes the same files at the
released widths [256, 128, 64, 64] (taew2_1 and taew2_2 shapes exactly) into DIR, for
`headroom vae decode --model DIR/<case>/decoder.pth --compare DIR/<case>/decoded.npy`.
"""

import argparse
import importlib.util
import json
import pathlib

import numpy as np
import torch
import torch.nn as nn
from safetensors.torch import save_file

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "crates" / "model" / "tests" / "fixtures" / "taehv"

# name -> (seed, checkpoint name taehv.py keys its shapes on, latent shape [C, T, h, w])
CASES = {
    "taew2_1": (1, "taew2_1.pth", (16, 3, 6, 8)),
    "taew2_2": (2, "taew2_2.pth", (48, 2, 4, 6)),
}


def load_reference(path):
    spec = importlib.util.spec_from_file_location("taehv", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def narrow_decoder(t, model, n_f, strides=(1, 2, 2)):
    """taehv.py's base decoder at widths n_f (each stage's, then the output conv's) with
    one stage per entry of `strides` (its TGrow's frames), built from its own layer classes."""
    c, p = model.latent_channels, model.patch_size
    layers = [t.Clamp(), t.conv(c, n_f[0]), nn.ReLU(inplace=True)]
    for k, stride in enumerate(strides):
        layers += [t.MemBlock(n_f[k], n_f[k]) for _ in range(3)]
        layers += [nn.Upsample(scale_factor=2), t.TGrow(n_f[k], stride),
                   t.conv(n_f[k], n_f[k + 1], bias=False)]
    layers += [nn.ReLU(inplace=True), t.conv(n_f[-1], 3 * p * p)]
    return nn.Sequential(*layers)


def seeded_model(t, seed, name, widths):
    torch.manual_seed(seed)
    model = t.TAEHV(checkpoint_path=None)
    if "taew2_2" in name:
        model = t.TAEHV(checkpoint_path=None, patch_size=2, latent_channels=48)
    if widths is not None:
        model.decoder = narrow_decoder(t, model, widths)
    with torch.no_grad():
        for key, p in model.named_parameters():
            fan_in = p[0].numel()
            p.normal_(0.0, 1.0 / fan_in ** 0.5)
        # Keep the output spread inside [0, 1] so the clamp does not hide errors.
        last = model.decoder[-1]
        last.weight.mul_(0.3)
        last.bias.fill_(0.5)
    # Round to f16 once, so the .pth and the f32 file hold the same values.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    return model.eval()


def decode(model, latents):
    """headroom's [1, C, T, h, w] latents through taehv.py; [1, 3, T', H, W] in [-1, 1]."""
    x = latents.permute(0, 2, 1, 3, 4)  # NTCHW
    with torch.no_grad():
        y = model.decode_video(x, parallel=False, show_progress_bar=False)
    return (y.float() * 2 - 1).permute(0, 2, 1, 3, 4).contiguous()


def fit_into_clamp(model, latents, what):
    """The decode of `latents`, after scaling the last conv down (in powers of two, exact
    in f16) until most outputs are inside (-1, 1): a decoder whose every output is clamped
    would prove little. Returns the decode and the share inside."""
    for _ in range(12):
        expected = decode(model, latents)
        inside = ((expected > -1) & (expected < 1)).float().mean().item()
        if inside > 0.6:
            break
        with torch.no_grad():
            model.decoder[-1].weight.mul_(0.5)
    assert inside > 0.5, f"{what}: only {inside:.0%} of the outputs are inside (-1, 1)"
    return expected, inside


def write_case(t, out, name, widths):
    seed, ckpt, (c, frames, h, w) = CASES[name]
    model = seeded_model(t, seed, ckpt, widths)
    case = out / name
    case.mkdir(parents=True, exist_ok=True)
    # The narrow cases keep only the encoder's first conv (the loader must skip it).
    g = torch.Generator().manual_seed(100 + seed)
    latents = torch.randn(1, c, frames, h, w, generator=g)
    expected, inside = fit_into_clamp(model, latents, name)
    state = model.state_dict()
    if widths is not None:
        state = {k: v for k, v in state.items()
                 if k.startswith("decoder.") or k.startswith("encoder.0.")}
    torch.save({k: v.half() for k, v in state.items()}, case / "decoder.pth")
    save_file({k: v.float().contiguous() for k, v in state.items()}, case / "decoder_f32.safetensors")
    np.save(case / "latents.npy", latents.numpy().astype("<f4"))
    np.save(case / "decoded.npy", expected.numpy().astype("<f4"))
    bf16 = decode(model.to(torch.bfloat16), latents.to(torch.bfloat16))
    err = (bf16 - expected).abs().max().item()
    (case / "bf16_error.json").write_text(json.dumps(
        {"max_abs_error": err, "torch": torch.__version__}, indent=1) + "\n")
    print(f"{case}: latents {tuple(latents.shape)} -> {tuple(expected.shape)}, "
          f"{inside:.0%} inside (-1, 1), PyTorch bf16 error {err:.3e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--taehv", required=True, help="path to taehv.py")
    parser.add_argument("--full", type=pathlib.Path, help="write released-width cases here")
    args = parser.parse_args()
    t = load_reference(args.taehv)
    torch.set_num_threads(2)
    for name in CASES:
        if args.full:
            write_case(t, args.full, name, None)
        else:
            write_case(t, OUT_DIR, name, [32, 16, 8, 8])


if __name__ == "__main__":
    main()
