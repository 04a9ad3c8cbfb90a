#!/usr/bin/env python3
"""Widens a trained `world` DiT to twice its width without changing what it computes, so
that training can go on from it with more room in every token.

The 4x VAE's DiT carries 4x4x16 = 256 latent values a token through a 256-wide residual
stream; most of its x0 error is texture inside the tokens (models/world-next/sessions.md).
This doubles the width (and the heads, 64 wide each, since diffusers' Wan ties the width
to heads x head_dim) by duplication: every residual-stream vector x becomes [x, x], every
head gets a twin. LayerNorm and the across-heads RMSNorm of [x, x] are those of x twice,
a twin head attends as its original does, and every linear that reads a duplicated
vector has its weight split between the two copies, W -> [W*M, W*(1-M)] with M drawn in
(0.3, 0.7), so it reads exactly what it read before. The two copies of a residual vector
then get different gradients and drift apart as training goes on. The FFN's hidden layer
keeps its width; inputs (latent patches, time frequencies, text, rays) and the output
projection's latent values keep theirs.

    ~/.headroom-reference/bin/python tools/world/widen.py --dit /work/w4/dit.pt --out /work/wide/dit.pt --check

`--check` runs both through train.py's training forward on random inputs (4x VAE layout)
and prints the largest difference (round 3's DiT: 3.0e-6 on outputs up to 5.1).

The written dit.pt resumes like any other (`train.py --stage dit --dit-resume`, which reads
the width from the checkpoint); its record notes the widening.
"""

import argparse
import pathlib

import torch

# Weights whose input is a latent patch, time frequencies, text or rays (not widened).
NARROW_IN = ("patch_embedding.", "condition_embedder.time_embedder.linear_1.",
             "condition_embedder.text_embedder.linear_1.", "patch_embedding_wancamctrl.")


def reads_narrow(key):
    """The layer reads an unwidened vector: an input, or the FFN's hidden layer."""
    return key.startswith(NARROW_IN) or ".ffn.net.2." in key


def writes_narrow(key):
    """The layer writes an unwidened vector: the latent values, or the FFN's hidden layer."""
    return key.startswith("proj_out.") or ".ffn.net.0.proj." in key


def split_in(w, gen, lo=0.3, hi=0.7):
    """[out, in] -> [out, 2 in] that reads [x, x] as w reads x."""
    m = lo + (hi - lo) * torch.rand(w.shape, generator=gen)
    return torch.cat([w * m, w * (1 - m)], 1)


def widen_tensor(key, t, gen):
    """The doubled tensor of `key` (see the module doc)."""
    if key.endswith("scale_shift_table"):               # [1, k, dim]
        return torch.cat([t, t], -1)
    if key == "condition_embedder.time_proj.weight":    # [6 dim, dim]: six dim-chunks
        dim = t.shape[1]
        return torch.cat([torch.cat([split_in(c, gen), split_in(c, gen)], 0)
                          for c in t.reshape(6, dim, dim)], 0)
    if key == "condition_embedder.time_proj.bias":
        dim = t.shape[0] // 6
        return torch.cat([torch.cat([c, c]) for c in t.reshape(6, dim)])
    if t.dim() == 1:                                     # biases and norm weights
        return t if writes_narrow(key) else torch.cat([t, t])
    if reads_narrow(key):      # rows duplicated (the patch embedding's Conv3d among them)
        return torch.cat([t, t], 0)
    if writes_narrow(key):
        return split_in(t, gen)
    return torch.cat([split_in(t, gen), split_in(t, gen)], 0)


def widen(ck, seed=0):
    """A dit.pt's dict with its model and adapter widened 2x."""
    gen = torch.Generator().manual_seed(seed)
    out = dict(ck)
    for part in ("model", "adapter"):
        out[part] = {k: widen_tensor(k, v.float(), gen) for k, v in ck[part].items()}
    # A block's camera layers sit in both dicts (the adapter's, attached to the blocks):
    # the same split for both, or the two copies would disagree.
    for k, v in out["adapter"].items():
        if k in out["model"]:
            out["model"][k] = v
    width = out["model"]["blocks.0.attn1.to_q.weight"].shape[0]
    out["runs"] = list(ck.get("runs", [])) + [dict(steps=0, minutes=0.0, widened_to=width)]
    return out


def check(narrow, wide):
    """The largest output difference of the two DiTs on one random training-shaped input."""
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import train
    train.configure(16, 16, 1, 4)
    outs = []
    for ck in (narrow, wide):
        train.follow_width(ck)
        model, adapter = train.build_dit()
        model.load_state_dict(ck["model"])
        adapter.load_state_dict(ck["adapter"])
        gen = torch.Generator().manual_seed(0)
        f, hh, ww = 2 * train.LATENT, train.h, train.w
        lat = torch.randn(1, 36, f, hh, ww, generator=gen)
        ts = torch.cat([torch.zeros(1, train.LATENT), torch.full((1, train.LATENT), 700.0)], 1)
        rays = torch.randn(1, 6 * train.FOLD ** 2, f, hh, ww, generator=gen)
        with torch.no_grad():
            outs.append(train.dit_forward(model, adapter, lat, ts, rays, train.teacher_mask()))
    return (outs[0] - outs[1]).abs().max().item(), outs[0].abs().max().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dit", type=pathlib.Path, required=True, help="a trained dit.pt (f32)")
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true",
                    help="compare the two networks' outputs on a random input")
    a = ap.parse_args()
    ck = torch.load(a.dit)
    wide = widen(ck, a.seed)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(wide, a.out)
    n = lambda c: sum(v.numel() for p in ("model", "adapter") for k, v in c[p].items()
                      if not (p == "model" and ".cam_" in k))
    print(f"wrote {a.out}: {n(ck) / 1e6:.2f} M -> {n(wide) / 1e6:.2f} M parameters")
    if a.check:
        diff, scale = check(ck, wide)
        print(f"largest output difference {diff:.2e} (outputs up to {scale:.2f})")


if __name__ == "__main__":
    main()
