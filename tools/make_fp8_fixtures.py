"""8-bit checkpoints of a Wan transformer in the layouts users download, and diffusers'
forward on the weights they hold.

From a diffusers transformer folder (f32 weights) this writes, under original Wan names:

* `comfy_fp8_scaled.safetensors`: ComfyUI's `*_fp8_scaled` layout: `model.diffusion_model.`
  prefix, every block linear and the text embedding's first linear as `float8_e4m3fn`
  with a per-tensor `scale_weight` (max|w| / 448), the rest in bf16, and the
  `scaled_fp8` marker tensor;
* `kijai_fp8_e4m3fn.safetensors`: Kijai's plain `*_fp8_e4m3fn` layout: the block linears
  cast to `float8_e4m3fn` without scales, the rest bf16, no prefix;
* `int8_weight_scale.safetensors`: lightx2v's int8 layout: the block linears as int8
  with a per-output-channel `weight_scale` `[out, 1]` (max|w| / 127), the rest bf16;

and, for each, diffusers' `WanTransformer3DModel` on the weights the file holds
(dequantized: codes × scale) in f32 (`out_<name>.npy`) and in bf16, whose distance from
the f32 output is PyTorch's own bf16 error (`bf16_error.json`, per file).

    ~/.headroom-reference/bin/python tools/make_fp8_fixtures.py                # the test fixture
    ~/.headroom-reference/bin/python tools/make_fp8_fixtures.py --from /work/wan13b/transformer \
        --out /work/wan13b_8bit --frames 3 --height 30 --width 52 --layouts comfy_fp8_scaled
        # the seeded 1.3B at one AR block's shapes (1,170 tokens)
"""

import argparse
import json
import pathlib

import numpy as np
import torch
import diffusers
from diffusers import WanTransformer3DModel
from safetensors.torch import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "crates/model/tests/fixtures"

TOP = [
    ("condition_embedder.time_embedder.linear_1.", "time_embedding.0."),
    ("condition_embedder.time_embedder.linear_2.", "time_embedding.2."),
    ("condition_embedder.text_embedder.linear_1.", "text_embedding.0."),
    ("condition_embedder.text_embedder.linear_2.", "text_embedding.2."),
    ("condition_embedder.time_proj.", "time_projection.1."),
    ("proj_out.", "head.head."),
]
PROJ = {"to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "o"}


def original(key):
    """The original Wan name of a diffusers transformer key."""
    for ours, theirs in TOP:
        if key.startswith(ours):
            return theirs + key[len(ours):]
    if key == "scale_shift_table":
        return "head.modulation"
    if not key.startswith("blocks."):
        return key
    _, n, inner = key.split(".", 2)
    for attn, name in (("attn1.", "self_attn."), ("attn2.", "cross_attn.")):
        if inner.startswith(attn):
            rest = inner[len(attn):]
            for proj, short in PROJ.items():
                if rest.startswith(proj + "."):
                    rest = short + rest[len(proj):]
            return f"blocks.{n}.{name}{rest}"
    for ours, theirs in (("scale_shift_table", "modulation"), ("ffn.net.0.proj.", "ffn.0."),
                         ("ffn.net.2.", "ffn.2."), ("norm2.", "norm3.")):
        if inner.startswith(ours):
            return f"blocks.{n}.{theirs}{inner[len(ours):]}"
    return key


def quantized(key):
    """Whether a diffusers key is a block linear's weight (what the 8-bit files quantize)."""
    return key.startswith("blocks.") and key.endswith(".weight") and (
        ".attn1.to_" in key or ".attn2.to_" in key or ".ffn.net." in key)


def comfy_fp8_scaled(weights):
    """ComfyUI scaled: per-tensor scales, the text embedding's first linear too."""
    file, deq = {"model.diffusion_model.scaled_fp8": torch.zeros(0, dtype=torch.float8_e4m3fn)}, {}
    for k, w in weights.items():
        name = "model.diffusion_model." + original(k)
        if quantized(k) or k == "condition_embedder.text_embedder.linear_1.weight":
            scale = (w.abs().max() / 448.0).clamp(min=1e-12)
            codes = (w / scale).to(torch.float8_e4m3fn)
            file[name] = codes
            file[name[: -len("weight")] + "scale_weight"] = scale.reshape(())
            deq[k] = codes.float() * scale
        else:
            file[name] = w.to(torch.bfloat16)
            deq[k] = file[name].float()
    return file, deq


def kijai_fp8_e4m3fn(weights):
    """Kijai: plain casts, no scales."""
    file, deq = {}, {}
    for k, w in weights.items():
        if quantized(k):
            file[original(k)] = w.to(torch.float8_e4m3fn)
        else:
            file[original(k)] = w.to(torch.bfloat16)
        deq[k] = file[original(k)].float()
    return file, deq


def int8_weight_scale(weights):
    """lightx2v int8: per output channel, [out, 1]."""
    file, deq = {}, {}
    for k, w in weights.items():
        name = original(k)
        if quantized(k):
            scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-12)
            codes = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
            file[name] = codes
            file[name[: -len("weight")] + "weight_scale"] = scale.float()
            deq[k] = codes.float() * scale
        else:
            file[name] = w.to(torch.bfloat16)
            deq[k] = file[name].float()
    return file, deq


LAYOUTS = {f.__name__: f for f in (comfy_fp8_scaled, kijai_fp8_e4m3fn, int8_weight_scale)}


def as_bf16(model):
    """The model in bf16 the way `from_pretrained(torch_dtype=torch.bfloat16)` holds it:
    the modules diffusers keeps in f32 stay f32."""
    model.to(torch.bfloat16)
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    for name, module in model.named_modules():
        if any(k in name.split(".") for k in keep):
            module.float()
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="src", default=str(FIXTURE / "dit/t2v"))
    ap.add_argument("--out", default=str(FIXTURE / "fp8"))
    ap.add_argument("--frames", type=int, default=3)
    ap.add_argument("--height", type=int, default=4)
    ap.add_argument("--width", type=int, default=6)
    ap.add_argument("--text-tokens", type=int, default=7)
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated")
    a = ap.parse_args()
    torch.set_num_threads(2)
    src, out = pathlib.Path(a.src), pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    weights = load_file(src / "diffusion_pytorch_model.safetensors")
    g = torch.Generator().manual_seed(11)
    x = torch.randn(1, config["in_channels"], a.frames, a.height, a.width, generator=g)
    text = torch.randn(a.text_tokens, config["text_dim"], generator=g)
    t = torch.tensor([937.5])
    np.save(out / "latents.npy", x.numpy())
    np.save(out / "text.npy", text.numpy())
    np.save(out / "timestep.npy", t.numpy())
    errors = {}
    with torch.inference_mode():
        model = WanTransformer3DModel.from_config(config).eval()
        for name in a.layouts.split(","):
            file, deq = LAYOUTS[name](weights)
            save_file(file, str(out / f"{name}.safetensors"))
            del file
            model.load_state_dict(deq)
            del deq
            f32 = model.float()(hidden_states=x, timestep=t, encoder_hidden_states=text[None]).sample
            bf16 = as_bf16(model)(
                hidden_states=x.bfloat16(), timestep=t, encoder_hidden_states=text[None].bfloat16()
            ).sample.float()
            model.float()
            np.save(out / f"out_{name}.npy", f32.numpy())
            errors[name] = float((bf16 - f32).abs().max())
            print(name, "bf16 error", errors[name], "bytes", (out / f"{name}.safetensors").stat().st_size)
    info = {"max_abs_error": errors, "torch": torch.__version__, "diffusers": diffusers.__version__}
    (out / "bf16_error.json").write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
