#!/usr/bin/env python3
"""Write the checkpoint-import fixtures in crates/model/tests/fixtures/import/.

One tiny Wan model (a diffusers ``WanTransformer3DModel`` and ``AutoencoderKLWan``
with seeded weights) is written in every layout users download:

  diffusers/transformer/, diffusers/vae/   the diffusers pipeline twin (save_pretrained)
  wan/config.json                          original WanModel config keys
  wan/diffusion_pytorch_model.safetensors  original Wan DiT key names
  wan/Wan2.1_VAE.pth                       torch.save of the original VAE state dict
  self_forcing.pt                          {"generator_ema": {"model." + name: t},
                                            "generator": (other weights), "critic": ...}
  comfy.safetensors                        "model.diffusion_model." + original names
  latents.npy, timestep.npy, text.npy, dit_out.npy    diffusers forward (with text)
  vae_latents.npy, vae_decoded.npy                    diffusers vae.decode

The original names are made by this script's own inverse of the renaming, and
every original state dict is checked with diffusers' converters
(``convert_wan_transformer_to_diffusers`` / ``convert_wan_vae_to_diffusers``): they
must give back exactly the diffusers state dict. diffusers' VAE converter only knows
the real Wan 2.1 VAE (num_res_blocks = 2, four stages; its up-block table is fixed),
so the VAE inverse is also checked on a full-size VAE built on the meta device; the
tiny fixture VAE (num_res_blocks = 1) is checked through its numbers in the Rust
tests instead.

With ``--t5`` it writes crates/text/tests/fixtures/wan_t5/ instead: the text
fixtures' UMT5 encoder as Wan ships its T5 (``models_t5_umt5-xxl-enc-bf16.pth`` in
Wan names, bf16, and the tokenizer under ``google/umt5-xxl/``).

Needs the reference environment; CI never runs it:

    ~/.headroom-reference/bin/python tools/make_import_fixtures.py [--t5]
"""

import json
import math
import pathlib
import re

import numpy as np
import torch
import diffusers
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from diffusers.loaders.single_file_utils import (
    convert_wan_transformer_to_diffusers,
    convert_wan_vae_to_diffusers,
)
from safetensors.torch import save_file

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = REPO_ROOT / "crates" / "model" / "tests" / "fixtures" / "import"

DIT = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
           in_channels=16, out_channels=16, text_dim=8, freq_dim=16, ffn_dim=32,
           num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
           eps=1e-6, rope_max_seq_len=1024)
VAE = dict(base_dim=4, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
           temperal_downsample=[False, True, True], attn_scales=[])


def init(model, gen):
    """Every parameter random (norm scales near 1) so a misplaced key shows."""
    for name, p in sorted(model.named_parameters()):
        if name.endswith("scale_shift_table"):
            p.data = 0.1 * torch.randn(p.shape, generator=gen)
        elif name.endswith((".norm_q.weight", ".norm_k.weight", ".norm2.weight", ".gamma")):
            p.data = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        elif name.endswith(".bias"):
            p.data = 0.05 * torch.randn(p.shape, generator=gen)
        else:
            p.data = torch.randn(p.shape, generator=gen) / math.sqrt(math.prod(p.shape[1:]))


# ---- our inverse of the DiT renaming: diffusers name -> original Wan name ----
DIT_TOP = [
    ("condition_embedder.time_embedder.linear_1.", "time_embedding.0."),
    ("condition_embedder.time_embedder.linear_2.", "time_embedding.2."),
    ("condition_embedder.text_embedder.linear_1.", "text_embedding.0."),
    ("condition_embedder.text_embedder.linear_2.", "text_embedding.2."),
    ("condition_embedder.time_proj.", "time_projection.1."),
    ("proj_out.", "head.head."),
    ("scale_shift_table", "head.modulation"),
]
BLOCK = [
    ("attn1.to_out.0.", "self_attn.o."), ("attn2.to_out.0.", "cross_attn.o."),
    ("attn1.to_", "self_attn."), ("attn2.to_", "cross_attn."),
    ("attn1.", "self_attn."), ("attn2.", "cross_attn."),
    ("scale_shift_table", "modulation"),
    ("ffn.net.0.proj.", "ffn.0."), ("ffn.net.2.", "ffn.2."),
    ("norm2.", "norm3."), ("norm3.", "norm2."),
]


def dit_to_original(name):
    m = re.match(r"blocks\.(\d+)\.(.*)", name)
    if m:
        i, rest = m.groups()
        for a, b in BLOCK:
            if rest.startswith(a):
                return f"blocks.{i}.{b}{rest[len(a):]}"
        return name
    for a, b in DIT_TOP:
        if name.startswith(a):
            return b + name[len(a):]
    return name


RES = [("norm1.", "residual.0."), ("conv1.", "residual.2."), ("norm2.", "residual.3."),
       ("conv2.", "residual.6."), ("conv_shortcut.", "shortcut.")]


def res_to_original(rest):
    for a, b in RES:
        if rest.startswith(a):
            return b + rest[len(a):]
    raise KeyError(rest)


def vae_to_original(name, num_res_blocks):
    top = {"quant_conv.": "conv1.", "post_quant_conv.": "conv2."}
    for a, b in top.items():
        if name.startswith(a):
            return b + name[len(a):]
    coder, rest = name.split(".", 1)
    for a, b in (("conv_in.", "conv1."), ("norm_out.", "head.0."), ("conv_out.", "head.2.")):
        if rest.startswith(a):
            return f"{coder}.{b}{rest[len(a):]}"
    m = re.match(r"mid_block\.(resnets|attentions)\.(\d+)\.(.*)", rest)
    if m:
        kind, i, tail = m.groups()
        if kind == "attentions":
            return f"{coder}.middle.1.{tail}"
        return f"{coder}.middle.{2 * int(i)}.{res_to_original(tail)}"
    m = re.match(r"down_blocks\.(\d+)\.(.*)", rest)
    if m:
        k, tail = m.groups()
        try:
            tail = res_to_original(tail)
        except KeyError:
            pass
        return f"{coder}.downsamples.{k}.{tail}"
    m = re.match(r"up_blocks\.(\d+)\.(resnets|upsamplers)\.(\d+)\.(.*)", rest)
    stride = num_res_blocks + 2
    stage, kind, j, tail = m.groups()
    if kind == "upsamplers":
        return f"{coder}.upsamples.{int(stage) * stride + stride - 1}.{tail}"
    return f"{coder}.upsamples.{int(stage) * stride + int(j)}.{res_to_original(tail)}"


def check_same(converted, reference, what):
    assert set(converted) == set(reference), (what, sorted(set(converted) ^ set(reference))[:8])
    for k, v in reference.items():
        assert converted[k].shape == v.shape and torch.equal(converted[k], v), (what, k)


def save_npy(path, t):
    np.save(path, np.ascontiguousarray(t.detach().numpy(), dtype="<f4"))


def original_config(cfg):
    dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    return {"_class_name": "WanModel", "_diffusers_version": "0.22.0", "dim": dim,
            "eps": cfg["eps"], "ffn_dim": cfg["ffn_dim"], "freq_dim": cfg["freq_dim"],
            "in_dim": cfg["in_channels"], "model_type": "t2v",
            "num_heads": cfg["num_attention_heads"], "num_layers": cfg["num_layers"],
            "out_dim": cfg["out_channels"], "text_len": 512, "text_dim": cfg["text_dim"],
            "qk_norm": True, "cross_attn_norm": True, "window_size": [-1, -1],
            "patch_size": list(cfg["patch_size"])}


def main():
    torch.set_num_threads(1)
    diffusers.utils.logging.set_verbosity_error()
    gen = torch.Generator().manual_seed(17)
    torch.manual_seed(17)

    # The real sizes' key sets (meta device: no memory), checked both ways.
    with torch.device("meta"):
        full_vae = AutoencoderKLWan()
        full_dit = WanTransformer3DModel(num_attention_heads=12, ffn_dim=8960, num_layers=30)
    for model, to_orig, conv, what in (
        (full_vae, lambda k: vae_to_original(k, 2), convert_wan_vae_to_diffusers, "Wan2.1 VAE"),
        (full_dit, dit_to_original, convert_wan_transformer_to_diffusers, "Wan2.1 1.3B DiT"),
    ):
        keys = model.state_dict().keys()
        marker = {to_orig(k): torch.tensor(float(i)) for i, k in enumerate(keys)}
        back = conv(dict(marker))
        ref = {k: torch.tensor(float(i)) for i, k in enumerate(keys)}
        check_same(back, ref, what)
        print(f"{what}: {len(ref)} keys round-trip through diffusers' converter")

    dit = WanTransformer3DModel(**DIT).eval()
    init(dit, gen)
    vae = AutoencoderKLWan(**VAE).eval()
    init(vae, gen)
    dit_sd = {k: v.detach().clone().contiguous() for k, v in dit.state_dict().items()}
    vae_sd = {k: v.detach().clone().contiguous() for k, v in vae.state_dict().items()}
    dit_orig = {dit_to_original(k): v for k, v in dit_sd.items()}
    check_same(convert_wan_transformer_to_diffusers(dict(dit_orig)), dit_sd, "tiny DiT")
    comfy = {"model.diffusion_model." + k: v for k, v in dit_orig.items()}
    check_same(convert_wan_transformer_to_diffusers(dict(comfy)), dit_sd, "tiny DiT (ComfyUI)")
    vae_orig = {vae_to_original(k, VAE["num_res_blocks"]): v for k, v in vae_sd.items()}
    assert len(vae_orig) == len(vae_sd)

    OUT.mkdir(parents=True, exist_ok=True)
    dit.save_pretrained(OUT / "diffusers" / "transformer")
    vae.save_pretrained(OUT / "diffusers" / "vae")
    wan = OUT / "wan"
    wan.mkdir(exist_ok=True)
    (wan / "config.json").write_text(json.dumps(original_config(DIT), indent=2) + "\n")
    save_file(dit_orig, wan / "diffusion_pytorch_model.safetensors")
    torch.save(vae_orig, wan / "Wan2.1_VAE.pth")
    save_file(comfy, OUT / "comfy.safetensors")
    other = {"model." + k: v * 0.5 for k, v in dit_orig.items()}
    torch.save({"generator_ema": {"model." + k: v for k, v in dit_orig.items()},
                "generator": other,
                "critic": {"model.head.head.weight": torch.zeros(3, 3)},
                "step": 1000}, OUT / "self_forcing.pt")

    latents = torch.randn(1, 16, 3, 4, 6, generator=gen)
    text = torch.randn(5, DIT["text_dim"], generator=gen)
    t = torch.tensor([937.5])
    with torch.no_grad():
        out = dit(hidden_states=latents, timestep=t, encoder_hidden_states=text[None]).sample
        z = torch.randn(1, 16, 3, 2, 2, generator=gen)
        decoded = vae.decode(z).sample
    for name, x in (("latents", latents), ("text", text), ("timestep", t), ("dit_out", out),
                    ("vae_latents", z), ("vae_decoded", decoded)):
        save_npy(OUT / f"{name}.npy", x)
    print(f"tiny DiT {len(dit_sd)} tensors, VAE {len(vae_sd)} tensors; out {list(out.shape)},"
          f" decoded {list(decoded.shape)}")


# ---- Wan's own T5 checkpoint, for crates/text ----
def t5_to_wan(name):
    """transformers UMT5EncoderModel name -> Wan T5 name (wan/modules/t5.py)."""
    if name == "shared.weight":
        return "token_embedding.weight"
    if name == "encoder.final_layer_norm.weight":
        return "norm.weight"
    m = re.match(r"encoder\.block\.(\d+)\.layer\.(\d)\.(.*)", name)
    i, layer, rest = m.groups()
    table = {
        "0.layer_norm.weight": "norm1.weight",
        "1.layer_norm.weight": "norm2.weight",
        "0.SelfAttention.relative_attention_bias.weight": "pos_embedding.embedding.weight",
        "1.DenseReluDense.wi_0.weight": "ffn.gate.0.weight",
        "1.DenseReluDense.wi_1.weight": "ffn.fc1.weight",
        "1.DenseReluDense.wo.weight": "ffn.fc2.weight",
    }
    key = f"{layer}.{rest}"
    if key in table:
        return f"blocks.{i}.{table[key]}"
    proj = re.match(r"0\.SelfAttention\.([qkvo])\.weight", key).group(1)
    return f"blocks.{i}.attn.{proj}.weight"


def make_wan_t5():
    """The text fixtures' UMT5 encoder as Wan ships its T5: bf16 .pth in Wan names, with
    the tokenizer under google/umt5-xxl/."""
    import shutil
    from safetensors.torch import load_file
    text = REPO_ROOT / "crates" / "text" / "tests" / "fixtures"
    state = load_file(text / "text_encoder" / "model.safetensors")
    state.pop("encoder.embed_tokens.weight", None)  # tied to shared.weight
    wan = {t5_to_wan(k): v.to(torch.bfloat16).contiguous() for k, v in state.items()}
    assert len(wan) == len(state)
    out = text / "wan_t5"
    (out / "google").mkdir(parents=True, exist_ok=True)
    torch.save(wan, out / "models_t5_umt5-xxl-enc-bf16.pth")
    shutil.copytree(text / "tokenizer", out / "google" / "umt5-xxl", dirs_exist_ok=True)
    print(f"Wan T5: {len(wan)} tensors (bf16) -> {out}")


if __name__ == "__main__":
    import sys
    if "--t5" in sys.argv:
        make_wan_t5()
    else:
        main()
