#!/usr/bin/env python3
"""A procedural world and its exact renderer: the ground truth the `world` model learns.

A textured ground plane, a sky gradient and scattered coloured boxes, all drawn from a
seed, seen by a pinhole camera in OpenCV axes (x right, y down, z forward). The camera
moves with the key semantics of ``crates/model/src/camera.rs``: one key set per latent
frame (w/s forward/back 0.05, d/a right/left 0.05, i/k pitch +-4 deg, j/l yaw +-6 deg),
integrated like the engine's controller, so latent frame ``f`` sits at the pose after
keys ``0..=f``. Pixel frame 0 is latent frame 0; the four pixel frames ``4f-3..4f`` of
latent frame ``f >= 1`` move from pose ``f-1`` to pose ``f`` in quarter steps, as the
VAE folds four pixel frames into one latent frame. The focal length is the engine's
default intrinsics (500 px at 832x480, scaled).

    python tools/world/render.py --seed 3 --actions wwddlljj-- --frames 33 --out DIR

writes ``DIR/frame_0000.png ...``. Deterministic: same seed and keys, same bytes.
"""

import argparse
import math
import pathlib

import numpy as np
from PIL import Image

WIDTH, HEIGHT = 128, 96        # the world model's resolution
STEP = 0.05                    # camera.rs STEP
PITCH_STEP = math.radians(4.0)
YAW_STEP = math.radians(6.0)
PITCH_LIMIT = math.radians(85.0)
EYE = 0.6                      # camera height above the ground
SUPERSAMPLE = 2                # per axis, box-filtered


def rot_x(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def rot_y(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def controller(actions, latent_frames):
    """(yaw, pitch, position) after each latent frame's keys, as camera.rs integrates
    them: the rotation is rot_y(yaw) @ rot_x(pitch) and moves follow the new heading."""
    yaw, pitch, pos = 0.0, 0.0, np.zeros(3)
    out = []
    for f in range(latent_frames):
        keys = actions[f] if f < len(actions) else "-"
        k = lambda ch: 1.0 if ch in keys else 0.0
        dp = PITCH_STEP * (k("i") - k("k"))
        if abs(pitch + dp) <= PITCH_LIMIT:
            pitch += dp
        yaw += YAW_STEP * (k("l") - k("j"))
        r = rot_y(yaw) @ rot_x(pitch)
        fwd = np.array([r[0, 2], 0.0, r[2, 2]])
        rgt = np.array([r[0, 0], 0.0, r[2, 0]])
        fwd /= np.linalg.norm(fwd) + 1e-6
        rgt /= np.linalg.norm(rgt) + 1e-6
        pos = pos + STEP * (k("w") - k("s")) * fwd + STEP * (k("d") - k("a")) * rgt
        out.append((yaw, pitch, pos.copy()))
    return out


def pixel_poses(actions, frames):
    """Camera-to-world (rotation, position) per pixel frame."""
    latent = (frames - 1) // 4 + 1
    states = controller(actions, latent)
    poses = []
    for p in range(frames):
        f = (p + 3) // 4
        if f == 0:
            yaw, pitch, pos = states[0]
        else:
            a = (p - (4 * f - 3) + 1) / 4.0
            (y0, p0, t0), (y1, p1, t1) = states[f - 1], states[f]
            yaw, pitch, pos = y0 + a * (y1 - y0), p0 + a * (p1 - p0), t0 + a * (t1 - t0)
        poses.append((rot_y(yaw) @ rot_x(pitch), pos))
    return poses


class World:
    """Everything a seed decides: palette, ground texture, sky and boxes."""

    def __init__(self, seed):
        rng = np.random.default_rng(seed)
        hue = rng.uniform(0, 1, size=2)
        self.tile = rng.uniform(0.35, 0.8)
        base = rng.uniform(0.2, 0.7, size=3)
        self.ground_a = np.clip(base + rng.uniform(-0.1, 0.1, 3), 0, 1)
        self.ground_b = np.clip(base * rng.uniform(0.45, 0.8), 0, 1)
        self.sky_top = np.clip(np.array([0.15, 0.35, 0.75]) + 0.25 * (hue[0] - 0.5), 0, 1)
        self.sky_low = np.clip(np.array([0.85, 0.85, 0.9]) - 0.3 * np.array([hue[1], 0.5 * hue[1], 0]), 0, 1)
        self.fog = 0.5 * (self.sky_low + self.ground_a)
        n = int(rng.integers(10, 22))
        boxes = []
        for _ in range(n):
            r = rng.uniform(1.8, 8.0)
            th = rng.uniform(-math.pi, math.pi)
            cx, cz = r * math.sin(th), r * math.cos(th)
            sx, sz = rng.uniform(0.1, 0.4, 2)
            h = rng.uniform(0.3, 1.6)
            col = rng.uniform(0.1, 1.0, 3)
            boxes.append((np.array([cx - sx, EYE - h, cz - sz]), np.array([cx + sx, EYE, cz + sz]), col))
        self.lo = np.stack([b[0] for b in boxes]).astype(np.float32)
        self.hi = np.stack([b[1] for b in boxes]).astype(np.float32)
        self.col = np.stack([b[2] for b in boxes])

    def visible(self, rot, origin):
        """Indices of the boxes that can be in view (bounding spheres inside a 60-degree
        cone around the view axis, wider than the frame's half diagonal)."""
        centre = 0.5 * (self.lo + self.hi) - origin
        radius = 0.5 * np.linalg.norm(self.hi - self.lo, axis=1)
        dist = np.linalg.norm(centre, axis=1)
        fwd = rot[:, 2]
        cos = (centre @ fwd) / np.maximum(dist, 1e-9)
        ang = np.arccos(np.clip(cos, -1, 1)) - np.arcsin(np.clip(radius / np.maximum(dist, 1e-9), 0, 1))
        return np.nonzero((dist < radius + 0.1) | (ang < math.radians(60)))[0]

    def shade(self, origin, dirs, boxes=None):
        """Colours [N, 3] of rays from ``origin`` along unit ``dirs`` [N, 3], testing
        only ``boxes`` (indices; all by default)."""
        boxes = np.arange(len(self.lo)) if boxes is None else boxes
        n = dirs.shape[0]
        t_best = np.full(n, np.inf)
        color = np.zeros((n, 3))
        # Sky: a vertical gradient (y points down, so -dy is up).
        up = np.clip(-dirs[:, 1], 0, 1)[:, None]
        color[:] = self.sky_low + (self.sky_top - self.sky_low) * np.sqrt(up)
        # Ground plane y = EYE.
        with np.errstate(divide="ignore", invalid="ignore"):
            tg = (EYE - origin[1]) / dirs[:, 1]
        hit = (dirs[:, 1] > 1e-6) & (tg > 0)
        if hit.any():
            p = origin + tg[hit, None] * dirs[hit]
            u, v = p[:, 0] / self.tile, p[:, 2] / self.tile
            check = (np.floor(u) + np.floor(v)) % 2 == 0
            stripe = 0.08 * np.sin(2.0 * (p[:, 0] + 0.5 * p[:, 2]))
            c = np.where(check[:, None], self.ground_a, self.ground_b) + stripe[:, None]
            fog = 1.0 - np.exp(-tg[hit] / 9.0)
            c = c + (self.fog - c) * fog[:, None]
            color[hit] = c
            t_best[hit] = tg[hit]
        # Boxes: slab intersection of every ray with every box at once, flat shading.
        if not boxes.size:
            return color
        light = np.array([0.4, -0.8, 0.3])
        light /= np.linalg.norm(light)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = 1.0 / dirs
            t0 = (self.lo[boxes][None] - origin) * inv[:, None]          # [N, B, 3]
            t1 = (self.hi[boxes][None] - origin) * inv[:, None]
        tmin = np.minimum(t0, t1)
        near = tmin.max(axis=2)
        far = np.maximum(t0, t1).min(axis=2)
        ok = (far >= near) & (near > 1e-4)
        near = np.where(ok, near, np.inf)
        b = near.argmin(axis=1)
        rows = np.arange(n)
        tb = near[rows, b]
        hit = tb < t_best
        if hit.any():
            rows, b, tb = rows[hit], b[hit], tb[hit]
            axis = tmin[rows, b].argmax(axis=1)
            normal = np.zeros((rows.size, 3))
            normal[np.arange(rows.size), axis] = -np.sign(dirs[rows, axis])
            lam = 0.45 + 0.55 * np.clip(normal @ -light, 0, 1)
            c = self.col[boxes][b] * lam[:, None]
            fog = 1.0 - np.exp(-tb / 9.0)
            color[rows] = c + (self.fog - c) * fog[:, None]
        return color


def camera_rays(width, height):
    """Unit camera-space ray directions [H*S, W*S, 3] at sub-pixel centres."""
    s = SUPERSAMPLE
    fx = 500.0 * width / 832.0
    fy = 500.0 * height / 480.0
    cx, cy = width / 2.0, height / 2.0
    ys = (np.arange(height * s) + 0.5) / s
    xs = (np.arange(width * s) + 0.5) / s
    gx, gy = np.meshgrid(xs, ys)
    d = np.stack([(gx - cx) / fx, (gy - cy) / fy, np.ones_like(gx)], -1)
    return d / np.linalg.norm(d, axis=-1, keepdims=True)


def render(seed, actions, frames, width=WIDTH, height=HEIGHT):
    """uint8 frames [F, H, W, 3]."""
    world = World(seed)
    rays = camera_rays(width, height).reshape(-1, 3).astype(np.float32)
    s = SUPERSAMPLE
    out = []
    for rot, pos in pixel_poses(actions, frames):
        o = pos.astype(np.float32)
        c = world.shade(o, rays @ rot.T.astype(np.float32), world.visible(rot, o)).reshape(height, s, width, s, 3).mean(axis=(1, 3))
        out.append(np.clip(np.round(c * 255.0), 0, 255).astype(np.uint8))
    return np.stack(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--actions", default="", help="one key set character per latent frame")
    ap.add_argument("--frames", type=int, default=33)
    ap.add_argument("--width", type=int, default=WIDTH)
    ap.add_argument("--height", type=int, default=HEIGHT)
    ap.add_argument("--out", type=pathlib.Path, required=True)
    a = ap.parse_args()
    bad = set(a.actions) - set("wasdijkl-")
    if bad:
        ap.error(f"--actions: unknown keys {sorted(bad)}; use w a s d i j k l or -")
    if a.frames < 1 or (a.frames - 1) % 4:
        ap.error("--frames must be 1 + 4k")
    a.out.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(render(a.seed, a.actions, a.frames, a.width, a.height)):
        Image.fromarray(f).save(a.out / f"frame_{i:04d}.png")


if __name__ == "__main__":
    main()
