#!/usr/bin/env python3
"""taehv.py's side of `headroom bench vae --reference`: the same TAEHV decode, timed.

    python tools/bench_taehv.py --taehv /tmp/taehv.py [--file decoder.pth] \
        --latent-channels 16 --height 240 --width 416 --frames 3 \
        [--dtype f32|bf16] [--threads 2] [--reps 3]

Decodes one block of `--frames` latent frames at the given video size from a fresh
stream with madebyollin/taehv's `TAEHV.decode_video` (not vendored: pass its path), in
both of its modes (parallel over frames, its default, and sequential), and prints one
JSON line {"decode_s", "parallel_s", "sequential_s"}: the best of --reps after one
warm-up, `decode_s` the faster mode. Without --file the decoder has the released
widths and seeded weights (the time does not depend on the values).
"""

import argparse
import importlib.util
import json
import time

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--taehv", required=True, help="path to taehv.py")
    parser.add_argument("--file", help="a TAEHV .pth (its shapes and values)")
    parser.add_argument("--latent-channels", type=int, default=16)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--width", type=int, default=416)
    parser.add_argument("--frames", type=int, default=3)
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = importlib.util.spec_from_file_location("taehv", args.taehv)
    t = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(t)
    patch = 2 if args.latent_channels == 48 else 1
    torch.manual_seed(0)
    model = t.TAEHV(checkpoint_path=None, patch_size=patch, latent_channels=args.latent_channels)
    if args.file:
        state = torch.load(args.file, map_location="cpu", weights_only=True)
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = model.to(dtype).eval()
    s = 8 * patch
    x = torch.randn(1, args.frames, args.latent_channels, args.height // s, args.width // s).to(dtype)
    times = {}
    with torch.no_grad():
        for parallel in (True, False):
            best = float("inf")
            for rep in range(args.reps + 1):
                start = time.perf_counter()
                model.decode_video(x, parallel=parallel, show_progress_bar=False)
                took = time.perf_counter() - start
                if rep > 0:
                    best = min(best, took)
            times["parallel_s" if parallel else "sequential_s"] = best
    times["decode_s"] = min(times.values())
    print(json.dumps(times))


if __name__ == "__main__":
    main()
