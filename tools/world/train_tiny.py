#!/usr/bin/env python3
"""Trains `world`'s own tiny decoder: TAEHV's decoder architecture (github.com/madebyollin/
taehv; our own PyTorch module here, built from its description) at narrow widths,
distilled from `world`'s full VAE decoder on the renderer's clips.

The tiny decoder reads the DiT's latents (the VAE's posterior means normalised by the
per-channel statistics of models/world/vae/config.json) and is trained to give what the
full decoder gives for them (L1 + L2, in [0, 1]); the truth frames are only measured.
Stages (resumable under --work):

  data    render --clips training clips (seeds 2000 and up) and --held held-out ones
          (seeds 300000 and up), 33 frames each, random key scripts
  encode  the full VAE's posterior means of every clip, their DiT-space latents and the
          full decode of those means (the teacher)
  train   the tiny decoder for --minutes (Adam, lr 1e-3 then cosine to 1e-4, batch 4);
          with --rollouts (finetune.py's rollouts.npz), a --rollout-share of the batches
          are the DiT's latents from `headroom generate` against their true frames, as the
          full decoder's fine-tune had them
  export  models/world/tiny_decoder.safetensors (f32, TAEHV's decoder.{index} keys) and
          models/world/tiny_decoder.json: held-out PSNR against the truth and against the
          full decode, the widths, time strides and the training's length

The decoder has one x2 upsample stage per entry of --strides (each the frames its TGrow
makes of one) and --widths one entry more (each stage's width, then the output conv's):
the default `--widths 32,24,16,16 --strides 1,2,2` is TAEHV's three stages (8x space, 4x
time) for an 8x VAE; `--widths 32,24,16 --strides 2,2` is two stages (4x space, 4x time)
for a VAE with 4x spatial compression. The layer indices, and so the file's keys, follow
taehv.py's Sequential for any stage count (six layers a stage, the last conv at 4 + 6 N).

    ~/.headroom-reference/bin/python tools/world/train_tiny.py --work /tmp/world-tiny
"""

import argparse
import json
import math
import multiprocessing
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import render  # noqa: E402
from diffusers import AutoencoderKLWan  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
WORLD = REPO / "models" / "world"  # --model's default
FRAMES = 33
KEYS = "wasdjlik-"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def key_script(rng, n=9):
    """A key set per latent frame, changing every few frames."""
    out, key = "", rng.choice(list(KEYS))
    while len(out) < n:
        out += key * int(rng.integers(1, 4))
        key = rng.choice(list(KEYS))
    return out[:n]


def _render(job):
    seed, script = job
    return render.render(seed, script, FRAMES)


def stage_data(work, clips, held):
    path = work / "clips.npz"
    if path.exists():
        return
    rng = np.random.default_rng(77)
    jobs = [(2000 + i, key_script(rng)) for i in range(clips)]
    jobs += [(300_000 + i, key_script(rng)) for i in range(held)]
    t0 = time.time()
    with multiprocessing.Pool(2) as pool:
        videos = list(pool.imap(_render, jobs, chunksize=2))
    log(f"data: {len(videos)} clips in {time.time() - t0:.0f} s")
    np.savez(path, train=np.stack(videos[:clips]), held=np.stack(videos[clips:]))


def to_video(frames):
    """uint8 [F, H, W, 3] -> f32 [3, F, H, W] in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(frames)).permute(3, 0, 1, 2).float() / 127.5 - 1.0


@torch.no_grad()
def stage_encode(work, folder):
    path = work / "teacher.pt"
    if path.exists():
        return
    vae = AutoencoderKLWan.from_pretrained(folder / "vae", torch_dtype=torch.float32).eval()
    cfg = json.loads((folder / "vae" / "config.json").read_text())
    mean = torch.tensor(cfg["latents_mean"]).view(1, -1, 1, 1, 1)
    std = torch.tensor(cfg["latents_std"]).view(1, -1, 1, 1, 1)
    data = np.load(work / "clips.npz")
    out = {}
    for split in ("train", "held"):
        lat, full, truth = [], [], []
        for i, clip in enumerate(data[split]):
            for mirrored in (False, True) if split == "train" else (False,):
                frames = clip[:, :, ::-1] if mirrored else clip
                x = to_video(frames)[None]
                z = vae.encode(x).latent_dist.mode()
                y = vae.decode(z).sample.clamp(-1, 1)
                lat.append(((z - mean) / std)[0])
                full.append(((y + 1) / 2)[0].half())
                truth.append(((x + 1) / 2)[0].half())
            if i % 20 == 0:
                log(f"encode {split}: {i}/{len(data[split])}")
        out[split] = dict(latents=torch.stack(lat), full=torch.stack(full), truth=torch.stack(truth))
    torch.save(out, path)


class MemBlock(nn.Module):
    """relu(f(cat[x, past]) + x), f three 3x3 convs with ReLUs between."""

    def __init__(self, n):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(2 * n, n, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(n, n, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(n, n, 3, padding=1))

    def forward(self, x, past):
        return F.relu(self.conv(torch.cat([x, past], 1)) + x)


class TGrow(nn.Module):
    """A 1x1 conv to n*stride channels whose groups become successive frames."""

    def __init__(self, n, stride):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n, n * stride, 1, bias=False)

    def forward(self, x):
        nt, c, h, w = x.shape
        return self.conv(x).reshape(nt * self.stride, c, h, w)


class Clamp(nn.Module):
    def forward(self, x):
        return torch.tanh(x / 3) * 3


class TinyDecoder(nn.Module):
    """TAEHV's decoder layout (indices are the checkpoint keys' decoder.{index}) with one
    stage per time stride: `widths` holds each stage's width and the output conv's."""

    def __init__(self, latent, widths, strides=(1, 2, 2)):
        super().__init__()
        if not 1 <= len(strides) <= 8 or len(widths) != len(strides) + 1:
            raise ValueError(f"widths {list(widths)} and strides {list(strides)}: 1 to 8 stages "
                             "(one stride each) and one width more than the stages")
        if min(widths) < 1 or min(strides) < 1:
            raise ValueError(f"widths {list(widths)} and strides {list(strides)} must be at least 1")
        layers = [Clamp(), nn.Conv2d(latent, widths[0], 3, padding=1), nn.ReLU()]
        for k, s in enumerate(strides):
            layers += [MemBlock(widths[k]) for _ in range(3)]
            layers += [nn.Upsample(scale_factor=2), TGrow(widths[k], s),
                       nn.Conv2d(widths[k], widths[k + 1], 3, padding=1, bias=False)]
        layers += [nn.ReLU(), nn.Conv2d(widths[-1], 3, 3, padding=1)]
        self.decoder = nn.Sequential(*layers)
        self.trim = math.prod(strides) - 1

    def forward(self, z):
        """DiT latents [N, C, T, h, w] -> frames [N, 3, T', H, W] in [0, 1] (unclamped)."""
        n, _, t = z.shape[:3]
        x = z.permute(0, 2, 1, 3, 4).reshape(n * t, *z.shape[1:2], *z.shape[3:])
        for layer in self.decoder:
            if isinstance(layer, MemBlock):
                frames = x.shape[0] // n
                seq = x.reshape(n, frames, *x.shape[1:])
                past = F.pad(seq, (0, 0, 0, 0, 0, 0, 1, 0))[:, :frames].reshape(x.shape)
                x = layer(x, past)
            else:
                x = layer(x)
        frames = x.shape[0] // n
        x = x.reshape(n, frames, *x.shape[1:])[:, self.trim:]
        return x.permute(0, 2, 1, 3, 4)


def psnr(a, b):
    """Mean PSNR over frames of [0, 1] videos [3, F, H, W]."""
    mse = ((a.float() - b.float()) ** 2).mean(dim=(0, 2, 3))
    return float(np.mean([10 * math.log10(1.0 / max(m.item(), 1e-10)) for m in mse]))


@torch.no_grad()
def evaluate(model, held):
    to_full, to_truth, full_truth = [], [], []
    for z, full, truth in zip(held["latents"], held["full"], held["truth"]):
        y = model(z[None])[0].clamp(0, 1)
        to_full.append(psnr(y, full))
        to_truth.append(psnr(y, truth))
        full_truth.append(psnr(full, truth))
    return dict(psnr_vs_full_decode=float(np.mean(to_full)), psnr_vs_truth=float(np.mean(to_truth)),
                full_decode_psnr_vs_truth=float(np.mean(full_truth)))


def stage_train(work, widths, strides, minutes, batch, resume=False, max_lr=1e-3,
                rollouts=None, rollout_share=0.0):
    """Trains for `minutes` (lr cosine from `max_lr` to 1e-4); with `resume`, the saved
    decoder further (a fresh optimiser, its own widths and strides), its steps and minutes
    added to the record."""
    path = work / "tiny.pt"
    if path.exists() and not resume:
        return
    data = torch.load(work / "teacher.pt")
    train, held = data["train"], data["held"]
    torch.manual_seed(0)
    before = dict(steps=0, seconds=0.0, curve=[])
    if resume:
        before = torch.load(path)
        widths, strides = before["widths"], before.get("strides", [1, 2, 2])
    model = TinyDecoder(train["latents"].shape[1], widths, strides)
    if resume:
        model.load_state_dict(before["state"])
    with torch.no_grad():
        out = model(train["latents"][:1]).shape[1:]
    if out != train["full"].shape[1:]:
        raise SystemExit(f"--widths {widths} --strides {strides} decode a clip to {list(out)}, and the "
                         f"VAE's decode is {list(train['full'].shape[1:])}: give one stage per x2 of the "
                         "VAE's spatial compression, strides multiplying to its temporal one")
    if rollouts:
        roll = np.load(rollouts)
        roll_latents, roll_videos = torch.from_numpy(roll["latents"]), roll["videos"]
    opt = torch.optim.Adam(model.parameters(), lr=max_lr)
    t0, step, curve = time.time(), before["steps"], list(before["curve"])
    budget = minutes * 60
    while time.time() - t0 < budget:
        frac = (time.time() - t0) / budget
        for g in opt.param_groups:
            g["lr"] = 1e-4 + 0.5 * (max_lr - 1e-4) * (1 + math.cos(math.pi * frac))
        if rollouts and torch.rand(1).item() < rollout_share:
            idx = torch.randint(0, len(roll_latents), (batch,))
            y = model(roll_latents[idx])
            d = y - torch.stack([(to_video(roll_videos[int(i)]) + 1) / 2 for i in idx])
        else:
            idx = torch.randint(0, len(train["latents"]), (batch,))
            y = model(train["latents"][idx])
            d = y - train["full"][idx].float()
        loss = d.abs().mean() + (d ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % 100 == 0:
            ev = evaluate(model, held)
            curve.append(dict(step=step, seconds=time.time() - t0, loss=loss.item(), **ev))
            log(f"step {step}: loss {loss.item():.4f}, held-out {ev['psnr_vs_full_decode']:.2f} dB vs full, "
                f"{ev['psnr_vs_truth']:.2f} dB vs truth")
    runs = before.get("runs", []) + [dict(steps=step - before["steps"], minutes=minutes,
                                          rollouts=str(rollouts) if rollouts else None,
                                          rollout_share=rollout_share)]
    torch.save(dict(state=model.state_dict(), widths=widths, strides=strides, steps=step,
                    seconds=before["seconds"] + time.time() - t0, curve=curve, runs=runs), path)


def stage_export(work, folder):
    run = torch.load(work / "tiny.pt")
    data = torch.load(work / "teacher.pt")
    strides = run.get("strides", [1, 2, 2])
    model = TinyDecoder(data["train"]["latents"].shape[1], run["widths"], strides)
    model.load_state_dict(run["state"])
    model.eval()
    ev = evaluate(model, data["held"])
    tensors = {k: v.float().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, folder / "tiny_decoder.safetensors")
    report = dict(architecture="TAEHV decoder (taehv.py's layout and keys)", widths=run["widths"],
                  time_strides=list(strides), parameters=sum(v.numel() for v in tensors.values()),
                  train_clips=len(data["train"]["latents"]), held_out_clips=len(data["held"]["latents"]),
                  steps=run["steps"], minutes=run["seconds"] / 60, loss="L1 + L2 against the full decode"
                  + ("; in a share of the steps, the DiT's latents from `headroom generate` against "
                     "their true frames" if any(r.get("rollouts") for r in run.get("runs", [])) else ""),
                  runs=run.get("runs", []),
                  **ev)
    (folder / "tiny_decoder.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"export: {report}")


def ints(text):
    """A comma-separated list of integers ("32,24,16")."""
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated integers") from None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", default="all", choices=["all", "data", "encode", "train", "export"])
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/world-tiny"))
    ap.add_argument("--clips", type=int, default=96)
    ap.add_argument("--held", type=int, default=8)
    ap.add_argument("--widths", type=ints, default=[32, 24, 16, 16],
                    help="each stage's width, then the output conv's (comma-separated: 32,24,16,16)")
    ap.add_argument("--strides", type=ints, default=[1, 2, 2],
                    help="frames each stage's TGrow makes of one, one per stage (1,2,2; 2,2 for 2 stages)")
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--resume", action="store_true", help="train the saved tiny decoder further")
    ap.add_argument("--max-lr", type=float, default=1e-3)
    ap.add_argument("--rollouts", type=pathlib.Path,
                    help="train: finetune.py's rollouts.npz (the DiT's latents and their truth)")
    ap.add_argument("--rollout-share", type=float, default=0.5,
                    help="train: share of the batches from --rollouts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", type=pathlib.Path, default=WORLD,
                    help="the model folder whose vae/ teaches, and where the decoder is written")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    stages = ["data", "encode", "train", "export"] if args.stage == "all" else [args.stage]
    for stage in stages:
        if stage == "data":
            stage_data(args.work, args.clips, args.held)
        elif stage == "encode":
            stage_encode(args.work, args.model)
        elif stage == "train":
            stage_train(args.work, args.widths, args.strides, args.minutes, args.batch, args.resume,
                        args.max_lr, args.rollouts, args.rollout_share)
        else:
            stage_export(args.work, args.model)


if __name__ == "__main__":
    main()
