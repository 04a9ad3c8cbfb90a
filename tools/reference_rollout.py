#!/usr/bin/env python3
"""Reference rollout of the stepwise DMD loop, and the golden fixtures it writes.

This is an oracle for headroom's whole per-block loop (crates/engine/src/session.rs),
written from the reference pipelines' semantics, not from the Rust code:

* Self-Forcing ``pipeline/causal_inference.py`` / ``utils/scheduler.py``: per block,
  the first noise tensor, 4 DMD steps ``x0 = x_t - sigma*v`` with fresh noise
  ``x = (1 - sigma')*x0 + sigma'*eps`` in between, timesteps from the
  ``FlowMatchScheduler(shift, sigma_min=0, extra_one_step=True)`` table warped at
  (1000, 750, 500, 250), then one forward of the clean block at t = 0 that writes
  its KV cache (STEPWISE.md B2, B3, B6).
* The KV window of LingBot-World's causal-fast model (``CausalWanSelfAttention``,
  the Self-Forcing ring buffer: sink frames kept, oldest non-sink frames rolled
  out), with the vllm-omni checkpoint contract sink 9 / window 18; the set is
  simulated frame by frame below and checked against vllm-omni's direct-path
  formula (STEPWISE.md B5.2, B5.3).
* LingBot-World's camera code (``wan/utils/cam_utils.py``: framewise relative
  poses, translation normalisation, ``[ray origin, ray direction]`` at pixel
  centres) and its camera adapter (``model_fast.py``: ``patch_embedding_wancamctrl``,
  ``c2ws_hidden_states_layer1/2``, per-block ``cam_injector_layer1/2``,
  ``cam_scale_layer``, ``cam_shift_layer`` applied right after the self-attention
  residual); vllm-omni's WASD integrator, previous-tail anchor and interaction
  handler (STEPWISE.md A3-A10).
* The image conditioning of 36-channel models: diffusers ``AutoencoderKLWan``
  posterior mean of ``[image, zeros x (N-1)]`` (zero pixels, i.e. mid-grey in the
  [-1, 1] range, as LingBot and vllm-omni build it; STEPWISE.md B7 calls them
  "black"), normalised per channel, a 4-channel mask that is 1 at latent frame 0
  only.

Every forward is ONE full-sequence diffusers ``WanTransformer3DModel`` forward over
``[committed blocks at t = 0 | current block at t]``, with per-token timesteps, an
attention mask that gives every frame exactly the frames its block saw when it was
denoised and committed (its own block plus the window's sink and newest history),
per-token text (cross-attention masked to the prompt its block was generated with)
and per-token camera tokens. RoPE therefore runs on absolute frame positions with
no cache at all: the committed blocks' keys are recomputed from their clean latents
in every forward, which is what the KV cache stores. The only diffusers overrides
are an attention processor that takes a mask, and a block forward that inserts the
camera modulation (diffusers' Wan has no camera adapter).

Each case writes crates/engine/tests/fixtures/rollout/<case>/:

  transformer/, vae/      diffusers model folders (seeded weights; the transformer
                          safetensors also holds the camera adapter's keys)
  noise.npy      f32 [blocks, steps, z, 3, h, w]  every noise tensor in draw order
  text_a.npy, text_b.npy  f32 [L, text_dim] text embeddings (b: after the change)
  image.npy      f32 [3, H, W] in [-1, 1] (image-conditioned cases)
  latents.npy    f32 [blocks, z, 3, h, w]  each block's clean latents (the oracle)
  scenario.json  size, frames, schedule, window, camera script / interactions,
                 the chunk at which the prompt changes

The geometry is the case's: the VAE's spatial factor s = 2^(stages - 1) (its
``dim_mult``) sets the latent grid h x w = H/s x W/s and the rays' fold (s x s), the
DiT's ``patch_size`` the tokens; the defaults (8x VAE, patch [1, 2, 2]) are those of
the first cases, whose outputs do not depend on this generality.

It needs the reference environment (torch + diffusers 0.42.1); CI never runs it.
Every case, or only the named ones:

    ~/.headroom-reference/bin/python tools/reference_rollout.py [case ...]
"""

import json
import math
import pathlib
import platform
import sys

import numpy as np
import safetensors
import torch
import torch.nn.functional as F
import diffusers
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from diffusers.models.transformers.transformer_wan import WanAttnProcessor
from safetensors.torch import load_file, save_file

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "crates" / "engine" / "tests" / "fixtures" / "rollout"

WIDTH, HEIGHT = 64, 48          # default size: latent 8 x 6, tokens 4 x 3 per frame
BLOCKS = 8                      # blocks 6 and 7 run after the first eviction
BLOCK = 3                       # latent frames per block
STEPS = 4
SHIFT = 5.0
SINK, WINDOW = 9, 18            # vllm-omni checkpoint contract
TEXT_TOKENS = 512               # the Wan pipelines zero-pad umT5 output to 512
STEP = 0.05                     # LINGBOT_CONTROLLER_TRANSLATION_UNIT

DIT = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
           out_channels=16, text_dim=16, freq_dim=32, ffn_dim=48, num_layers=2,
           cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
           rope_max_seq_len=1024)
VAE = dict(base_dim=4, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
           temperal_downsample=[False, True, True], attn_scales=[])
# diffusers' default Wan latent statistics (the first 8 for an 8-channel VAE).
LATENTS_MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]
LATENTS_STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
               3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160]

CASES = {
    # Text-to-video with the camera adapter, driven by a WASD/IJKL script (one key
    # set per latent frame, integrated across blocks, max-norm per block).
    "t2v_cam": dict(seed=21, in_channels=16, image=False,
                    actions="wwwddlliii-jjwwssaakkkld", events={}, prompt_change=None),
    # Image-conditioned (36 channels) with the camera adapter, driven by interaction:
    # a velocity from chunk 2, a prompt change at chunk 4, a new velocity at chunk 5.
    "i2v_cam": dict(seed=22, in_channels=36, image=True, actions="",
                    events={2: dict(mode="velocity", translation=[0.02, -0.01, 0.05],
                                    rotation=[0.03, 0.05, 0.0, 1.0]),
                            5: dict(mode="velocity", translation=[-0.03, 0.0, 0.04],
                                    rotation=[-0.02, -0.06, 0.01, 1.0])},
                    prompt_change=4),
    # The layout of a 4x VAE: dim_mult [1, 2, 2] and temporal downsampling in both
    # stages (4x space, 4x time), a patch [1, 4, 4] DiT (16 pixels a token side, as
    # an 8x VAE with patch 2) whose camera adapter takes rays folded 4x4; 8 latent
    # channels (20 in), image-conditioned, a moving key script, a prompt change.
    "i2v_cam_s4": dict(seed=23, in_channels=20, image=True, width=48, height=32,
                       actions="wwlliiddd-jjkkssaawwjjli", events={}, prompt_change=4,
                       dit=dict(patch_size=(1, 4, 4), out_channels=8),
                       vae=dict(z_dim=8, dim_mult=[1, 2, 2], temperal_downsample=[True, True],
                                scale_factor_spatial=4, latents_mean=LATENTS_MEAN[:8],
                                latents_std=LATENTS_STD[:8])),
}


class Geometry:
    """A case's sizes: pixels, the VAE's factors, the DiT's patch, latent channels."""

    def __init__(self, case):
        self.dit = {**DIT, **case.get("dit", {})}
        self.vae = {**VAE, **case.get("vae", {})}
        self.width, self.height = case.get("width", WIDTH), case.get("height", HEIGHT)
        self.fold = 2 ** (len(self.vae["dim_mult"]) - 1)      # spatial factor = ray fold
        self.temporal = 2 ** sum(self.vae["temperal_downsample"])
        assert self.vae.get("scale_factor_spatial", 8) == self.fold, self.vae
        assert self.temporal == 4, "diffusers' Wan encode takes 1 + 4k frames"
        self.z = self.vae["z_dim"]
        assert self.dit["out_channels"] == self.z, (self.dit, self.z)
        self.patch = tuple(self.dit["patch_size"])
        assert self.patch[0] == 1, "one token frame per latent frame"
        self.latent_hw = (self.height // self.fold, self.width // self.fold)
        side = [self.fold * p for p in self.patch[1:]]
        assert self.height % side[0] == 0 and self.width % side[1] == 0, (side, self.width)
        # Pixel frames: 9 in the first chunk, 12 in every later one (12K - 3).
        self.frames = 1 + self.temporal * (BLOCKS * BLOCK - 1)


# ----------------------------------------------------------------------------------
# DMD schedule (Self-Forcing FlowMatchScheduler + warp_denoising_step)

def dmd_schedule(steps, shift):
    """(timesteps, sigmas) of the few-step schedule, from the 1000-step flow table."""
    sigmas = torch.linspace(1.0, 0.0, 1001, dtype=torch.float64)[:-1]  # extra_one_step
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    table = torch.cat([sigmas * 1000, torch.zeros(1, dtype=torch.float64)])
    labels = torch.tensor([1000 - 1000 * k // steps for k in range(steps)])
    timesteps = table[1000 - labels]
    # The sampler looks the sigma up at the table entry nearest the timestep.
    sig = torch.stack([sigmas[(sigmas * 1000 - t).abs().argmin()] for t in timesteps])
    closed = [shift * (l / 1000) / ((1 - l / 1000) + shift * (l / 1000)) for l in labels.tolist()]
    assert np.allclose(sig.numpy(), closed, atol=1e-12), (sig, closed)  # STEPWISE B2
    return timesteps.tolist(), sig.tolist()


# ----------------------------------------------------------------------------------
# KV window: the Self-Forcing / LingBot ring buffer, simulated frame by frame

def visible_frames(blocks, sink, window):
    """For each block, the frames its forwards attend (history + itself)."""
    cache = [None] * window
    global_end = local_end = 0
    out = []
    for n in range(blocks):
        start, new = BLOCK * n, BLOCK
        for _ in range(STEPS + 1):            # every probe and the commit write
            end = start + new
            if end > global_end and new + local_end > window:
                evicted = new + local_end - window
                rolled = local_end - evicted - sink
                cache[sink:sink + rolled] = cache[sink + evicted:sink + evicted + rolled]
                local = local_end + end - global_end - evicted
            else:
                local = local_end + end - global_end
            cache[local - new:local] = list(range(start, end))
            seen = cache[:local]
            global_end, local_end = end, local
        out.append(sorted(seen))
    return out


def vllm_visible(blocks, sink, window):
    """vllm-omni's direct-path visible set (STEPWISE B5.2), in frames."""
    stored, sink_end, out = [], 0, []
    for n in range(blocks):
        new = list(range(BLOCK * n, BLOCK * n + BLOCK))
        if not stored:
            vis, inc = new, min(sink, BLOCK)
        else:
            inc = max(0, min(sink - BLOCK * n, BLOCK))
            local_cap = window - (sink_end + inc)
            keep = min(len(stored) - sink_end, local_cap - (BLOCK - inc))
            vis = stored[:sink_end] + new[:inc] + stored[len(stored) - keep:] + new[inc:]
        out.append(sorted(vis))
        stored, sink_end = vis, sink_end + inc
    return out


# ----------------------------------------------------------------------------------
# Camera (f64): vllm-omni's integrator and interaction handler, LingBot's rays

def rot_x(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def rot_y(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def controller_step(pose, pitch, keys):
    """One latent frame of the WASD/IJKL controller (STEPWISE A4)."""
    k = lambda ch: 1.0 if ch in keys else 0.0
    dp = math.radians(4) * (k("i") - k("k"))
    if abs(pitch + dp) > math.radians(85):
        dp = 0.0
    else:
        pitch += dp
    dy = math.radians(6) * (k("l") - k("j"))
    r = rot_y(dy) @ pose[:3, :3] @ rot_x(dp)
    fwd = np.array([r[0, 2], 0.0, r[2, 2]])
    rgt = np.array([r[0, 0], 0.0, r[2, 0]])
    for v in (fwd, rgt):
        n = np.linalg.norm(v)
        if n > 0:
            v /= n + 1e-6
    t = pose[:3, 3] + STEP * (k("w") - k("s")) * fwd + STEP * (k("d") - k("a")) * rgt
    out = np.eye(4)
    out[:3, :3], out[:3, 3] = r, t
    return out, pitch


def quat_pose(translation, q):
    x, y, z, w = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    p = np.eye(4)
    p[:3, :3] = [[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                 [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                 [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]]
    p[:3, 3] = translation
    return p


class Interaction:
    """vllm-omni's camera interaction handler, latent-frame version (STEPWISE A6);
    only the velocity mode is exercised here."""

    def __init__(self):
        self.pose, self.delta, self.pending = np.eye(4), None, []

    def step_chunk(self):
        for ev in self.pending:           # activate at latent index 0; newest wins
            assert ev["mode"] == "velocity"
            self.delta = quat_pose(ev["translation"], ev["rotation"])
        self.pending = []
        out = []
        for _ in range(BLOCK):
            if self.delta is not None:
                self.pose = self.pose @ self.delta   # camera-local delta
            out.append(self.pose.copy())
        return out


def se3_inverse(p):
    inv = np.eye(4)
    inv[:3, :3] = p[:3, :3].T
    inv[:3, 3] = -p[:3, :3].T @ p[:3, 3]
    return inv


def relative_framewise(c2ws, scale=None):
    """LingBot ``compute_relative_poses(framewise=True)``; ``scale=None`` normalises by
    the largest translation (if moving), else divides by the fixed ``scale``."""
    rel = [se3_inverse(c2ws[0]) @ p for p in c2ws]
    rel[0] = np.eye(4)
    rel = [rel[0]] + [se3_inverse(rel[i - 1]) @ rel[i] for i in range(1, len(rel))]
    rel = np.stack(rel)
    norm = np.linalg.norm(rel[:, :3, 3], axis=-1).max() if scale is None else scale
    if norm > 0:
        rel[:, :3, 3] /= norm
    return rel


def plucker(c2ws, height, width, fold=8):
    """LingBot ``get_plucker_embeddings`` ([origin, direction], pixel centres) with the
    default intrinsics, folded ``fold``x``fold`` as ``(c c1 c2)`` onto the latent grid
    (fold = the VAE's spatial factor; LingBot's Wan VAE: 8):
    [6*fold^2, f, height/fold, width/fold]."""
    fx = fy = 500.0
    cx, cy = width / 2, height / 2
    ys, xs = np.meshgrid(np.arange(height) + 0.5, np.arange(width) + 0.5, indexing="ij")
    dirs = np.stack([(xs - cx) / fx, (ys - cy) / fy, np.ones_like(xs)], -1).reshape(-1, 3)
    dirs /= np.linalg.norm(dirs, axis=-1, keepdims=True)
    emb = []
    for p in c2ws:
        d = dirs @ p[:3, :3].T
        o = np.broadcast_to(p[:3, 3], d.shape)
        emb.append(np.concatenate([o, d], -1).reshape(height, width, 6))
    e = torch.from_numpy(np.stack(emb))                      # [f, H, W, 6] f64
    f, s = e.shape[0], fold
    e = e.reshape(f, height // s, s, width // s, s, 6).permute(5, 2, 4, 0, 1, 3)
    return e.reshape(6 * s * s, f, height // s, width // s).float()


def block_cameras(case, g):
    """Each block's folded rays [6*s^2, 3, h, w] (previous-tail anchor, first output
    dropped; STEPWISE A7, A10)."""
    assert len(case["actions"]) <= BLOCKS * BLOCK, "one key set per latent frame"
    if case["actions"] or not case["events"]:
        script = case["actions"].ljust(BLOCKS * BLOCK, "-")
        pose, pitch, out = np.eye(4), 0.0, []
        for n in range(BLOCKS):
            poses = [pose]
            for ch in script[BLOCK * n:BLOCK * n + BLOCK]:
                pose, pitch = controller_step(pose, pitch, ch)
                poses.append(pose)
            out.append(plucker(relative_framewise(poses)[1:], g.height, g.width, g.fold))
        return out
    handler, out = Interaction(), []
    for n in range(BLOCKS):
        if n in case["events"]:
            handler.pending.append(case["events"][n])
        anchor = handler.pose.copy()
        poses = [anchor] + handler.step_chunk()
        out.append(plucker(relative_framewise(poses, scale=STEP)[1:], g.height, g.width,
                           g.fold))
    return out


# ----------------------------------------------------------------------------------
# The transformer: masked attention, per-token camera modulation

class MaskedWanAttnProcessor(WanAttnProcessor):
    """diffusers' Wan processor with an attention mask set per forward."""

    mask = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None,
                 attention_mask=None, rotary_emb=None):
        return super().__call__(attn, hidden_states, encoder_hidden_states,
                                self.mask if self.mask is not None else attention_mask,
                                rotary_emb)


def camera_block_forward(block):
    """diffusers' WanTransformerBlock forward (per-token temb path) with LingBot's
    camera modulation after the self-attention residual."""

    def forward(hidden_states, encoder_hidden_states, temb, rotary_emb):
        shift_msa, scale_msa, gate_msa, c_shift, c_scale, c_gate = (
            block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)
        shift_msa, scale_msa, gate_msa = (x.squeeze(2) for x in (shift_msa, scale_msa, gate_msa))
        c_shift, c_scale, c_gate = (x.squeeze(2) for x in (c_shift, c_scale, c_gate))
        h = hidden_states
        norm = (block.norm1(h.float()) * (1 + scale_msa) + shift_msa).type_as(h)
        h = (h.float() + block.attn1(norm, None, None, rotary_emb) * gate_msa).type_as(h)
        cam = block.camera_tokens
        g = block.cam_injector_layer2(F.silu(block.cam_injector_layer1(cam))) + cam
        h = (1.0 + block.cam_scale_layer(g)) * h + block.cam_shift_layer(g)
        norm = block.norm2(h.float()).type_as(h)
        h = h + block.attn2(norm, encoder_hidden_states, None, None)
        norm = (block.norm3(h.float()) * (1 + c_scale) + c_shift).type_as(h)
        return (h.float() + block.ffn(norm).float() * c_gate).type_as(h)

    return forward


class CameraAdapter(torch.nn.Module):
    """LingBot's camera adapter on top of diffusers' Wan (key names as in the
    diffusers-format LingBot checkpoints)."""

    def __init__(self, dim, layers, patch, fold=8):
        super().__init__()
        self.patch = patch
        # Rays folded fold x fold (the VAE's spatial factor), then patchified.
        self.patch_embedding_wancamctrl = torch.nn.Linear(6 * fold * fold * math.prod(patch), dim)
        self.c2ws_hidden_states_layer1 = torch.nn.Linear(dim, dim)
        self.c2ws_hidden_states_layer2 = torch.nn.Linear(dim, dim)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            b = torch.nn.Module()
            for name in ("cam_injector_layer1", "cam_injector_layer2",
                         "cam_scale_layer", "cam_shift_layer"):
                setattr(b, name, torch.nn.Linear(dim, dim))
            self.blocks.append(b)

    def tokens(self, rays):
        """[1, 6*fold^2, F, h, w] -> [1, L, dim] ('1 c (f c1) (h c2) (w c3) -> 1 (f h w) (c c1 c2 c3)')."""
        pt, ph, pw = self.patch
        _, c, f, h, w = rays.shape
        x = rays.reshape(1, c, f // pt, pt, h // ph, ph, w // pw, pw)
        x = x.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(1, -1, c * pt * ph * pw)
        x = self.patch_embedding_wancamctrl(x)
        return x + self.c2ws_hidden_states_layer2(F.silu(self.c2ws_hidden_states_layer1(x)))


def attach_camera(model, adapter):
    for block, cam in zip(model.blocks, adapter.blocks):
        for name in ("cam_injector_layer1", "cam_injector_layer2",
                     "cam_scale_layer", "cam_shift_layer"):
            setattr(block, name, getattr(cam, name))
        block.forward = camera_block_forward(block)
        block.attn1.set_processor(MaskedWanAttnProcessor())
        block.attn2.set_processor(MaskedWanAttnProcessor())


def full_forward(model, adapter, latents, frame_t, rays, contexts, frame_text, frame_mask):
    """One diffusers forward over every frame: per-token timesteps ``frame_t`` [F],
    camera rays [1, 6*s^2, F, h, w], text ``contexts[frame_text[f]]`` for frame f, and
    self-attention allowed from frame i to frame j iff ``frame_mask[i, j]``."""
    _, _, f, h, w = latents.shape
    pt, ph, pw = model.config.patch_size
    assert pt == 1 and h % ph == 0 and w % pw == 0, (model.config.patch_size, h, w)
    per_frame = (h // ph) * (w // pw)
    timestep = torch.tensor(frame_t, dtype=torch.float32).repeat_interleave(per_frame)[None]
    self_mask = frame_mask.repeat_interleave(per_frame, 0).repeat_interleave(per_frame, 1)
    ctx = torch.cat(contexts, 1)                                # [1, S·k, text_dim]
    text_mask = torch.zeros(f, ctx.shape[1], dtype=torch.bool)
    for i, k in enumerate(frame_text):
        text_mask[i, TEXT_TOKENS * k:TEXT_TOKENS * (k + 1)] = True
    text_mask = text_mask.repeat_interleave(per_frame, 0)
    cam = adapter.tokens(rays)
    for block in model.blocks:
        block.attn1.processor.mask = self_mask
        block.attn2.processor.mask = text_mask
        block.camera_tokens = cam
    with torch.no_grad():
        return model(hidden_states=latents, timestep=timestep,
                     encoder_hidden_states=ctx, return_dict=False)[0]


# ----------------------------------------------------------------------------------
# Weights, conditioning, the rollout

def init_linear_like(module, gen, gain=1.0, skip=()):
    for name, p in sorted(module.named_parameters()):
        if any(s in name for s in skip):
            continue
        if name.endswith("scale_shift_table"):
            p.data = 0.1 * torch.randn(p.shape, generator=gen)
        elif name.endswith((".norm_q.weight", ".norm_k.weight", ".norm2.weight")):
            p.data = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        elif name.endswith(".bias"):
            p.data = 0.05 * torch.randn(p.shape, generator=gen)
        elif name.endswith(".gamma"):
            p.data = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        else:
            p.data = gain * torch.randn(p.shape, generator=gen) / math.sqrt(math.prod(p.shape[1:]))


def image_condition(vae, image, latent_frames, g):
    """[1, 4 + z, L, h, w]: mask (1 at latent frame 0) | normalised VAE mean of
    [image, zeros x (N - 1)]. The later pixel frames are exact zeros in the [-1, 1]
    pixel range (mid-grey, not black): LingBot ``image2video_fast.py``
    ``torch.zeros(3, F - 1, h, w)``, vllm-omni ``_prepare_condition``
    ``image.new_zeros(...)`` and its streaming ``_prepare_condition_chunk``, like
    diffusers' Wan I2V pipeline."""
    n = 1 + g.temporal * (latent_frames - 1)
    video = torch.cat([image[None, :, None], torch.zeros(1, 3, n - 1, g.height, g.width)], 2)
    with torch.no_grad():
        z = vae.encode(video).latent_dist.mode()
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    z = (z - mean) / std
    assert z.shape[-2:] == g.latent_hw, (z.shape, g.latent_hw)
    msk = torch.zeros(1, 4, latent_frames, *g.latent_hw)
    msk[:, :, 0] = 1.0
    return torch.cat([msk, z], 1)


def padded(text):
    return torch.cat([text, torch.zeros(TEXT_TOKENS - text.shape[0], text.shape[1])])[None]


def rollout(model, adapter, noise, cameras, cond, texts, block_text, visible):
    """Every block's clean latents [blocks, z, 3, h, w]."""
    timesteps, sigmas = dmd_schedule(STEPS, SHIFT)
    contexts = [padded(t) for t in texts]
    clean = []
    for n in range(BLOCKS):
        frames = BLOCK * (n + 1)
        fmask = torch.zeros(frames, frames, dtype=torch.bool)
        for b in range(n + 1):
            for i in range(BLOCK * b, BLOCK * b + BLOCK):
                fmask[i, visible[b]] = True
        rays = torch.cat(cameras[:n + 1], 1)[None]
        frame_text = [block_text[f // BLOCK] for f in range(frames)]

        def velocity(x, t):
            latents = torch.cat(clean + [x], 2)
            if cond is not None:
                latents = torch.cat([latents, cond[:, :, :frames]], 1)
            frame_t = [0.0] * (frames - BLOCK) + [t] * BLOCK
            out = full_forward(model, adapter, latents, frame_t, rays, contexts, frame_text, fmask)
            return out[:, :, -BLOCK:]

        x = noise[n, 0][None]
        for k in range(STEPS):
            x0 = x - sigmas[k] * velocity(x, timesteps[k])
            if k + 1 < STEPS:
                x = (1 - sigmas[k + 1]) * x0 + sigmas[k + 1] * noise[n, k + 1][None]
        # The commit forward at t = 0 writes the KV the later blocks read; here every
        # later forward recomputes this block from x0 at t = 0 under its mask instead.
        clean.append(x0)
    return torch.cat(clean, 0)


def self_checks(model, adapter, gen, in_channels, g):
    """The overrides do what they claim: a block-diagonal mask makes each block's
    output that of the block alone, and masked text selects its context."""
    x = torch.randn(1, in_channels, 6, *g.latent_hw, generator=gen)
    rays = torch.randn(1, 6 * g.fold ** 2, 6, *g.latent_hw, generator=gen)
    a, b = torch.randn(7, g.dit["text_dim"], generator=gen), torch.randn(5, g.dit["text_dim"], generator=gen)
    diag = torch.zeros(6, 6, dtype=torch.bool)
    diag[:3, :3] = diag[3:, 3:] = True
    both = full_forward(model, adapter, x, [0.0] * 3 + [500.0] * 3, rays,
                        [padded(a), padded(b)], [0] * 3 + [1] * 3, diag)
    first = full_forward(model, adapter, x[:, :, :3], [0.0] * 3, rays[:, :, :3],
                         [padded(a)], [0] * 3, torch.ones(3, 3, dtype=torch.bool))
    err = (both[:, :, :3] - first).abs().max().item()
    assert err < 1e-5, err
    full = full_forward(model, adapter, x, [500.0] * 6, rays, [padded(b)], [0] * 6,
                        torch.ones(6, 6, dtype=torch.bool))
    full2 = full_forward(model, adapter, x, [500.0] * 6, rays, [padded(a), padded(b)],
                         [1] * 6, torch.ones(6, 6, dtype=torch.bool))
    assert (full - full2).abs().max().item() < 1e-5
    # A plain diffusers forward (no mask, scalar t) equals the all-true mask path
    # when the camera adapter is zero: the overrides add nothing else.
    saved = {k: v.clone() for k, v in adapter.state_dict().items()}
    for p in adapter.parameters():
        p.data.zero_()
    plain_blocks = [blk.forward for blk in model.blocks]
    masked = full_forward(model, adapter, x, [500.0] * 6, rays, [padded(a)], [0] * 6,
                          torch.ones(6, 6, dtype=torch.bool))
    for blk in model.blocks:
        del blk.forward                      # back to diffusers' own block forward
        blk.attn1.processor.mask = blk.attn2.processor.mask = None
    with torch.no_grad():
        plain = model(hidden_states=x, timestep=torch.tensor([500.0]),
                      encoder_hidden_states=padded(a), return_dict=False)[0]
    for blk, fwd in zip(model.blocks, plain_blocks):
        blk.forward = fwd
    adapter.load_state_dict(saved)
    err = (plain - masked).abs().max().item()
    assert err < 1e-5, err


def save_npy(path, t):
    np.save(path, np.ascontiguousarray(t.detach().numpy(), dtype="<f4"))


def make(name, case, visible):
    g = Geometry(case)
    gen = torch.Generator().manual_seed(case["seed"])
    torch.manual_seed(case["seed"])
    model = WanTransformer3DModel(**g.dit, in_channels=case["in_channels"]).eval()
    init_linear_like(model, gen)
    dim = g.dit["num_attention_heads"] * g.dit["attention_head_dim"]
    adapter = CameraAdapter(dim, g.dit["num_layers"], g.patch, g.fold).eval()
    init_linear_like(adapter, gen, gain=0.5)
    vae = AutoencoderKLWan(**g.vae).eval()
    init_linear_like(vae, gen)

    d = OUT_DIR / name
    (d / "transformer").mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d / "transformer")
    weights = load_file(d / "transformer" / "diffusion_pytorch_model.safetensors")
    cam = adapter.state_dict()
    for k, v in cam.items():
        weights[k] = v.contiguous()
    save_file(weights, d / "transformer" / "diffusion_pytorch_model.safetensors",
              metadata={"format": "pt"})
    vae.save_pretrained(d / "vae")
    attach_camera(model, adapter)
    self_checks(model, adapter, gen, case["in_channels"], g)

    noise = torch.randn(BLOCKS, STEPS, g.z, BLOCK, *g.latent_hw, generator=gen)
    texts = [torch.randn(7, g.dit["text_dim"], generator=gen),
             torch.randn(5, g.dit["text_dim"], generator=gen)]
    change = case["prompt_change"]
    block_text = [1 if change is not None and n >= change else 0 for n in range(BLOCKS)]
    image = torch.rand(3, g.height, g.width, generator=gen) * 2 - 1
    cond = image_condition(vae, image, BLOCKS * BLOCK, g) if case["image"] else None
    cameras = block_cameras(case, g)
    latents = rollout(model, adapter, noise, cameras, cond, texts, block_text, visible)

    # The camera, the text change and (i2v) the image must each visibly matter.
    def rerun(**over):
        args = dict(cameras=cameras, cond=cond, texts=texts, block_text=block_text,
                    visible=visible)
        args.update(over)
        return rollout(model, adapter, noise, **args)
    still = [plucker(relative_framewise([np.eye(4)] * 4)[1:], g.height, g.width, g.fold)] * BLOCKS
    effects = {"camera": rerun(cameras=still),
               "window eviction": rerun(visible=[list(range(BLOCK * n + BLOCK))
                                                 for n in range(BLOCKS)])}
    if case["image"]:
        effects["image"] = rerun(cond=image_condition(vae, -image, BLOCKS * BLOCK, g))
    if change is not None:
        effects["prompt change"] = rerun(block_text=[0] * BLOCKS)
    for what, other in effects.items():
        diff = (other - latents).abs().amax(dim=(1, 2, 3, 4))
        print(f"  {what} changes the blocks by " + " ".join(f"{v:.2g}" for v in diff.tolist()))
        assert diff.max() > 1e-2, what

    save_npy(d / "noise.npy", noise)
    save_npy(d / "text_a.npy", texts[0])
    save_npy(d / "text_b.npy", texts[1])
    if case["image"]:
        save_npy(d / "image.npy", image)
    save_npy(d / "latents.npy", latents)
    scenario = dict(width=g.width, height=g.height, frames=g.frames, blocks=BLOCKS, steps=STEPS,
                    flow_shift=SHIFT, sink_frames=SINK, window_frames=WINDOW,
                    actions=case["actions"],
                    events=[dict(chunk=c, **e) for c, e in sorted(case["events"].items())],
                    prompt_change_chunk=change)
    (d / "scenario.json").write_text(json.dumps(scenario, indent=2) + "\n")
    scale = latents.abs().amax(dim=(1, 2, 3, 4))
    print(f"{name}: in_channels {case['in_channels']}, {BLOCKS} blocks of "
          f"{list(latents.shape[1:])}; max|x0| per block "
          + " ".join(f"{s:.3f}" for s in scale.tolist()))


def main():
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    diffusers.utils.logging.set_verbosity_error()
    visible = visible_frames(BLOCKS, SINK, WINDOW)
    assert visible == vllm_visible(BLOCKS, SINK, WINDOW), (visible, vllm_visible(BLOCKS, SINK, WINDOW))
    assert visible[6] == list(range(9)) + list(range(12, 21)), visible[6]
    assert visible[7] == list(range(9)) + list(range(15, 24)), visible[7]
    print("visible frames per block:", visible)
    print("timesteps, sigmas:", dmd_schedule(STEPS, SHIFT))
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    versions = (f"python {platform.python_version()}\ntorch {torch.__version__}\n"
                f"diffusers {diffusers.__version__}\nnumpy {np.__version__}\n"
                f"safetensors {safetensors.__version__}\n")
    (OUT_DIR / "versions.txt").write_text(versions)
    names = sys.argv[1:] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    assert not unknown, f"unknown cases {unknown}; cases are {list(CASES)}"
    for name in names:
        make(name, CASES[name], visible)


if __name__ == "__main__":
    main()
