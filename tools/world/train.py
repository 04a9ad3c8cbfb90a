#!/usr/bin/env python3
"""Trains the `world` model: a small Wan 2.1 VAE and a small causal, image-conditioned
Wan DiT with LingBot's camera adapter, on the procedural world of ``render.py``.

Stages (each resumable, each writing under ``--work``):

  data     render ``--clips`` training clips (seeds 0..N-1, random key scripts, 33
           frames); every clip is also used mirrored left-right with a<->d, j<->l
  data-held  ``--held-clips`` more (seeds 400 and up) with one key held for the flight
  vae      reconstruction (L1 + L2) + KL on random crops of 9-frame windows
  vae-long the same on whole 33-frame clips at full size (the causal caches over the
           whole horizon), for a time budget
  encode   posterior means of every clip and its image condition, normalised by the
           per-channel latent statistics measured here (written to the VAE config)
  dit      what the engine's loop does (crates/engine/src/session.rs): 3-latent-frame
           blocks, block-causal attention to clean earlier blocks (their t = 0 commit
           forward), x0 = x_t - sigma * v at the 4 DMD timesteps (flow shift 5 unless --dit-shift), the
           36-channel condition (mask | first-frame latents), the block camera tokens
  export   a diffusers pipeline folder (transformer/ with the camera adapter's keys,
           vae/) in bf16, plus the training curves
  keep     the checkpoints a later session resumes from (--keep, models/world-next)

One forward trains all three blocks of a clip: the sequence is [clean frames at t = 0 |
noisy frames at t_b] (18 latent frames), with the noisy copy of a block seeing the
clean earlier blocks and itself, and RoPE giving both copies the same frame positions.
In 30% of the steps the clean context is the model's own x0 from the last DMD step's
noise level (no gradient), as the engine commits its own output, not the truth.

    ~/.headroom-reference/bin/python tools/world/train.py --stage all --work /work/world
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
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import render  # noqa: E402
import reference_rollout as ref  # noqa: E402
import diffusers  # noqa: E402
from diffusers import AutoencoderKLWan, WanTransformer3DModel  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

FRAMES = 33
LATENT = 9
BLOCK = 3
H, W = render.HEIGHT, render.WIDTH
FOLD = 8                       # the VAE's spatial factor: the latent grid, and the rays' fold
h, w = H // FOLD, W // FOLD
TOKENS = (h // 2) * (w // 2)   # DiT tokens per latent frame
KEYS = "wasdjlik-"
MIRROR = str.maketrans("adjl", "dalj")
IO_FIRST_STEPS = 150           # a warm-started DiT's steps that train its fresh layers alone
FLOW_SHIFT = 5.0               # the DMD steps' shift (STEPWISE B2), unless --dit-shift
SELF_CONTEXT = 0.3             # share of DiT steps whose clean context is the model's own x0

VAE_CFG = dict(base_dim=16, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
               temperal_downsample=[False, True, True], attn_scales=[])
DIT_CFG = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=64,
               in_channels=36, out_channels=16, text_dim=16, freq_dim=64, ffn_dim=1024,
               num_layers=6, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
               eps=1e-6, rope_max_seq_len=1024)


def configure(z_dim, base_dim, res_blocks, spatial=8):
    """Sets the VAE's latent channels, width, depth and spatial compression (8: Wan's
    three downsamples, the first spatial only; 4: two, both in space and time); the
    DiT's channels follow z_dim, and its patch the compression: 2x2 on an 8x latent
    grid, 4x4 on a 4x one, so that a latent frame is the same 48 tokens either way."""
    global FOLD, h, w, TOKENS
    VAE_CFG.update(z_dim=z_dim, base_dim=base_dim, num_res_blocks=res_blocks)
    if spatial == 4:
        VAE_CFG.update(dim_mult=[1, 2, 2], temperal_downsample=[True, True])
    patch = 16 // spatial
    FOLD, h, w = spatial, H // spatial, W // spatial
    TOKENS = (h // patch) * (w // patch)
    DIT_CFG.update(in_channels=2 * z_dim + 4, out_channels=z_dim, patch_size=(1, patch, patch))


def key_script(rng, n=LATENT):
    """A random key script: runs of one key set, sometimes two keys at once."""
    out, cur = [], rng.choice(list(KEYS))
    for _ in range(n):
        if rng.random() < 0.45:
            cur = rng.choice(list(KEYS))
        out.append(cur)
    return "".join(out)


class RunClock:
    """Seconds of training run: this process's CPU time over the threads torch runs on, so
    a time budget and a schedule that follows it are spent on steps, not on pauses (a
    SIGSTOP while benchmarks run) nor on waiting for cores other work holds (a build or
    CI beside it at nice 19 starved it for half an hour once, and wall time counted it)."""

    def __init__(self, spent=0.0):
        self.spent, self.last = spent, time.process_time()

    def __call__(self):
        now = time.process_time()
        self.spent += (now - self.last) / max(1, torch.get_num_threads())
        self.last = now
        return self.spent


def log(msg):
    print(time.strftime("%H:%M:%S"), msg, flush=True)


# ----------------------------------------------------------------------------------
# data

def _render_clip(args):
    seed, script = args
    return render.render(seed, script, FRAMES)


def stage_data(work, clips):
    path = work / "clips.npz"
    if path.exists():
        return
    rng = np.random.default_rng(1234)
    scripts = [key_script(rng) for _ in range(clips)]
    videos = np.zeros((clips, FRAMES, H, W, 3), np.uint8)
    t0 = time.time()
    with multiprocessing.Pool(2) as pool:
        for i, v in enumerate(pool.imap(_render_clip, enumerate(scripts), chunksize=4)):
            videos[i] = v
            if i % 50 == 0:
                log(f"data: clip {i}/{clips} ({time.time() - t0:.0f} s)")
    np.savez(path, videos=videos, scripts=np.array(scripts))


def held_script(rng, n=LATENT):
    """One key set held for the whole flight (what a player does most, and what the
    steering bar measures), sometimes switching to another once."""
    first = rng.choice(list("wasdjlik"))
    if rng.random() < 0.7:
        return first * n
    cut = int(rng.integers(3, n - 2))
    return first * cut + rng.choice(list("wasdjlik")) * (n - cut)


def stage_data_held(work, clips):
    """Clips of held keys (seeds 400 and up, after the mixed-script clips' seeds)."""
    path = work / "held.npz"
    if path.exists() or clips == 0:
        return
    rng = np.random.default_rng(5678)
    jobs = [(400 + i, held_script(rng)) for i in range(clips)]
    videos = np.zeros((clips, FRAMES, H, W, 3), np.uint8)
    with multiprocessing.Pool(2) as pool:
        for i, v in enumerate(pool.imap(_render_clip, jobs, chunksize=4)):
            videos[i] = v
    np.savez(path, videos=videos, scripts=np.array([s for _, s in jobs]))


def load_clips(work):
    """The mixed-script clips, then the held-key ones where `data-held` rendered them."""
    d = np.load(work / "clips.npz")
    videos, scripts = d["videos"], [str(s) for s in d["scripts"]]
    if (work / "held.npz").exists():
        e = np.load(work / "held.npz")
        videos = np.concatenate([videos, e["videos"]])
        scripts += [str(s) for s in e["scripts"]]
    return videos, scripts


def to_video(frames):
    """uint8 [F, H, W, 3] -> f32 [3, F, H, W] in [-1, 1]."""
    return torch.from_numpy(frames).permute(3, 0, 1, 2).float() / 127.5 - 1.0


# ----------------------------------------------------------------------------------
# VAE

def l1_l2(d):
    """L1 + L2 (means) of a difference."""
    return d.abs().mean() + (d ** 2).mean()


def vae_step(vae, opt, x, edge=0.0, first=0.0, bf16=False):
    """One optimiser step of L1 + L2 reconstruction (+ `edge` times the L1 of pixel
    differences, + `first` times frame 0's own L1 + L2) + 1e-4 * KL (per element) on
    `x`. Frame 0 is the image a session is given, encoded alone into its own latent
    frame: `first` buys its sharpness with that frame's spare latent capacity. `bf16`
    runs the network's products in bf16 (weights, loss and optimiser stay f32: 1.5x the
    f32 step on a Zen 4)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        post = vae.encode(x).latent_dist
        y = vae.decode(post.sample()).sample.float()
    rec = l1_l2(y - x)
    if edge:
        rec = rec + edge * edge_l1(y, x)
    if first:
        rec = rec + first * l1_l2(y[:, :, 0] - x[:, :, 0])
    kl = post.kl().mean() / x[0].numel()
    opt.zero_grad()
    (rec + 1e-4 * kl).backward()
    torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
    opt.step()
    return rec, kl, y


def heldout_clips(n=4):
    """`n` clips of held-out seeds (100000 and up, never trained on) with moving key
    scripts: the VAE's held-out reconstruction set."""
    rng = np.random.default_rng(4321)
    return [render.render(100_000 + i, key_script(rng).replace("-", "w"), FRAMES)
            for i in range(n)]


@torch.no_grad()
def vae_psnr(vae, clips):
    """(mean PSNR over whole clips, mean PSNR of frame 0, mean PSNR of frame 0 with the
    clip's RGB channels rotated) decoding posterior means."""
    whole, first, rotated = [], [], []
    db = lambda m: 10 * math.log10(4.0 / max(m, 1e-10))
    for n, v in enumerate(clips):
        x = to_video(v)[None]
        y = vae.decode(vae.encode(x).latent_dist.mode()).sample.clamp(-1, 1)
        mse = ((y - x) ** 2).mean(dim=(0, 1, 3, 4))
        whole.append(float(np.mean([db(m.item()) for m in mse])))
        first.append(db(mse[0].item()))
        x0 = to_video(np.ascontiguousarray(v[:1, ..., [(1 + n) % 3, (2 + n) % 3, n % 3]]))[None]
        y0 = vae.decode(vae.encode(x0).latent_dist.mode()).sample.clamp(-1, 1)
        rotated.append(db(((y0 - x0) ** 2).mean().item()))
    return float(np.mean(whole)), float(np.mean(first)), float(np.mean(rotated))


def recolour(clip, rng, share):
    """uint8 [F, H, W, 3] with its RGB channels in a random order for a `share` of the
    draws: a VAE trained on a few hundred palettes learns their colours, not colour (the
    s4 VAE's frame 0 fell from 25.2 to 20.7 dB on held-out seeds with channels permuted),
    and six orders multiply the palettes it sees."""
    if share and rng.random() < share:
        clip = clip[..., rng.permutation(3)]
    return clip


def edge_l1(y, x):
    """L1 between the horizontal and vertical pixel differences of `y` and `x`."""
    dx = lambda t: t[..., :, 1:] - t[..., :, :-1]
    dy = lambda t: t[..., 1:, :] - t[..., :-1, :]
    return (dx(y) - dx(x)).abs().mean() + (dy(y) - dy(x)).abs().mean()


def stage_vae(work, steps, minutes=0.0, edge=0.0, first=0.0, colour=0.0, init=None,
              bf16=False):
    """Crops of 9-frame windows, then (the last quarter of a time budget) whole clips.
    With `minutes` the cosine follows the clock and a checkpoint is written every 100
    steps (`vae_ckpt.pt`), from which a later run resumes. `init` starts from a trained
    VAE's weights (a fresh optimiser and schedule), to train it further on new terms."""
    out = work / "vae.pt"
    if out.exists():
        return
    videos, _ = load_clips(work)
    held = heldout_clips()
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**VAE_CFG)
    log(f"vae: {sum(p.numel() for p in vae.parameters()) / 1e6:.2f} M parameters, {VAE_CFG}")
    max_lr = 1e-3
    if init:
        vae.load_state_dict(torch.load(init)["state"])
        max_lr = 4e-4
        log(f"vae: starting from {init}")
    opt = torch.optim.AdamW(vae.parameters(), lr=max_lr, weight_decay=0.0)
    rng = np.random.default_rng(0)
    curve, step, spent, evals = [], 0, 0.0, []
    ckpt = work / "vae_ckpt.pt"
    if ckpt.exists():
        ck = torch.load(ckpt, weights_only=False)
        vae.load_state_dict(ck["state"])
        opt.load_state_dict(ck["opt"])
        curve, step, spent, evals = ck["curve"], ck["step"], ck["spent"], ck["evals"]
        rng = np.random.default_rng(step)
        log(f"vae: resumed at step {step} ({spent / 60:.1f} min spent)")
    budget = 60 * minutes
    clock = RunClock(spent)
    last_eval = clock()

    def frac():
        return min(1.0, clock() / budget) if minutes else step / steps

    while (frac() < 1.0) if minutes else step < steps:
        f = frac()
        for g in opt.param_groups:
            g["lr"] = max_lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * f))
        if f < 0.75:
            batch = []
            for _ in range(4):
                c = rng.integers(len(videos))
                f0 = 4 * rng.integers(0, (FRAMES - 9) // 4 + 1)
                y0, x0 = 8 * rng.integers(0, (H - 64) // 8 + 1), 8 * rng.integers(0, (W - 64) // 8 + 1)
                clip = videos[c, f0:f0 + 9, y0:y0 + 64, x0:x0 + 64]
                if rng.random() < 0.5:
                    clip = clip[:, :, ::-1]
                batch.append(to_video(np.ascontiguousarray(recolour(clip, rng, colour))))
            x = torch.stack(batch)
        else:
            # Whole clips: the causal caches over the whole horizon.
            c = rng.integers(len(videos))
            clip = videos[c][:, :, ::-1] if rng.random() < 0.5 else videos[c]
            x = to_video(np.ascontiguousarray(recolour(clip, rng, colour)))[None]
        rec, kl, y = vae_step(vae, opt, x, edge, first, bf16)
        psnr = 10 * math.log10(4.0 / max(((y - x) ** 2).mean().item(), 1e-10))
        curve.append(dict(step=step, rec=rec.item(), kl=kl.item(), psnr=psnr, long=f >= 0.75))
        if step % 25 == 0:
            log(f"vae {step}: rec {rec.item():.4f} kl {kl.item():.3f} psnr {psnr:.2f} dB "
                f"lr {opt.param_groups[0]['lr']:.2e} ({clock():.0f} s)")
        step += 1
        if minutes and step % 100 == 0:
            if clock() - last_eval > 600:
                whole, first_db, rotated = vae_psnr(vae.eval(), held)
                vae.train()
                evals.append(dict(step=step, minutes=round(clock() / 60, 1),
                                  heldout_psnr=whole, heldout_first_frame_psnr=first_db,
                                  heldout_first_frame_rotated_psnr=rotated))
                log(f"vae {step}: held-out PSNR {whole:.2f} dB, frame 0 {first_db:.2f} dB, "
                    f"rotated {rotated:.2f} dB")
                last_eval = clock()
            torch.save(dict(state=vae.state_dict(), opt=opt.state_dict(), curve=curve, step=step,
                            spent=clock(), evals=evals), ckpt)
    whole, first_db, rotated = vae_psnr(vae.eval(), held)
    evals.append(dict(step=step, minutes=round(clock() / 60, 1), heldout_psnr=whole,
                      heldout_first_frame_psnr=first_db, heldout_first_frame_rotated_psnr=rotated))
    log(f"vae done at step {step}: held-out PSNR {whole:.2f} dB, frame 0 {first_db:.2f} dB, "
        f"rotated {rotated:.2f} dB")
    what = (f"{'from ' + str(init) if init else 'from scratch'}: L1 + L2 + 1e-4·KL on 64×64 crops "
            f"of 9-frame windows, the last quarter on whole clips; frame 0 weighted {first}, "
            f"edges {edge}, RGB shuffled in {colour:.0%} of clips" + (", bf16 autocast" if bf16 else ""))
    runs = (torch.load(init).get("runs", []) if init else []) + [
        dict(steps=step, minutes=round(clock() / 60, 1), what=what)]
    torch.save(dict(state=vae.state_dict(), curve=curve, evals=evals, config=VAE_CFG, runs=runs), out)


def stage_vae_long(work, minutes, colour=0.0):
    """Fine-tunes the VAE on whole 33-frame clips at full size: windows of 9 frames teach
    it one chunk's worth of its causal caches, and over 33 frames it drifts without this."""
    out = work / "vae_long.pt"
    if out.exists():
        return
    videos, _ = load_clips(work)
    ck = torch.load(work / "vae.pt")
    vae = AutoencoderKLWan(**VAE_CFG)
    vae.load_state_dict(ck["state"])
    max_lr = 4e-4
    opt = torch.optim.AdamW(vae.parameters(), lr=max_lr, weight_decay=0.0)
    rng = np.random.default_rng(1)
    curve, clock, step = [], RunClock(), 0
    while clock() < 60 * minutes:
        frac = clock() / (60 * minutes)
        for g in opt.param_groups:
            g["lr"] = max_lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * frac))
        c = rng.integers(len(videos))
        clip = videos[c][:, :, ::-1] if rng.random() < 0.5 else videos[c]
        x = to_video(np.ascontiguousarray(recolour(clip, rng, colour)))[None]
        rec, kl, y = vae_step(vae, opt, x)
        psnr = 10 * math.log10(4.0 / max(((y - x) ** 2).mean().item(), 1e-10))
        curve.append(dict(step=step, rec=rec.item(), kl=kl.item(), psnr=psnr, long=True))
        if step % 10 == 0:
            log(f"vae-long {step}: rec {rec.item():.4f} psnr {psnr:.2f} dB ({clock():.0f} s)")
        step += 1
    runs = ck.get("runs", []) + [dict(steps=step, minutes=round(clock() / 60, 1),
                                      what=f"whole 33-frame clips, RGB shuffled in {colour:.0%}")]
    torch.save(dict(state=vae.state_dict(), curve=ck["curve"] + curve, runs=runs), out)


def vae_path(work):
    """The newest VAE of a work folder: a decoder fine-tune (finetune.py), the long
    fine-tune, or the first training."""
    for name in ("vae_decoder.pt", "vae_long.pt"):
        if (work / name).exists():
            return work / name
    return work / "vae.pt"


def load_vae(work):
    vae = AutoencoderKLWan(**VAE_CFG)
    vae.load_state_dict(torch.load(vae_path(work))["state"])
    return vae.eval()


# ----------------------------------------------------------------------------------
# encode

def clip_of(videos, i):
    """Sequence `i` of latents.pt's order: clip i // 2, mirrored left-right when i is odd."""
    v = videos[i // 2]
    return v[:, :, ::-1] if i % 2 else v


@torch.no_grad()
def encode_clips(vae, videos, batch=4):
    """Raw posterior means of every clip and its mirror (latents.pt's order), of the
    whole clips and of their first frames alone (the image condition), `batch` clips per
    encode; and the reconstruction PSNR of every tenth batch's first clip."""
    lat, cond, psnr = [], [], []
    t0 = time.time()
    for i0 in range(0, len(videos), batch):
        x = torch.stack([to_video(np.ascontiguousarray(clip_of(videos, i)))
                         for i in range(2 * i0, 2 * min(i0 + batch, len(videos)))])
        z = vae.encode(x).latent_dist.mode()
        first = torch.cat([x[:, :, :1], torch.zeros(x.shape[0], 3, FRAMES - 1, H, W)], 2)
        lat.extend(z)
        cond.extend(vae.encode(first).latent_dist.mode())
        if i0 % (10 * batch) == 0:
            y = vae.decode(z[:1]).sample.clamp(-1, 1)
            psnr.append(10 * math.log10(4.0 / ((y - x[:1]) ** 2).mean().item()))
            log(f"encode {i0}/{len(videos)} ({time.time() - t0:.0f} s)")
    return torch.stack(lat), torch.stack(cond), psnr


def save_latents(out, lat, cond, scripts, mean, std, vae_psnr):
    """latents.pt: raw latents normalised by the per-channel `mean` / `std`, the scripts
    with their mirrors' interleaved."""
    view = lambda t: t.view(1, -1, 1, 1, 1)
    mirrored = [s.translate(MIRROR) for s in scripts]
    torch.save(dict(latents=(lat - view(mean)) / view(std), cond=(cond - view(mean)) / view(std),
                    scripts=[s for pair in zip(scripts, mirrored) for s in pair],
                    mean=mean, std=std, vae_psnr=vae_psnr), out)


def stage_encode(work, clips=None, batch=4):
    out = work / "latents.pt"
    if out.exists():
        return
    videos, scripts = load_clips(work)
    if clips:
        videos, scripts = videos[:clips], scripts[:clips]
    lat, cond, psnr = encode_clips(load_vae(work), videos, batch)
    log(f"encode: VAE reconstruction PSNR on full clips {np.mean(psnr):.2f} dB")
    save_latents(out, lat, cond, scripts, lat.mean(dim=(0, 2, 3, 4)), lat.std(dim=(0, 2, 3, 4)),
                 float(np.mean(psnr)))


# ----------------------------------------------------------------------------------
# the transformer

def block_rays(script):
    """Folded rays [6*FOLD^2, LATENT, h, w] of the engine's per-block camera tokens."""
    pose, pitch, out = np.eye(4), 0.0, []
    for n in range(LATENT // BLOCK):
        poses = [pose]
        for ch in script[BLOCK * n:BLOCK * n + BLOCK]:
            pose, pitch = ref.controller_step(pose, pitch, ch)
            poses.append(pose)
        out.append(ref.plucker(ref.relative_framewise(poses)[1:], H, W, FOLD))
    return torch.cat(out, 1)


def camera_tokens(adapter, rays):
    """[B, 6*FOLD^2, F, h, w] -> [B, F*TOKENS, dim] (the adapter's patchify, batched)."""
    b, c, f = rays.shape[:3]
    _, ph, pw = DIT_CFG["patch_size"]
    x = rays.reshape(b, c, f, h // ph, ph, w // pw, pw).permute(0, 2, 3, 5, 1, 4, 6)
    x = adapter.patch_embedding_wancamctrl(x.reshape(b, f * TOKENS, c * ph * pw))
    return x + adapter.c2ws_hidden_states_layer2(F.silu(adapter.c2ws_hidden_states_layer1(x)))


def teacher_mask():
    """[18F, 18F] token mask: clean frames see clean earlier-or-same blocks; the noisy
    copy of block b sees clean blocks < b and its own noisy frames."""
    blk = lambda f: (f % LATENT) // BLOCK
    m = torch.zeros(2 * LATENT, 2 * LATENT, dtype=torch.bool)
    for i in range(2 * LATENT):
        for j in range(2 * LATENT):
            ci, cj = i < LATENT, j < LATENT
            if ci and cj:
                m[i, j] = blk(j) <= blk(i)
            elif not ci and cj:
                m[i, j] = blk(j) < blk(i)
            elif not ci and not cj:
                m[i, j] = blk(j) == blk(i)
    return m.repeat_interleave(TOKENS, 0).repeat_interleave(TOKENS, 1)


def build_dit():
    torch.manual_seed(1)
    model = WanTransformer3DModel(**DIT_CFG)
    dim = DIT_CFG["num_attention_heads"] * DIT_CFG["attention_head_dim"]
    adapter = ref.CameraAdapter(dim, DIT_CFG["num_layers"], DIT_CFG["patch_size"], FOLD)
    for b in adapter.blocks:  # start as the identity modulation
        for layer in (b.cam_scale_layer, b.cam_shift_layer):
            torch.nn.init.zeros_(layer.weight)
            torch.nn.init.zeros_(layer.bias)
    ref.attach_camera(model, adapter)
    base_rope = model.rope.forward

    def rope(hidden_states):
        # Both copies of a frame share its position.
        f = hidden_states.shape[2]
        if f == 2 * LATENT:
            cos, sin = base_rope(hidden_states[:, :, :LATENT])
            return torch.cat([cos, cos], 1), torch.cat([sin, sin], 1)
        return base_rope(hidden_states)

    model.rope.forward = rope
    return model, adapter


def follow_width(ck):
    """Builds the DiT at a checkpoint's width (heads of 64; tools/world/widen.py doubles it)."""
    width = ck["model"]["blocks.0.attn1.to_q.weight"].shape[0]
    DIT_CFG["num_attention_heads"] = width // DIT_CFG["attention_head_dim"]


def dit_forward(model, adapter, latents, timesteps, rays, mask):
    """v over [B, 16, F, h, w] with per-frame timesteps [B, F] and rays [B, 6*FOLD^2, F, h, w]."""
    b, _, f = latents.shape[:3]
    cam = camera_tokens(adapter, rays)
    for block in model.blocks:
        block.attn1.processor.mask = mask
        block.attn2.processor.mask = None
        block.camera_tokens = cam
    t = timesteps.repeat_interleave(TOKENS, 1)
    text = torch.zeros(b, 1, DIT_CFG["text_dim"])
    return model(hidden_states=latents, timestep=t, encoder_hidden_states=text,
                 return_dict=False)[0]


def ray_patch_order(fold, patch, side):
    """Column of each ray value (channel, row, column of a token's side x side pixels) in
    the adapter's patch features at a fold and patch with fold * patch = side."""
    ch, row, col = np.meshgrid(np.arange(6), np.arange(side), np.arange(side), indexing="ij")
    cell = (ch * fold + row % fold) * fold + col % fold
    return (cell * patch * patch + (row // fold) * patch + col // fold).reshape(-1)


ADAPTER_KEYS = ("patch_embedding_wancamctrl.", "c2ws_hidden_states_layer")


def load_dit_checkpoint(path):
    """A dit.pt, or an exported model folder (its transformer/ safetensors, bf16 widened to
    f32, split back into the network's and the camera adapter's tensors)."""
    path = pathlib.Path(path)
    if not path.is_dir():
        return torch.load(path)
    weights = load_file(path / "transformer" / "diffusion_pytorch_model.safetensors")
    weights = {k: v.float() for k, v in weights.items()}
    adapter = {k: v for k, v in weights.items() if k.startswith(ADAPTER_KEYS) or ".cam_" in k}
    model = {k: v for k, v in weights.items() if not k.startswith(ADAPTER_KEYS)}
    steps = json.loads((path / "training.json").read_text()).get("dit_steps", 0) \
        if (path / "training.json").exists() else 0
    return dict(model=model, adapter=adapter, steps=steps)


def warm_start(model, adapter, path):
    """Starts a DiT from one trained on another VAE's latents: every block, the embedders
    and the camera adapter carry over; the latent patch embedding and the output projection,
    the only layers that see the latent layout, start fresh. A token's rays cover the same
    16x16 pixels at any fold, so the adapter's patch embedding has its columns permuted
    to this fold, not re-learnt."""
    ck = load_dit_checkpoint(path)
    src = ck["model"]
    patch = src["patch_embedding.weight"].shape[-1]
    width = ck["adapter"]["patch_embedding_wancamctrl.weight"].shape[1]
    fold = math.isqrt(width // (6 * patch * patch))
    side, (_, p, _) = fold * patch, DIT_CFG["patch_size"]
    assert side == FOLD * p, f"a token covers {side} pixels there, {FOLD * p} here"
    own = model.state_dict()
    keep = {k: v for k, v in src.items()
            if k in own and v.shape == own[k].shape and not k.startswith(("patch_embedding.", "proj_out."))}
    model.load_state_dict(keep, strict=False)
    cam = dict(ck["adapter"])
    wt = cam["patch_embedding_wancamctrl.weight"]
    moved = torch.empty_like(wt)
    moved[:, torch.from_numpy(ray_patch_order(FOLD, p, side))] = \
        wt[:, torch.from_numpy(ray_patch_order(fold, patch, side))]
    cam["patch_embedding_wancamctrl.weight"] = moved
    adapter.load_state_dict(cam)
    log(f"dit: warm start from {path} ({ck['steps']} steps, fold {fold} -> {FOLD}): "
        f"{len(keep)} of {len(own)} tensors carried over")
    return dict(init=str(path), init_steps=ck["steps"])


def stage_dit(work, steps, batch, minutes, resume=False, camera_lr_mult=1.0, bf16=False,
              max_lr=4e-4, init=None, held_share=0.0, self_context=SELF_CONTEXT,
              rollout_context=False, shift=None):
    out = work / "dit.pt"
    if out.exists() and not resume:
        return
    data = torch.load(work / "latents.pt")
    lat, cond, scripts = data["latents"], data["cond"], data["scripts"]
    rays = torch.stack([block_rays(s) for s in scripts])
    # Held-key sequences (one key for at least the first 5 latent frames, as data-held
    # renders them): a curriculum draws them more often.
    held = torch.tensor([i for i, s in enumerate(scripts) if len(set(s[:5])) == 1 and s[0] != "-"])
    msk = torch.zeros(1, 4, LATENT, h, w)
    msk[:, :, 0] = 1.0
    before = {"curve": [], "steps": 0}
    if resume:
        # Continue from the saved DiT with a fresh warm-up and cosine (no optimiser state).
        before = torch.load(out)
        follow_width(before)
    # The 4 DMD steps' flow shift: the checkpoint's unless given (a resumed DiT learns the
    # new steps' noise levels); the export writes it into the model's config for the engine.
    shift = shift or before.get("shift", FLOW_SHIFT)
    timesteps, sigmas = ref.dmd_schedule(4, shift)
    log(f"dit: flow shift {shift}, sigmas {[round(x, 3) for x in sigmas]}")
    timesteps, sigmas = torch.tensor(timesteps).float(), torch.tensor(sigmas).float()
    model, adapter = build_dit()
    if resume:
        model.load_state_dict(before["model"])
        adapter.load_state_dict(before["adapter"])
    started = warm_start(model, adapter, init) if init and not resume else {}
    # The adapter's per-block layers are attached to the blocks too: count each once.
    params = list({id(p): p for p in [*model.parameters(), *adapter.parameters()]}.values())
    log(f"dit: {sum(p.numel() for p in params) / 1e6:.2f} M parameters, {len(lat)} clips")
    # The camera adapter's own parameters may learn faster than the network it steers.
    camera = {id(p) for p in adapter.parameters()}
    # A warm start trains its fresh input and output layers alone at first, so that
    # their random gradients do not undo the carried-over blocks (linear probe, then
    # fine-tune).
    fresh = {id(p) for p in [*model.patch_embedding.parameters(), *model.proj_out.parameters()]}
    probe = IO_FIRST_STEPS if started else 0
    groups = [dict(params=[p for p in params if id(p) not in camera | fresh], mult=1.0),
              dict(params=[p for p in params if id(p) in camera], mult=camera_lr_mult),
              dict(params=[p for p in params if id(p) in fresh], mult=1.0, fresh=True)]
    opt = torch.optim.AdamW(groups, lr=max_lr, weight_decay=0.01, betas=(0.9, 0.99))

    def lr_at(step, elapsed, start=0):
        # Linear warm-up from `start`, then a cosine to zero over the step budget or, when
        # a time budget is set, over the time budget (a shared 2-core machine runs at a
        # speed nobody can promise).
        warm = min(1.0, max(0, step + 1 - start) / 100)
        frac = step / steps if not minutes else min(1.0, elapsed / (60 * minutes))
        return max_lr * warm * 0.5 * (1 + math.cos(math.pi * frac))

    def save(step):
        """dit.pt: the weights and the whole curve, this run's steps after the earlier."""
        done = before["steps"]
        offset = before["curve"][-1]["seconds"] if before["curve"] else 0.0
        mine = [dict(c, step=c["step"] + done, seconds=c["seconds"] + offset) for c in curve]
        run = dict(steps=step + 1, minutes=round(clock() / 60, 1), max_lr=max_lr,
                   camera_lr_mult=camera_lr_mult, bf16=bf16, clips=len(lat), shift=shift,
                   **started)
        if held_share:
            run["held_share"] = held_share
        if rollout_context or self_context != SELF_CONTEXT:
            run.update(self_context=self_context, rollout_context=rollout_context)
        torch.save(dict(model=model.state_dict(), adapter=adapter.state_dict(),
                        curve=before["curve"] + mine, steps=done + step + 1, batch=batch, shift=shift,
                        runs=before.get("runs", []) + [run]), out)

    mask = teacher_mask()
    # Mixed precision: bf16 products (oneDNN's AVX512-BF16 / AMX kernels, about 1.5x the
    # f32 step on a Zen 4), f32 weights, optimiser and loss.
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
    gen = torch.Generator().manual_seed(7)
    curve, clock = [], RunClock()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, clock(), 0 if "fresh" in g else probe) * g["mult"]
        idx = torch.randint(len(lat), (batch,), generator=gen)
        if held_share and len(held):
            pick = torch.rand(batch, generator=gen) < held_share
            idx[pick] = held[torch.randint(len(held), (int(pick.sum()),), generator=gen)]
        x0 = lat[idx]
        c = torch.cat([msk.expand(batch, -1, -1, -1, -1), cond[idx]], 1)
        k = torch.randint(4, (batch, LATENT // BLOCK), generator=gen)
        sig = sigmas[k].repeat_interleave(BLOCK, 1)[:, None, :, None, None]
        eps = torch.randn(x0.shape, generator=gen)
        xt = (1 - sig) * x0 + sig * eps
        r = rays[idx]
        ctx = x0
        own_context = torch.rand(1, generator=gen).item() < self_context
        if own_context and rollout_context:
            # The engine's block 0 starts from pure noise with only the image before it,
            # and the later blocks see what it made: sample every block over the 4 DMD
            # steps from pure noise, each seeing the truth's earlier blocks, and train on
            # those samples as context (frame 0 stays the image, as keep_first_frame has it).
            with torch.no_grad():
                xs = torch.randn(x0.shape, generator=gen)
                for j in range(4):
                    inp_j = torch.cat([torch.cat([x0, xs], 2), torch.cat([c, c], 2)], 1)
                    ts_j = torch.cat([torch.zeros(batch, LATENT),
                                      torch.full((batch, LATENT), float(timesteps[j]))], 1)
                    with autocast():
                        v_j = dit_forward(model, adapter, inp_j, ts_j, torch.cat([r, r], 2), mask)
                    est = xs - sigmas[j] * v_j[:, :, LATENT:].float()
                    if j < 3:
                        xs = (1 - sigmas[j + 1]) * est + sigmas[j + 1] * torch.randn(x0.shape, generator=gen)
                ctx = torch.cat([x0[:, :, :1], est[:, :, 1:]], 2)
        elif own_context:
            # The engine commits its own last-step x0, not the truth: sometimes train on
            # that kind of context (the model's x0 from the last DMD step's noise level).
            with torch.no_grad():
                s3 = sigmas[-1]
                x3 = (1 - s3) * x0 + s3 * torch.randn(x0.shape, generator=gen)
                inp3 = torch.cat([torch.cat([x0, x3], 2), torch.cat([c, c], 2)], 1)
                ts3 = torch.cat([torch.zeros(batch, LATENT),
                                 torch.full((batch, LATENT), float(timesteps[-1]))], 1)
                with autocast():
                    v3 = dit_forward(model, adapter, inp3, ts3, torch.cat([r, r], 2), mask)
                ctx = x3 - s3 * v3[:, :, LATENT:].float()
        inp = torch.cat([torch.cat([ctx, xt], 2), torch.cat([c, c], 2)], 1)
        ts = torch.cat([torch.zeros(batch, LATENT),
                        timesteps[k].repeat_interleave(BLOCK, 1)], 1)
        with autocast():
            v = dit_forward(model, adapter, inp, ts, torch.cat([r, r], 2), mask)[:, :, LATENT:]
        pred = xt - sig * v.float()
        err = ((pred - x0) ** 2).mean(dim=(1, 3, 4))  # [B, F]
        loss = err.mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        per_sigma = [err.detach().view(batch, -1, BLOCK).mean(2)[k == i].mean().item()
                     if (k == i).any() else None for i in range(4)]
        curve.append(dict(step=step, loss=loss.item(), per_step=per_sigma,
                          lr=opt.param_groups[0]["lr"], seconds=round(clock(), 1)))
        if step % 20 == 0:
            log(f"dit {step}/{steps}: x0 mse {loss.item():.4f} per DMD step "
                f"{[None if p is None else round(p, 4) for p in per_sigma]} ({clock():.0f} s)")
        if step % 200 == 199:
            save(step)  # a session may end without warning: resume with --dit-resume
        if minutes and clock() > 60 * minutes:
            log(f"dit: time budget reached at step {step}")
            break
    save(step)


# ----------------------------------------------------------------------------------
# export

def stage_export(work, folder):
    data = torch.load(work / "latents.pt")
    vae = load_vae(work)
    vae.register_to_config(latents_mean=[round(float(x), 6) for x in data["mean"]],
                           latents_std=[round(float(x), 6) for x in data["std"]])
    (folder / "vae").mkdir(parents=True, exist_ok=True)
    vae.to(torch.bfloat16).save_pretrained(folder / "vae")
    ck = torch.load(work / "dit.pt")
    follow_width(ck)
    model = WanTransformer3DModel(**DIT_CFG)
    own = {k: v for k, v in ck["model"].items() if ".cam_" not in k}
    model.load_state_dict(own)
    # headroom's own key (diffusers ignores it): block 0's latent frame 0 is the given
    # image's latents, not the network's x0.
    model.register_to_config(keep_first_frame=True)
    # And the flow shift of the DMD steps it was trained at: the engine's default for it.
    model.register_to_config(flow_shift=ck.get("shift", FLOW_SHIFT))
    model.to(torch.bfloat16).save_pretrained(folder / "transformer")
    path = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    weights = load_file(path)
    for k, v in ck["adapter"].items():
        weights[k] = v.to(torch.bfloat16).contiguous()
    save_file(weights, path, metadata={"format": "pt"})
    vck = torch.load(vae_path(work))
    curves = dict(vae=vck["curve"], dit=ck["curve"], dit_steps=ck["steps"],
                  dit_runs=ck.get("runs", []), vae_runs=vck.get("runs", []),
                  vae_decoder=vck.get("decoder_curve", []),
                  vae_decoder_evals=vck.get("decoder_evals", []),
                  vae_decoder_generated=vck.get("decoder_generated"),
                  dit_batch=ck["batch"], vae_psnr_full_clips=data["vae_psnr"])
    (folder / "training.json").write_text(json.dumps(curves))
    log(f"export: wrote {folder}")


def stage_keep(work, folder):
    """Copies the work folder's checkpoints where a later session resumes from them
    (`--keep`, e.g. models/world-next): the newest VAE as it is, the DiT with its weights
    in bf16 (half the bytes; `--dit-resume` widens them back to f32 at load). Resume by
    copying them into a work folder, rendering and encoding there, then `--dit-resume`."""
    import shutil
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(vae_path(work), folder / "vae.pt")
    if (work / "dit.pt").exists():
        ck = torch.load(work / "dit.pt")
        for part in ("model", "adapter"):
            ck[part] = {k: v.to(torch.bfloat16) for k, v in ck[part].items()}
        torch.save(ck, folder / "dit.pt")
    log(f"keep: wrote {folder}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", default="all", choices=["all", "data", "data-held", "vae", "vae-long", "encode", "dit", "export",
                             "keep"])
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/world-train"))
    ap.add_argument("--out", type=pathlib.Path,
                    default=pathlib.Path(__file__).resolve().parents[2] / "models" / "world")
    ap.add_argument("--clips", type=int, default=320)
    ap.add_argument("--vae-steps", type=int, default=900)
    ap.add_argument("--dit-steps", type=int, default=100_000)
    ap.add_argument("--dit-batch", type=int, default=4)
    ap.add_argument("--dit-minutes", type=float, default=0.0,
                    help="train the DiT for this long (the cosine schedule follows the clock)")
    ap.add_argument("--vae-long-minutes", type=float, default=18.0)
    ap.add_argument("--vae-minutes", type=float, default=0.0,
                    help="train the VAE for this long (crops, then whole clips for the last quarter)")
    ap.add_argument("--vae-edge", type=float, default=0.0, help="weight of the edge (pixel difference) term")
    ap.add_argument("--vae-first", type=float, default=0.0,
                    help="weight of frame 0's own reconstruction term (the session's given image)")
    ap.add_argument("--vae-colour", type=float, default=0.0,
                    help="share of VAE training clips with their RGB channels shuffled")
    ap.add_argument("--vae-bf16", action="store_true",
                    help="train the VAE in mixed precision (bf16 products, f32 weights and loss)")
    ap.add_argument("--vae-init", type=pathlib.Path,
                    help="start the VAE stage from this trained VAE (vae.pt / vae_long.pt)")
    ap.add_argument("--vae-z-dim", type=int, default=16)
    ap.add_argument("--vae-base-dim", type=int, default=16)
    ap.add_argument("--vae-res-blocks", type=int, default=1)
    ap.add_argument("--vae-spatial", type=int, default=8, choices=[4, 8],
                    help="the VAE's spatial compression (every stage, the DiT's too, follows it: "
                         "4 gives the DiT a 4x4 patch, the same 48 tokens a latent frame)")
    ap.add_argument("--encode-clips", type=int, default=0, help="encode only the first N clips")
    ap.add_argument("--dit-resume", action="store_true", help="train the saved DiT further")
    ap.add_argument("--dit-bf16", action="store_true",
                    help="train the DiT in mixed precision (bf16 products, f32 weights and loss)")
    ap.add_argument("--dit-lr", type=float, default=4e-4,
                    help="the DiT's peak learning rate (lower to train a trained one further)")
    ap.add_argument("--camera-lr-mult", type=float, default=1.0,
                    help="the camera adapter's learning rate over the network's")
    ap.add_argument("--held-clips", type=int, default=0,
                    help="extra clips of held keys (stage data-held), seeds 400 and up")
    ap.add_argument("--held-share", type=float, default=0.0,
                    help="share of DiT batch sequences drawn from the held-key flights")
    ap.add_argument("--self-context", type=float, default=SELF_CONTEXT,
                    help="share of DiT steps whose clean context is the model's own output")
    ap.add_argument("--rollout-context", action="store_true",
                    help="that output is a 4-step sample from pure noise (the engine's block 0), "
                         "not the x0 of the truth at the last step's noise")
    ap.add_argument("--dit-shift", type=float,
                    help="train the 4 DMD steps at this flow shift (default: the checkpoint's, "
                         f"else {FLOW_SHIFT}); a small latent grid wants a small one")
    ap.add_argument("--dit-init", type=pathlib.Path,
                    help="warm-start a new DiT from this dit.pt or exported model folder "
                         "(another VAE's; see warm_start)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", type=pathlib.Path,
                    default=pathlib.Path(__file__).resolve().parents[2] / "models" / "world-next",
                    help="where stage keep writes the checkpoints a later session resumes from")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    configure(a.vae_z_dim, a.vae_base_dim, a.vae_res_blocks, a.vae_spatial)
    diffusers.utils.logging.set_verbosity_error()
    a.work.mkdir(parents=True, exist_ok=True)
    stages = (["data", "data-held", "vae", "vae-long", "encode", "dit", "export"]
              if a.stage == "all" else [a.stage])
    for s in stages:
        log(f"stage {s}")
        if s == "data":
            stage_data(a.work, a.clips)
        elif s == "vae":
            stage_vae(a.work, a.vae_steps, a.vae_minutes, a.vae_edge, a.vae_first, a.vae_colour,
                      a.vae_init, a.vae_bf16)
        elif s == "vae-long":
            stage_vae_long(a.work, a.vae_long_minutes, a.vae_colour)
        elif s == "encode":
            stage_encode(a.work, a.encode_clips)
        elif s == "dit":
            stage_dit(a.work, a.dit_steps, a.dit_batch, a.dit_minutes, a.dit_resume,
                      a.camera_lr_mult, a.dit_bf16, a.dit_lr, a.dit_init, a.held_share,
                      a.self_context, a.rollout_context, a.dit_shift)
        elif s == "data-held":
            stage_data_held(a.work, a.held_clips)
        elif s == "keep":
            stage_keep(a.work, a.keep)
        else:
            stage_export(a.work, a.out)


if __name__ == "__main__":
    main()
