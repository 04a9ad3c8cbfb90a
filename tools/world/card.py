#!/usr/bin/env python3
"""Writes the `world` model card (models/world/README.md) from what training and the
evaluation recorded: models/world/training.json (train.py) and models/world/eval.json
(eval.py). Every number in the card comes from those two files.

    ~/.headroom-reference/bin/python tools/world/card.py [--folder models/world]
"""

import argparse
import json
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDER = ROOT / "models" / "world"


def mean_of(curve, key, first, last):
    vals = [c[key] for c in curve[first:last] if c.get(key) is not None]
    return float(np.mean(vals)) if vals else float("nan")


def shift_sigmas(shift):
    """The 4 DMD steps' sigmas at a flow shift (STEPWISE B2)."""
    return [shift * b / ((1 - b) + shift * b) for b in (1.0, 0.75, 0.5, 0.25)]


def run_shift(run):
    """The flow shift a DiT run trained its DMD steps at (5 before runs recorded it)."""
    return run.get("shift", 5.0)


def run_note(run):
    """A DiT run's note: where a warm start came from, its curriculum and context, its own."""
    parts = []
    if run_shift(run) != 5.0:
        parts.append(f"DMD steps at flow shift {run_shift(run):g} (`--dit-shift`: "
                     f"σ = {', '.join(f'{x:.3g}' for x in shift_sigmas(run_shift(run)))})")
    if "init" in run:
        parts.append(f"warm start from a {run['init_steps']}-step DiT on another VAE's latents "
                     "(`train.py --dit-init`: blocks and camera adapter carried over, fresh "
                     "patch embedding and output projection)")
    if run.get("held_share"):
        parts.append(f"{run['held_share']:.0%} of each batch from held-key flights (`--held-share`)")
    if run.get("rollout_context"):
        parts.append(f"{run['self_context']:.0%} of steps on the model's own 4-step samples from pure "
                     "noise as context (`--rollout-context`)")
    if run.get("note"):
        parts.append(run["note"])
    return "; ".join(parts)


def vae_section(tr, vae_short, vae_long, decoder):
    """The VAE's training: its runs where training.json lists them, else its curve."""
    if tr.get("vae_runs"):
        rows = "\n".join(f"   | {i + 1} | {r['steps']} | {r['minutes']:.0f} | {r['what']} |"
                         for i, r in enumerate(tr["vae_runs"]))
        return f"""1. VAE, in {len(tr['vae_runs'])} runs (1 thread each), each from the last one's weights:

   | run | steps | minutes | what |
   |---|---|---|---|
{rows}

   Reconstruction PSNR on whole training clips after training:
   {tr['vae_psnr_full_clips']:.2f} dB.{decoder}"""
    return f"""1. VAE: {len(vae_short)} steps of L1 + L2 + 1e-4·KL on 64×64 crops of 9-frame windows,
   then {len(vae_long)} steps on whole 33-frame clips at 128×96 (over 33 frames the
   window-trained VAE drifted from 21 to 15 dB; the long fine-tune fixes its caches).
   Reconstruction PSNR on whole training clips after training:
   {tr['vae_psnr_full_clips']:.2f} dB.{decoder}"""


def guidance_section(ev, gv, default):
    """The committed eval beside the same eval with camera guidance (`eval_guided.json`)."""
    def row(e, name):
        st = " | ".join(
            f"{v['per_latent_frame']['sign_share']:.0%} · {v['per_latent_frame']['magnitude_ratio']:.2f}"
            f"{' ✓' if v['per_latent_frame']['passes'] else ''}" for v in e["steering"].values())
        return (f"| {name} | {e['psnr_db']:.2f} | {e['gain_db']:+.2f} | "
                f"{e['flights_below_baseline']}/{e['cases']} | {st} |")
    g = gv["camera_guidance"]
    lost = [a["psnr_db"] - b["psnr_db"] for a, b in zip(ev["per_case"], gv["per_case"])]
    keys = " | ".join(f"`{k}` sign · magnitude" for k in gv["steering"])
    return f"""
## Camera guidance

`headroom generate --camera-guidance G` (or the transformer config's `camera_guidance`,
headroom's own key; this folder's is {default:g}) runs each DMD step twice, with the
block's camera and with a camera that stands still over the block, and takes
`v_still + G·(v_keys − v_still)`. The same eval with `--camera-guidance {g:g}`
(`tools/world/eval.py … --camera-guidance {g:g}`, in `eval_guided.json`):

| camera guidance | mean PSNR | gain | below | {keys} |
|---|---|---|---|---|---|---|---|
{row(ev, f"{default:g} (this folder's)")}
{row(gv, f"{g:g}")}

Under guidance {sum(v['per_latent_frame']['passes'] for v in gv['steering'].values())} of 4 keys pass the steering bar ({sum(v['per_latent_frame']['passes'] for v in ev['steering'].values())} without), and every flight loses
PSNR ({min(lost):.1f}–{max(lost):.1f} dB, most where the camera pitches): moving as far as the truth
uncovers what the first frame did not show, and the model fills it with blotches (below:
seed 100000, `kkkkkjjww`, guided, above the truth). So the folder keeps guidance
{default:g}.

![the guided flight above the ground truth](flight_guided.png)
"""


def colour_section(ev, folder):
    """Colour, luma, the permuted scenes, held keys and the strip, where the eval has them."""
    if "permuted" not in ev:
        return ""
    pm, hk = ev["permuted"], ev["held_keys"]
    held = "\n".join(f"| `{k * 9}` | {v['seed']} | {v['psnr_db']:.2f} | {v['baseline_db']:.2f} | "
                     f"{v['gain_db']:+.2f} |" for k, v in hk.items())
    strip = ""
    if (folder / "flight.png").exists():
        strip = """

The first three flights, frames 0, 8, 16, 24 and 32, each generated above the renderer's
truth (`eval.py --strip flight.png --strip-flights 3`):

![three held-out flights, each generated above its truth](flight.png)"""
    return f"""

The mean colour error of a flight (per frame, the largest channel difference of the
frames' mean colours): {ev['colour_error']:.2f}/255 on average, {ev['colour_error_max']:.2f}/255 in the worst
flight (the issue asks ≤ 6 in every flight). In luma (BT.601): {ev['luma_psnr_db']:.2f} dB,
{ev['luma_gain_db']:+.2f} dB over repeating the first frame.

The same {pm['flights']} flights with the scene's RGB channels permuted (five orders in turn; a VAE
that learned its training palettes instead of colour fails here): the first frame
{pm['first_frame_db']:.2f} dB on average, {pm['first_frame_min_db']:.2f} dB at worst (the issue asks ≥ 27 dB), frames
1–32 {pm['psnr_db']:.2f} dB, colour error {pm['colour_error_max']:.2f}/255 in the worst flight.

One key held for the whole flight, against repeating the first frame (the issue asks
each to beat it):

| keys | seed | model dB | repeat-first dB | gain |
|---|---|---|---|---|
{held}{strip}"""


def tiny_section(folder, tr):
    """`tiny_decoder.json` (tools/world/train_tiny.py's export), when the folder has one."""
    path = folder / "tiny_decoder.json"
    if not path.exists():
        return ""
    t = json.loads(path.read_text())
    # A full decoder fine-tuned on the DiT's latents changed after the tiny one's teacher.
    stale = ""
    if tr.get("vae_decoder_generated"):
        if any(r.get("rollouts") for r in t.get("runs", [])):
            stale = """
Its full-decode targets and the full decoder's row below are the decoder before its
fine-tune on the DiT's latents (the same on the truth's latents to within 0.1 dB).
"""
        else:
            stale = """
It was distilled before the full decoder's fine-tune on the DiT's latents (above), so
the figures below are against that earlier decoder (the same on the truth's latents to
within 0.1 dB), and it decodes the DiT's latents as that one did: without the fine-tune's
gain (`train_tiny.py --rollouts` gives it the same training).
"""
    size = (folder / "tiny_decoder.safetensors").stat().st_size
    strides = t.get("time_strides", [1, 2, 2])
    return f"""
## Tiny decoder (`tiny_decoder.safetensors`, `--decoder tiny`)

TAEHV's decoder architecture (taehv.py's layout and keys: {len(strides)} stages of three memory
blocks, ×2 upsamples, temporal growth {', '.join(map(str, strides))}) at widths {t['widths']}, {t['parameters']:,}
parameters ({size / 1024:.0f} KiB in f32), distilled from this folder's VAE decoder by
`tools/world/train_tiny.py`: {t['train_clips'] // 2} rendered clips and their mirrors (seeds from
2000), encoded by the VAE and decoded by it as the target, {t['loss']}, {t['steps']} steps
in {t['minutes']:.0f} CPU-minutes (PyTorch, 2 threads). It reads the DiT's latents
directly. On {t['held_out_clips']} held-out clips (seeds from 300000), 33 frames each, from the
VAE's latents of the truth:
{stale}
| decoder | PSNR vs the truth | PSNR vs the full decode |
|---|---|---|
| full (the VAE) | {t['full_decode_psnr_vs_truth']:.2f} dB | — |
| tiny | {t['psnr_vs_truth']:.2f} dB | {t['psnr_vs_full_decode']:.2f} dB |
"""


def main(folder):
    tr = json.loads((folder / "training.json").read_text())
    ev = json.loads((folder / "eval.json").read_text())
    t_cfg = json.loads((folder / "transformer" / "config.json").read_text())
    v_cfg = json.loads((folder / "vae" / "config.json").read_text())
    dit_bytes = (folder / "transformer" / "diffusion_pytorch_model.safetensors").stat().st_size
    vae_bytes = (folder / "vae" / "diffusion_pytorch_model.safetensors").stat().st_size
    vae_short = [c for c in tr["vae"] if not c.get("long")]
    vae_long = [c for c in tr["vae"] if c.get("long")]
    dit = tr["dit"]
    n = len(dit)
    runs = tr["dit_runs"]
    # The first curve step of each run, for the shift (so the sigmas) a row's steps are at.
    starts = np.cumsum([0] + [r["steps"] for r in runs])[:-1]
    dit_rows = []
    for a in sorted({0, n // 4, n // 2, 3 * n // 4, max(n - 50, 0)}):
        b = min(a + 50, n)
        per = [np.mean([c["per_step"][i] for c in dit[a:b] if c["per_step"][i] is not None])
               for i in range(4)]
        run = runs[int(np.searchsorted(starts, dit[a]["step"], side="right")) - 1]
        sigmas = ", ".join(f"{x:.3g}" for x in shift_sigmas(run_shift(run)))
        dit_rows.append(f"| {a}–{b - 1} | {sigmas} | {mean_of(dit, 'loss', a, b):.4f} | "
                        + " | ".join(f"{p:.4f}" for p in per) + " |")
    run_rows = "\n".join(
        f"| {i + 1} | {r['steps']} | {r['minutes']:.0f} | {r['max_lr']:.1e} | {r['camera_lr_mult']:g} | "
        f"{'bf16 autocast' if r['bf16'] else 'f32'} | {r['clips']} | {run_note(r)} |"
        for i, r in enumerate(runs))
    z = t_cfg["out_channels"]
    space = 2 ** (len(v_cfg["dim_mult"]) - 1)
    patch = "×".join(str(p) for p in t_cfg["patch_size"])
    keep_text = """
  Its config sets `keep_first_frame` (headroom's key): the session's first latent frame
  is the given image's latents, not the network's x0 for it, as in training, where that
  frame is always the truth.""" if t_cfg.get("keep_first_frame") else ""
    dec, dec_evals = tr.get("vae_decoder", []), tr.get("vae_decoder_evals", [])
    decoder = ""
    if dec:
        e0, e1 = dec_evals[0], dec_evals[-1]
        gen = tr.get("vae_decoder_generated")
        rollout_text = f"""
   In {gen['share']:.0%} of the steps its input was instead what the DiT makes: the latents
   of `headroom generate` from the true first frame and keys of {gen['rollouts']} fresh clips
   (`finetune.py --stage rollouts`, seeds neither network trained on), against their true
   frames, so that it decodes the DiT's uncertain latents to the picture's expected value
   rather than to texture.""" if gen else ""
        decoder = f"""
   Then the decoder alone (`tools/world/finetune.py --stage decoder`, the encoder frozen,
   so the DiT's latents did not change): {len(dec)} steps in {dec[-1]['seconds'] / 60:.0f} CPU-minutes,
   L1 + L2 with frame 0's own term weighted in, on whole clips and on batches of
   64×64 crops of the first block.{rollout_text} Held-out whole clips (4 seeds from 100000): {e0['heldout_psnr']:.2f} →
   {e1['heldout_psnr']:.2f} dB, their frame 0: {e0['heldout_first_frame_psnr']:.2f} → {e1['heldout_first_frame_psnr']:.2f} dB."""
    data_text = ("""Both networks trained on seeds 0–319 with random key scripts (runs of
one key, sometimes none) plus seeds 400–559 with one key held for the flight (sometimes
switching once: `train.py --stage data-held`), 480 clips, 960 with their mirrors."""
                 if tr.get("vae_runs") else """The VAE trained on seeds 0–399 with random key scripts (runs of one key,
sometimes none); the DiT's first run on seeds 0–239; the decoder fine-tune and later DiT
runs on seeds 0–319 of those scripts plus seeds 400–559 with one key held for the
flight (sometimes switching once: `train.py --stage data-held`).""")
    if all(r.get("rollout_context") for r in runs):
        context_text = f"""In {runs[-1]['self_context']:.0%} of the steps the clean context is the model's own: each
   block sampled over the 4 DMD steps from pure noise, seeing the truth's earlier blocks
   (`--rollout-context`: the engine's block 0 has nothing before it but the image, and
   the blocks after it see what it made)."""
    else:
        rollout = ("""; in runs with
   `--rollout-context`, in half the steps it is each block sampled over the 4 DMD steps
   from pure noise (the engine's block 0 has nothing before it but the image, and the
   blocks after it see what it made)""" if any(r.get("rollout_context") for r in runs) else "")
        context_text = f"""In 30 % of the steps the clean context is the model's own x0 (no gradient) from the
   last DMD step's noise level, as the engine commits its own output{rollout}."""
    cases = "\n".join(
        f"| {c['seed']} | `{c['actions']}` | {c['psnr_db']:.2f} | {c['baseline_db']:.2f} | "
        f"{c['psnr_db'] - c['baseline_db']:+.2f} | {c.get('colour_error', float('nan')):.2f} |"
        for c in ev["per_case"])
    steer = "\n".join(
        f"| `{k * 9}` | {v['generated_mean_px']:+.3f} | {v['truth_mean_px']:+.3f} | "
        f"{np.mean(v['per_latent_frame']['generated']):+.2f} | {np.mean(v['per_latent_frame']['truth']):+.2f} | "
        f"{v['per_latent_frame']['sign_share']:.0%} | {v['per_latent_frame']['magnitude_ratio']:.2f} | "
        f"{'yes' if v['per_latent_frame']['passes'] else 'no'} |"
        for k, v in ev["steering"].items())
    sa, yl = ev["strafe_d_vs_a"], ev["yaw_l_vs_j"]
    guided = folder / "eval_guided.json"
    guidance = (guidance_section(ev, json.loads(guided.read_text()),
                                 t_cfg.get("camera_guidance", 1.0)) if guided.exists() else "")
    ceiling = ""
    if "vae_db" in ev:
        pl = ev["per_latent_frame"]
        fmt = lambda xs: " | ".join("–" if x is None else f"{x:.2f}" for x in xs)
        ceiling = f"""The VAE's ceiling: the truth through this folder's VAE alone (encode, decode) is
{ev['vae_db']:.2f} dB over frames 1–32 and {ev['vae_first_frame_db']:.2f} dB for frame 0, so the DiT loses
{ev['vae_db'] - ev['psnr_db']:.2f} dB of it, and a perfect DiT on this VAE would gain
{ev['vae_db'] - ev['baseline_repeat_first_db']:+.2f} dB over repeating the first frame. Per latent frame (frame 0, then pixel
frames 4f−3..4f), mean over the flights:

| latent frame | {" | ".join(str(i) for i in range(len(pl['model_db'])))} |
|---|{"---|" * len(pl['model_db'])}
| model | {fmt(pl['model_db'])} |
| VAE round trip | {fmt(pl['vae_db'])} |
| repeat-first | {fmt(pl['repeat_first_db'])} |

"""
    vae_hours = (f"{sum(r['minutes'] for r in tr['vae_runs']) / 60:.1f} hours" if tr.get("vae_runs")
                 else "about an hour")
    vae_hours += " (the VAE)"
    failing = [k for k, v in ev["steering"].items() if not v["per_latent_frame"]["passes"]]
    steer_limit = (f"\n- Steering: {', '.join(f'`{k}`' for k in failing)} held alone move the picture less "
                   "than half as far as the truth, or the wrong way (the table above)." if failing else "")
    card = f"""# `world`: a small world model trained on a procedural world

The embedded default model of headroom (`headroom generate`, `headroom serve`). A Wan 2.1
VAE and an image-conditioned causal Wan DiT with LingBot-World's camera adapter, trained
from scratch on this machine (2 CPU cores, PyTorch) on the renderer
`tools/world/render.py`, for exactly the loop the engine runs. It loads through the same
diffusers-folder loader as every checkpoint.

## What it is

- **VAE** (`vae/`, {vae_bytes / 1e6:.1f} MB bf16): `AutoencoderKLWan`, base_dim
  {v_cfg['base_dim']}, dim_mult {v_cfg['dim_mult']}, {v_cfg['num_res_blocks']} res block,
  z_dim {v_cfg['z_dim']}, {space}× space / 4× time; latents normalised per channel by the
  statistics of the training set (`latents_mean` / `latents_std` in its config).
- **Transformer** (`transformer/`, {dit_bytes / 1e6:.1f} MB bf16):
  `WanTransformer3DModel`, {t_cfg['num_layers']} layers, {t_cfg['num_attention_heads']} heads
  × {t_cfg['attention_head_dim']}, FFN {t_cfg['ffn_dim']}, {t_cfg['in_channels']} input channels (noise {z} | mask 4
  | first-frame latents {z}), patch {patch}, plus the camera adapter's keys
  (`patch_embedding_wancamctrl`, `c2ws_hidden_states_layer1/2`, per block
  `cam_injector_layer1/2`, `cam_scale_layer`, `cam_shift_layer`). No text: it is trained
  with the engine's empty-prompt context (one zero token).{keep_text}
- **First frame** (`first_frame.png`): a training-set view; `generate` without `--image`
  starts from it, and its size (128×96) is the model's default video size.

## Data

`tools/world/render.py`: a textured ground plane (checkers, a seed's palette), a sky
gradient and 10–21 boxes per seed, ray-cast with 2×2 supersampling through a pinhole
camera with the engine's default intrinsics, moving by the keys with `camera.rs`'s
semantics (one key set per latent frame: w/s 0.05 forward/back, a/d 0.05 sideways, i/k
pitch ±4°, j/l yaw ±6°; latent frame f at the pose after keys 0..f, its four pixel frames
moving there in quarter steps), 33 frames a clip; every clip also mirrored left-right
with a↔d, j↔l. {data_text}

## Training (`tools/world/train.py`, PyTorch CPU, 2 threads)

{vae_section(tr, vae_short, vae_long, decoder)}
2. DiT: {tr["dit_steps"]} steps of batch {tr["dit_batch"]} in {len(runs)} run(s), each resuming the
   last (AdamW, warm-up then a cosine that follows the run's CPU clock; clips counted
   with their mirrors):

   | run | steps | minutes | peak lr | camera lr × | precision | clips | |
   |---|---|---|---|---|---|---|---|
{chr(10).join("   " + r for r in run_rows.splitlines())}

   One forward trains
   all three blocks of a clip: the sequence is [clean latent frames at t = 0 | noisy
   frames at t_b], the noisy copy of block b sees the clean blocks < b and itself
   (the engine's block-causal attention to committed blocks), RoPE gives both copies
   the same frame positions, and each block draws its own timestep from the 4 DMD
   steps (flow shift 5 unless a run says otherwise; this folder's sessions default to
   its config's `flow_shift`, {t_cfg.get("flow_shift", 5.0):g}); the loss is the x0 error `x_t − σ·v` against the clean latents.
   {context_text}

x0 mean squared error (normalised latents), mean over the step range, overall and per
DMD step (at the σ of the run the range is in):

| steps | σ of steps 1–4 | x0 MSE | step 1 | step 2 | step 3 | step 4 |
|---|---|---|---|---|---|---|
{chr(10).join(dit_rows)}

The full curves (every step, both networks) are in `training.json`.

## Measured quality (`tools/world/eval.py`, through `headroom generate`)

{ev['cases']} held-out seeds (100000 and up; training used 0–399) with held-out key scripts
(another generator; they always press a key, since with a still camera repeating the
first frame is exact), {ev['frames']} frames from the true first frame, seed = case seed.
PSNR over frames 1–32 against the renderer, beside repeating the first frame:

| seed | keys | model dB | repeat-first dB | gain | colour error /255 |
|---|---|---|---|---|---|
{cases}
| **mean** | | **{ev['psnr_db']:.2f}** | **{ev['baseline_repeat_first_db']:.2f}** | **{ev['gain_db']:+.2f}** | **{ev.get('colour_error', float('nan')):.2f}** |

{ev['flights_below_baseline']} of {ev['cases']} flights fall below repeating the first frame. The first
decoded frame against the image it was given: {ev['first_frame_db']:.2f} dB on average, {ev['first_frame_min_db']:.2f} dB at
worst (the issue asks for ≥ 30 dB).{colour_section(ev, folder)}

{ceiling}Steering (phase correlation, horizontal shift in pixels, positive = the picture moves
right): per pixel frame (consecutive frames), and per latent frame (pixel frame 4f−4 to
4f, the four frames one key set moves), with the share of latent frames whose shift has
the truth's sign and the generated magnitude over the truth's (the issue's bar: ≥ 80 %
and ≥ 0.5):

| keys | px/frame generated | truth | px/latent frame generated | truth | sign share | magnitude | passes |
|---|---|---|---|---|---|---|---|
{steer}

Strafe d vs a: opposite directions {sa['opposite']}, same direction as the truth
{sa['matches_truth']}, frames agreeing with the truth's sign {sa['frame_agreement'][0]:.0%} / {sa['frame_agreement'][1]:.0%}.
Yaw l vs j: opposite {yl['opposite']}, as the truth {yl['matches_truth']}, frames agreeing
{yl['frame_agreement'][0]:.0%} / {yl['frame_agreement'][1]:.0%}.
{guidance}{tiny_section(folder, tr)}
## Limits

- 128×96, 33 frames (three blocks); longer videos run but were never trained.
- Trained for {sum(r['minutes'] for r in runs) / 60:.1f} hours of run clock (the DiT) plus {vae_hours}{f" and {dec[-1]['seconds'] / 60:.0f} minutes (its decoder fine-tune)" if dec else ""}: frames are
  blurred where the view uncovers what the first frame did not show, and textures soften
  over the blocks.{steer_limit}
- Only this procedural world; no text conditioning.
"""
    (folder / "README.md").write_text(card)
    print(f"wrote {folder / 'README.md'}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=pathlib.Path, default=FOLDER,
                    help="the model folder: its training.json and eval.json in, README.md out")
    main(ap.parse_args().folder)
