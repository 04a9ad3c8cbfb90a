"""diffusers' side of `headroom bench models`: the same DiT forward and VAE decode, timed.

    python tools/bench_diffusers_models.py --make DIR          # seeded 1.3B-shaped pipeline folder
    python tools/bench_diffusers_models.py --model DIR --dtype f32|bf16 [--reps N] [--threads 2] [--works dit,vae]

The folder holds `transformer/` (WanTransformer3DModel, the Wan2.1-T2V-1.3B config) and `vae/`
(AutoencoderKLWan, the Wan 2.1 config) with seeded random weights in f32 safetensors, so headroom
(`headroom bench models --model DIR --reference "python tools/bench_diffusers_models.py"`) and
diffusers run identical weights. Inputs are seeded the same way on both sides in shape only (the
timing does not depend on the values). Prints one JSON line {"dit_forward_s", "vae_decode_s"}
(best of --reps after one warm-up; null for a network --works leaves out, which is not loaded).
"""

import argparse
import json
import os
import time

import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel

DIT_1_3B = dict(
    patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
    out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30,
    cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
)


def make(folder):
    torch.manual_seed(0)
    dit = WanTransformer3DModel(**DIT_1_3B)
    with torch.no_grad():
        for p in dit.parameters():
            p.normal_(0.0, 0.02)
    dit.save_pretrained(os.path.join(folder, "transformer"), safe_serialization=True, max_shard_size="20GB")
    del dit
    vae = AutoencoderKLWan()
    vae.save_pretrained(os.path.join(folder, "vae"), safe_serialization=True)


def best(reps, fn):
    fn()
    times = []
    for _ in range(max(reps, 1)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--make")
    ap.add_argument("--model")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--width", type=int, default=416)
    ap.add_argument("--height", type=int, default=240)
    ap.add_argument("--works", default="dit,vae", help="networks to time, comma-separated")
    args = ap.parse_args()
    works = set(args.works.split(","))
    torch.set_num_threads(args.threads)
    if args.make:
        make(args.make)
        return
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    dit = vae = None
    if "dit" in works:
        dit = WanTransformer3DModel.from_pretrained(os.path.join(args.model, "transformer"), torch_dtype=dtype).eval()
    if "vae" in works:
        vae = AutoencoderKLWan.from_pretrained(os.path.join(args.model, "vae"), torch_dtype=dtype).eval()
    h, w = args.height // 8, args.width // 8
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, 3, h, w, generator=g).to(dtype)
    text = (0.1 * torch.randn(1, 512, 4096, generator=g)).to(dtype)
    z = torch.randn(1, 16, 3, h, w, generator=g).to(dtype)
    t = torch.tensor([999.0])
    with torch.inference_mode():
        dit_s = best(args.reps, lambda: dit(latents, t, text, return_dict=False)) if dit else None
        vae_s = best(args.reps, lambda: vae.decode(z, return_dict=False)) if vae else None
    print(json.dumps({"dit_forward_s": dit_s, "vae_decode_s": vae_s, "dtype": args.dtype, "threads": args.threads}))


if __name__ == "__main__":
    main()
