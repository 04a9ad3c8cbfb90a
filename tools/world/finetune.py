#!/usr/bin/env python3
"""Trains a committed `world` model further without changing its latent space.

The DiT speaks the VAE encoder's latents (normalised by the statistics in the VAE's
config), so the encoder stays frozen here and everything trained is on its far side:

  init     a work folder from a model folder (default ``models/world``): its VAE and
           DiT in f32 (``vae.pt``, ``dit.pt``, the committed curves carried on), and
           ``latents.pt``: every clip of the work folder and its mirror through the
           committed encoder, normalised by the committed statistics
  rollouts ``--rollouts`` fresh clips (seeds 5000 and up, which neither network trained
           on; two thirds random key scripts, a third held keys) and the latents
           ``headroom generate`` makes from each one's true first frame and keys (what
           the decoder gets in a session): ``rollouts.npz``
  decoder  the decoder alone, from the frozen encoder's posterior means (what the
           engine decodes of the given image): whole 33-frame clips at full size (the
           causal caches over the horizon) and batches of 64×64 crops of the first block;
           and, in a ``--generated-share`` of the steps, from a rollout's latents to its
           true frames (so the decoder turns the DiT's uncertain latents into the
           picture's expected value rather than texture); L1 + L2 plus ``--first`` times
           frame 0's own (the session's given image); writes ``vae_decoder.pt``

Then ``train.py --stage dit --dit-resume --dit-lr ...`` trains the DiT further on the
same latents, and ``train.py --stage export`` writes the folder (it takes the decoder
from ``vae_decoder.pt``).

    ~/.headroom-reference/bin/python tools/world/finetune.py --stage init --work /work/world-ft
    ~/.headroom-reference/bin/python tools/world/finetune.py --stage decoder --work /work/world-ft --minutes 60
"""

import argparse
import json
import math
import multiprocessing
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import train as T  # noqa: E402
import diffusers  # noqa: E402
from diffusers import AutoencoderKLWan  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from PIL import Image  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
# What the first committed DiT's training.json does not say in its curve (stop 44).
COMMITTED_RUN = dict(steps=4099, minutes=158.0, max_lr=4e-4, camera_lr_mult=1.0, bf16=False,
                     clips=480, note="three resumed runs: 2133 steps in 48 minutes on the "
                     "idle machine, then 1966 at low priority beside other work")


def committed_vae(folder):
    """The folder's VAE in f32, and its config (with the latent statistics)."""
    cfg = json.loads((folder / "vae" / "config.json").read_text())
    T.configure(cfg["z_dim"], cfg["base_dim"], cfg["num_res_blocks"],
                2 ** (len(cfg["dim_mult"]) - 1))
    vae = AutoencoderKLWan(**T.VAE_CFG)
    vae.load_state_dict({k: v.float() for k, v in
                         load_file(folder / "vae" / "diffusion_pytorch_model.safetensors").items()})
    return vae.eval(), cfg


def stage_init(work, folder):
    vae, cfg = committed_vae(folder)
    curves = json.loads((folder / "training.json").read_text())
    if not (work / "vae.pt").exists():
        torch.save(dict(state=vae.state_dict(), curve=curves["vae"], config=T.VAE_CFG,
                        runs=curves.get("vae_runs", [])), work / "vae.pt")
    if not (work / "dit.pt").exists():
        model, adapter = T.build_dit()
        weights = {k: v.float() for k, v in load_file(
            folder / "transformer" / "diffusion_pytorch_model.safetensors").items()}
        # The adapter's per-block layers live in both modules: each takes its own names.
        own = model.state_dict().keys()
        model.load_state_dict({k: weights[k] for k in own})
        adapter.load_state_dict({k: weights[k] for k in adapter.state_dict()})
        torch.save(dict(model=model.state_dict(), adapter=adapter.state_dict(),
                        curve=curves["dit"], steps=curves["dit_steps"],
                        batch=curves["dit_batch"], runs=curves.get("dit_runs") or [COMMITTED_RUN]),
                   work / "dit.pt")
    if not (work / "latents.pt").exists():
        # Normalised by the committed statistics: the latents the DiT was trained on.
        videos, scripts = T.load_clips(work)
        lat, cond, _ = T.encode_clips(vae, videos)
        T.save_latents(work / "latents.pt", lat, cond, scripts, torch.tensor(cfg["latents_mean"]),
                       torch.tensor(cfg["latents_std"]), curves["vae_psnr_full_clips"])
    T.log(f"init: {work} from {folder}")


ROLLOUT_SEED = 5000  # the rollouts' first seed: past the training clips' (0-559)


def stage_rollouts(work, folder, headroom, count):
    """Fresh clips and the latents `headroom generate` makes of them (see the docstring)."""
    out = work / "rollouts.npz"
    if out.exists():
        return
    rng = np.random.default_rng(ROLLOUT_SEED)
    jobs = [(ROLLOUT_SEED + i, T.held_script(rng) if i % 3 == 2 else T.key_script(rng))
            for i in range(count)]
    videos = np.zeros((count, T.FRAMES, T.H, T.W, 3), np.uint8)
    with multiprocessing.Pool(2) as pool:
        for i, v in enumerate(pool.imap(T._render_clip, jobs, chunksize=4)):
            videos[i] = v
    T.log(f"rollouts: rendered {count} clips")
    latents = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for i, (seed, script) in enumerate(jobs):
            Image.fromarray(videos[i, 0]).save(tmp / "first.png")
            subprocess.run([str(headroom), "generate", "--model", str(folder),
                            "--image", str(tmp / "first.png"), f"--actions={script}",
                            "--frames", str(T.FRAMES), "--width", str(T.W), "--height", str(T.H),
                            "--seed", str(seed), "--decoder", "tiny", "--out", str(tmp / "v.mp4"),
                            "--dump-latents", str(tmp / "z.npy")],
                           check=True, capture_output=True)
            z = torch.from_numpy(np.load(tmp / "z.npy"))  # [blocks, C, 3, h, w]
            latents.append(z.permute(1, 0, 2, 3, 4).reshape(z.shape[1], -1, *z.shape[3:]))
            if i % 20 == 0:
                T.log(f"rollouts: {i + 1}/{count} generated")
    np.savez(out, videos=videos, scripts=np.array([s for _, s in jobs]),
             seeds=np.array([s for s, _ in jobs]), latents=torch.stack(latents).numpy())
    T.log(f"rollouts: wrote {out}")


def stage_decoder(work, minutes, first, lr, whole_share, generated_share=0.0):
    """The decoder (and its post-quant conv) alone, from the frozen encoder's latents and,
    in a share of the steps, from rollouts' latents to their true frames."""
    out = work / "vae_decoder.pt"
    videos, _ = T.load_clips(work)
    data = torch.load(work / "latents.pt")
    view = lambda t: t.view(1, -1, 1, 1, 1)
    # Raw latents (the decoder's input): undo the normalisation.
    raw = data["latents"] * view(data["std"]) + view(data["mean"])
    if generated_share:
        roll = np.load(work / "rollouts.npz")
        roll_videos = roll["videos"]
        roll_raw = torch.from_numpy(roll["latents"]) * view(data["std"]) + view(data["mean"])
    ck = torch.load(out if out.exists() else work / "vae.pt")
    vae = AutoencoderKLWan(**T.VAE_CFG)
    vae.load_state_dict(ck["state"])
    trained = [*vae.decoder.parameters(), *vae.post_quant_conv.parameters()]
    for p in vae.parameters():
        p.requires_grad_(False)
    for p in trained:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
    held = T.heldout_clips()
    whole, first0, _ = T.vae_psnr(vae, held)
    T.log(f"decoder: start, held-out PSNR {whole:.2f} dB, frame 0 {first0:.2f} dB")
    evals = list(ck.get("decoder_evals", [])) or [dict(step=0, heldout_psnr=whole,
                                                       heldout_first_frame_psnr=first0)]
    curve = list(ck.get("decoder_curve", []))
    # What the rollouts' part of the training was, for the card (carried on when resumed).
    generated = ck.get("decoder_generated")
    if generated_share:
        generated = dict(share=generated_share, rollouts=len(roll_raw))
    rng = np.random.default_rng(len(curve) + 11)
    clock, step, last_eval = T.RunClock(), 0, 0.0

    def save():
        torch.save(dict(state=vae.state_dict(), curve=ck["curve"], decoder_curve=curve,
                        decoder_evals=evals, config=T.VAE_CFG, decoder_generated=generated,
                        runs=ck.get("runs", [])), out)

    while clock() < 60 * minutes:
        frac = clock() / (60 * minutes)
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * frac))
        if generated_share and rng.random() < generated_share:
            i = int(rng.integers(len(roll_raw)))
            x = T.to_video(roll_videos[i])[None]
            y = vae.decode(roll_raw[i:i + 1]).sample
        elif rng.random() < whole_share:
            i = int(rng.integers(len(raw)))
            x = T.to_video(np.ascontiguousarray(T.clip_of(videos, i)))[None]
            y = vae.decode(raw[i:i + 1]).sample
        else:
            # A batch of 64×64 crops of the first block (latent frames 0–2, pixel frames
            # 0–8): a latent frame decodes as a clip's first only at the start, so
            # windows start there; a twelfth of a whole clip's cost each.
            xs, zs, f = [], [], T.FOLD
            n = 64 // f  # the crop's latent side
            for _ in range(4):
                i = int(rng.integers(len(raw)))
                v = T.clip_of(videos, i)[:9]
                a, b = int(rng.integers(0, T.h - n + 1)), int(rng.integers(0, T.w - n + 1))
                zs.append(raw[i, :, :3, a:a + n, b:b + n])
                xs.append(T.to_video(np.ascontiguousarray(v[:, f * a:f * a + 64, f * b:f * b + 64])))
            x = torch.stack(xs)
            y = vae.decode(torch.stack(zs)).sample
        loss = T.l1_l2(y - x) + first * T.l1_l2(y[:, :, 0] - x[:, :, 0])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        with torch.no_grad():
            mse = ((y.clamp(-1, 1) - x) ** 2).mean(dim=(0, 1, 3, 4))
        psnr = 10 * math.log10(4.0 / max(mse.mean().item(), 1e-10))
        psnr0 = 10 * math.log10(4.0 / max(mse[0].item(), 1e-10))
        curve.append(dict(step=len(curve), loss=loss.item(), psnr=psnr, first_psnr=psnr0,
                          seconds=round(clock(), 1)))
        if step % 10 == 0:
            T.log(f"decoder {step}: loss {loss.item():.4f} psnr {psnr:.2f} frame 0 {psnr0:.2f} dB "
                  f"lr {opt.param_groups[0]['lr']:.2e} ({clock():.0f} s)")
        step += 1
        if clock() - last_eval > 900:
            whole, first0, _ = T.vae_psnr(vae, held)
            evals.append(dict(step=len(curve), heldout_psnr=whole, heldout_first_frame_psnr=first0))
            T.log(f"decoder {step}: held-out PSNR {whole:.2f} dB, frame 0 {first0:.2f} dB")
            last_eval = clock()
            save()
    whole, first0, _ = T.vae_psnr(vae, held)
    evals.append(dict(step=len(curve), heldout_psnr=whole, heldout_first_frame_psnr=first0))
    T.log(f"decoder done at step {step}: held-out PSNR {whole:.2f} dB, frame 0 {first0:.2f} dB")
    save()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", required=True, choices=["init", "rollouts", "decoder"])
    ap.add_argument("--work", type=pathlib.Path, required=True)
    ap.add_argument("--model", type=pathlib.Path, default=REPO / "models" / "world")
    ap.add_argument("--minutes", type=float, default=60.0, help="decoder: CPU-time budget")
    ap.add_argument("--first", type=float, default=1.0, help="decoder: weight of frame 0's term")
    ap.add_argument("--lr", type=float, default=2e-4, help="decoder: peak learning rate")
    ap.add_argument("--whole-share", type=float, default=0.25,
                    help="decoder: share of steps on a whole clip (the rest: crops of the first block)")
    ap.add_argument("--rollouts", type=int, default=240, help="rollouts: clips to generate")
    ap.add_argument("--headroom", type=pathlib.Path, default=REPO / "target" / "release" / "headroom",
                    help="rollouts: the binary that generates them")
    ap.add_argument("--generated-share", type=float, default=0.0,
                    help="decoder: share of steps from a rollout's latents to its true frames")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    diffusers.utils.logging.set_verbosity_error()
    a.work.mkdir(parents=True, exist_ok=True)
    if a.stage == "init":
        stage_init(a.work, a.model)
    elif a.stage == "rollouts":
        committed_vae(a.model)  # the sizes
        stage_rollouts(a.work, a.model, a.headroom, a.rollouts)
    else:
        committed_vae(a.model)  # the VAE's shape
        stage_decoder(a.work, a.minutes, a.first, a.lr, a.whole_share, a.generated_share)


if __name__ == "__main__":
    main()
