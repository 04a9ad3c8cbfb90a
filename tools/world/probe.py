#!/usr/bin/env python3
"""A fast steering probe of a train.py DiT checkpoint, in PyTorch: the engine's loop
(3-latent-frame blocks, 4 DMD steps, the last step's x0 committed, frame 0 the image's
latents) on eval.py's held-key steering flights, and eval.py's shift per latent frame
against the truth's. About 12 s a flight on one core, without exporting; `eval.py`
through `headroom generate` stays the measure of record.

`--truth-block0` gives the later blocks the truth's first block as context instead of
the model's own, which tells a DiT that cannot steer from one that cannot start.
`--guidance G` steers each block's velocity away from a still camera's (the same context,
the block's rays those of no key): v = v_still + G (v_keys - v_still), two forwards a step.
`--seeds N` flies each key over N scenes (eval.py's, then seeds 1000 apart) and prints
the bar over all of them as well.

    ~/.headroom-reference/bin/python tools/world/probe.py --work /work/world-s4c \\
        --dit /work/world-s4c/dit.pt --vae-spatial 4 [--keys dalj] [--truth-block0] [--strip P]
"""

import argparse

import numpy as np
import torch

import eval as E
import train as T


def rollout(model, adapter, vae, mean, std, video, script, truth_block0, guidance=1.0,
            guided_steps=4, rescale=0.0, guide_from=0, guided_blocks=99):
    """Decoded uint8 frames [33, H, W, 3] of the engine's loop from `video`'s first frame."""
    L, B = T.LATENT, T.BLOCK
    view = lambda t: t.view(1, -1, 1, 1, 1)
    ts, sig = T.ref.dmd_schedule(4, 5.0)
    ts, sig = torch.tensor(ts).float(), torch.tensor(sig).float()
    mask = T.teacher_mask()
    x = T.to_video(video)[None]
    first = torch.cat([x[:, :, :1], torch.zeros(1, 3, T.FRAMES - 1, T.H, T.W)], 2)
    cond = (vae.encode(first).latent_dist.mode() - view(mean)) / view(std)
    c = torch.cat([torch.zeros(1, 4, L, T.h, T.w), cond], 1)
    c[:, :4, 0] = 1.0
    rays = T.block_rays(script)[None]
    still = torch.cat([rays, T.block_rays("-" * L)[None]], 2)
    gen = torch.Generator().manual_seed(0)
    ctx = torch.zeros(1, cond.shape[1], L, T.h, T.w)
    for b in range(L // B):
        xt = torch.randn(ctx.shape, generator=gen)
        for k in range(4):
            inp = torch.cat([torch.cat([ctx, xt], 2), torch.cat([c, c], 2)], 1)
            tt = torch.cat([torch.zeros(1, L), torch.full((1, L), float(ts[k]))], 1)
            v = T.dit_forward(model, adapter, inp, tt, torch.cat([rays, rays], 2), mask)[:, :, L:]
            if guidance != 1.0 and guide_from <= k < guided_steps and b < guided_blocks:
                v0 = T.dit_forward(model, adapter, inp, tt, still, mask)[:, :, L:]
                g = v0 + guidance * (v - v0)
                if rescale:
                    # Lin et al. 2023: the guided velocity at the keys' own spread.
                    g = rescale * g * (v.std() / g.std()) + (1 - rescale) * g
                v = g
            x0 = xt - sig[k] * v
            if k < 3:
                xt = (1 - sig[k + 1]) * x0 + sig[k + 1] * torch.randn(x0.shape, generator=gen)
        ctx[:, :, B * b:B * b + B] = x0[:, :, B * b:B * b + B]
        if b == 0:
            ctx[:, :, 0] = cond[:, :, 0]
            if truth_block0:
                ctx[:, :, :B] = ((vae.encode(x).latent_dist.mode() - view(mean)) / view(std))[:, :, :B]
    y = vae.decode(ctx * view(std) + view(mean)).sample.clamp(-1, 1)
    return ((y[0].permute(1, 2, 3, 0) + 1) * 127.5).round().byte().numpy()


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=T.pathlib.Path, required=True,
                    help="train.py work folder (its latents.pt statistics and VAE)")
    ap.add_argument("--dit", type=T.pathlib.Path, required=True, help="a train.py dit.pt")
    ap.add_argument("--vae-spatial", type=int, default=8, choices=[4, 8])
    ap.add_argument("--vae-z-dim", type=int, default=16)
    ap.add_argument("--keys", default="dalj", help="which of eval.py's steering flights")
    ap.add_argument("--truth-block0", action="store_true")
    ap.add_argument("--guidance", type=float, default=1.0, help="camera guidance against a still camera")
    ap.add_argument("--seeds", type=int, default=1, help="scenes per key")
    ap.add_argument("--guided-steps", type=int, default=4, help="guide the first N DMD steps")
    ap.add_argument("--guide-from", type=int, default=0, help="and from DMD step N on")
    ap.add_argument("--guided-blocks", type=int, default=99, help="guide the first N blocks")
    ap.add_argument("--rescale", type=float, default=0.0, help="guidance rescale (0 = off)")
    ap.add_argument("--token-guidance", type=float, default=1.0,
                    help="camera tokens pushed away from a still camera's (one forward a step)")
    ap.add_argument("--cases", help="eval.py's held-out cases (comma-separated indices): "
                    "PSNR over frames 1-32 instead of steering")
    ap.add_argument("--strip", help="write PREFIX_KEY.png: truth above generated, every 4th frame")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    T.configure(a.vae_z_dim, 16, 1, a.vae_spatial)
    data = torch.load(a.work / "latents.pt")
    vae = T.load_vae(a.work)
    model, adapter = T.build_dit()
    ck = torch.load(a.dit)
    model.load_state_dict(ck["model"])
    adapter.load_state_dict(ck["adapter"])
    model.eval()
    if a.token_guidance != 1.0:
        tokens = T.camera_tokens
        still = T.block_rays("-" * T.LATENT)[None]
        scale = a.token_guidance

        def amplified(adapter, rays):
            s = tokens(adapter, still.expand(rays.shape[0], -1, -1, -1, -1)
                       .repeat(1, 1, rays.shape[2] // T.LATENT, 1, 1))
            return s + scale * (tokens(adapter, rays) - s)
        T.camera_tokens = amplified
    roll = lambda video, script: rollout(model, adapter, vae, data["mean"], data["std"], video,
                                         script, a.truth_block0, a.guidance, a.guided_steps,
                                         a.rescale, a.guide_from, a.guided_blocks)
    if a.cases:
        rng = np.random.default_rng(99)  # as eval.py
        cases = [(E.HELD_OUT_SEED + i, E.held_out_script(rng)) for i in range(16)]
        got = []
        for i in map(int, a.cases.split(",")):
            seed, script = cases[i]
            video = T.render.render(seed, script, T.FRAMES)
            frames = roll(video, script)
            got.append(float(np.mean([E.psnr(frames[f], video[f]) for f in range(1, T.FRAMES)])))
            print(f"case {i} seed {seed} keys {script}: {got[-1]:.2f} dB", flush=True)
        print(f"mean {np.mean(got):.2f} dB", flush=True)
        return
    for key in a.keys:
        script, gs, tr = E.STEER[key], [], []
        for i in range(a.seeds):
            seed = E.HELD_OUT_SEED + 500 + ord(key) + 1000 * i  # the first as eval.py's
            video = T.render.render(seed, script, T.FRAMES)
            frames = roll(video, script)
            g, t = E.latent_shifts(frames), E.latent_shifts(video)
            gs, tr = gs + g, tr + t
            bar = E.steering_bar(g, t)
            print(f"{key} seed {seed}: generated {np.round(g, 2).tolist()} truth "
                  f"{np.round(t, 2).tolist()} sign {bar['sign_share']:.0%} "
                  f"magnitude {bar['magnitude_ratio']:.2f}", flush=True)
        if a.seeds > 1:
            bar = E.steering_bar(gs, tr)
            print(f"{key} over {a.seeds} scenes: sign {bar['sign_share']:.0%} "
                  f"magnitude {bar['magnitude_ratio']:.2f}", flush=True)
        if a.strip:
            from PIL import Image
            row = lambda v: np.concatenate([v[i] for i in range(0, T.FRAMES, 4)], 1)
            Image.fromarray(np.concatenate([row(video), row(frames)], 0)).save(f"{a.strip}_{key}.png")


if __name__ == "__main__":
    main()
