#!/usr/bin/env python3
"""Write the UMT5 text-encoder golden fixtures in crates/text/tests/fixtures/.

The Wan pipelines (diffusers 0.42.1 ``pipeline_wan.py``) condition on the output of
transformers' ``UMT5EncoderModel`` for prompts tokenised by a ``T5Tokenizer`` loaded
from ``tokenizer/``. This script builds tiny versions of both and records what the
pipeline's ``_get_t5_prompt_embeds`` computes for a set of prompts:

  tokenizer/           a tiny SentencePiece Unigram model (trained here on a short
                       built-in corpus, a few custom normalisation rules, so the
                       tokenizer.json carries a real ``Precompiled`` charsmap), loaded as
                       transformers 5.x ``T5Tokenizer`` and saved with
                       ``save_pretrained`` (tokenizer.json + tokenizer_config.json);
  tokenizer_v4/        the same vocabulary written the way transformers 4.x saved T5
                       tokenizers (normalizer Precompiled + Replace(" {2,}"),
                       pre-tokenizer Metaspace only, byte fallback on). transformers
                       5.x rebuilds a T5 tokenizer's pipeline from its class, so both
                       folders must give the same ids; the Rust tokenizer must too;
  text_encoder/        config.json + model.safetensors of a seeded tiny
                       ``UMT5EncoderModel`` (f32), exactly what ``save_pretrained``
                       writes;
  text_encoder_bf16/   the same weights rounded to bf16, written as two shards with a
                       ``model.safetensors.index.json`` (the sharded + bf16 load path);
  buckets.json         transformers' relative-position buckets for offsets −511…511
                       (32 buckets, max distance 128 and 20);
  prompts.json         the prompts, the max_length each was encoded with, the cleaned
                       prompt, the token ids, the attention mask and the number of
                       real tokens n;
  embeds_{i}.npy       [max_length, d_model] the pipeline's embeddings (encoder output
                       with the attention mask, rows >= n zeroed), f32 weights;
  hidden_{i}.npy       [max_length, d_model] the raw ``last_hidden_state`` (padding rows
                       not zeroed), f32 weights;
  embeds_bf16_{i}.npy  the pipeline's embeddings with the bf16-rounded weights,
                       computed in f32.

The prompt cleaning is the pipeline's ``prompt_clean`` without ftfy (the reference
environment does not install it, and headroom does not implement it): html.unescape
twice, strip, collapse whitespace runs into one space, strip.

Needs the reference environment (torch, diffusers 0.42.1, transformers 5.x,
tokenizers, sentencepiece); CI never runs this script, it only reads the committed
fixtures. Run it from anywhere:

    ~/.headroom-reference/bin/python tools/make_text_fixtures.py
"""

import copy
import html
import io
import json
import pathlib
import platform
import re
import shutil
import tempfile

import numpy as np
import sentencepiece as spm
import tokenizers
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoTokenizer, T5Tokenizer, UMT5Config, UMT5EncoderModel

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "crates" / "text" / "tests" / "fixtures"

# Small max_length so truncation is exercised; the long prompt is also recorded at a
# max_length beyond relative_attention_max_distance so the far buckets are exercised.
MAX_LENGTH = 16
LONG_MAX_LENGTH = 40

CORPUS = [
    "a cat runs across the green grass in the morning light",
    "a dog jumps over a wooden fence near the old farm house",
    "the camera moves slowly forward through a narrow street at night",
    "waves crash on the rocky shore under a cloudy sky",
    "a red car drives along the mountain road during sunset",
    "children play football in the park while birds fly above",
    "a small boat sails on the calm blue lake",
    "snow falls on the quiet village in winter",
    "the city skyline glows with neon lights after the rain",
    "a woman walks her dog along the beach at dawn",
    "café au lait and crème brûlée at the corner bistro",
    "the naïve painter showed his résumé to the jury",
    "über die brücke fahren viele autos",
    "el niño camina por la montaña",
    "一只猫在草地上奔跑",
    "城市的夜景非常美丽",
    "a bird sits on a branch and sings a song",
    "the train passes through the tunnel and the forest",
    "a man rides a horse across the desert",
    "flowers bloom in the garden in spring",
]

PROMPTS = [
    ("ascii", "A cat runs across the green grass", MAX_LENGTH),
    ("whitespace", "  a red car\n\tdrives   along\u00a0the road  ", MAX_LENGTH),
    ("accents", "Café au lait, crème brûlée and the naïve résumé", MAX_LENGTH),
    ("cjk", "一只猫在城市的草地上奔跑", MAX_LENGTH),
    ("emoji", "a dog 🐶 jumps 🚀 over the fence ✨", MAX_LENGTH),
    ("charsmap", "ｃａｔ on the ﬁeld ① Ｔime", MAX_LENGTH),
    ("html", "fish &amp; chips &lt;3 &amp;amp; caf&eacute;", MAX_LENGTH),
    ("sentinel", "a cat <extra_id_1> runs", MAX_LENGTH),
    ("empty", "", MAX_LENGTH),
    (
        "long",
        "the camera moves slowly forward through a narrow street at night while snow "
        "falls on the quiet village and a woman walks her dog along the beach",
        MAX_LENGTH,
    ),
    (
        "long40",
        "the camera moves slowly forward through a narrow street at night while snow "
        "falls on the quiet village and a woman walks her dog along the beach",
        LONG_MAX_LENGTH,
    ),
]

EXTRA_IDS = 2

MODEL_CONFIG = dict(
    d_model=32,
    d_kv=6,  # inner_dim 24 != d_model: the q/k/v/o shapes are checked
    d_ff=64,
    num_layers=2,
    num_heads=4,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=20,
    dropout_rate=0.0,
    layer_norm_epsilon=1e-6,
    feed_forward_proj="gated-gelu",
    is_encoder_decoder=True,
    use_cache=False,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
    tie_word_embeddings=False,
)
SEED = 7


def prompt_clean(text):
    """diffusers' prompt_clean without ftfy."""
    text = html.unescape(html.unescape(text)).strip()
    text = re.sub(r"\s+", " ", text)
    return text.strip()


# A few normalisation rules (hex code points, tab, replacement code points) compiled
# by SentencePiece into the tokenizer's Precompiled charsmap. The full nmt_nfkc map
# would weigh 320 kB per tokenizer.json; these keep the fixtures small and still send
# every prompt through the Rust Precompiled normalizer.
NORMALIZATION_RULES = (
    [f"{c:X}\t{c + 32:X}" for c in range(ord("A"), ord("Z") + 1)]  # A-Z -> a-z
    + [f"{c:X}\t{c - 0xFF41 + 0x61:X}" for c in range(0xFF41, 0xFF5B)]  # fullwidth a-z
    + ["FB01\t66 69", "2460\t31", "3000\t20"]  # fi ligature, circled 1, ideographic space
)


def train_spm(workdir):
    rules = workdir / "rules.tsv"
    rules.write_text("\n".join(NORMALIZATION_RULES) + "\n")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_writer=model,
        model_type="unigram",
        vocab_size=300,
        hard_vocab_limit=False,
        character_coverage=0.98,  # leaves a few rare CJK characters to <unk>
        normalization_rule_tsv=str(rules),
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        byte_fallback=False,
        num_threads=1,
    )
    path = workdir / "spiece.model"
    path.write_bytes(model.getvalue())
    return path


def write_v4_tokenizer(v5_dir, out_dir):
    """The tokenizer.json layout transformers 4.x wrote for T5 (see module doc)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tj = json.loads((v5_dir / "tokenizer.json").read_text())
    normalizer = tj["normalizer"]
    if normalizer is None or normalizer.get("type") != "Precompiled":
        raise SystemExit(f"expected a Precompiled normalizer, got {normalizer}")
    tj["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            normalizer,
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
        ],
    }
    tj["pre_tokenizer"] = {
        "type": "Metaspace",
        "replacement": "\u2581",
        "prepend_scheme": "always",
        "split": True,
    }
    tj["model"]["byte_fallback"] = True
    (out_dir / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False, indent=1))
    shutil.copy(v5_dir / "tokenizer_config.json", out_dir / "tokenizer_config.json")


def seeded_model(vocab_size):
    config = UMT5Config(vocab_size=vocab_size, **MODEL_CONFIG)
    torch.manual_seed(SEED)
    model = UMT5EncoderModel(config).eval()
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "relative_attention_bias" in name or "shared" in name or "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
    return model


def pipeline_embeds(model, ids, mask):
    """_get_t5_prompt_embeds for one prompt: masked encode, rows >= n zeroed."""
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    n = int(mask.gt(0).sum())
    embeds = torch.cat([hidden[0, :n], hidden.new_zeros(ids.shape[1] - n, hidden.shape[-1])])
    return hidden[0], embeds


def main():
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for child in OUT_DIR.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        spiece = train_spm(tmp)
        slow_dir = tmp / "spm"
        slow_dir.mkdir()
        shutil.copy(spiece, slow_dir / "spiece.model")
        tok = T5Tokenizer.from_pretrained(slow_dir, extra_ids=EXTRA_IDS)
        tok.model_max_length = 512
        tok.save_pretrained(OUT_DIR / "tokenizer")
    for extra in ["spiece.model", "special_tokens_map.json"]:
        (OUT_DIR / "tokenizer" / extra).unlink(missing_ok=True)
    write_v4_tokenizer(OUT_DIR / "tokenizer", OUT_DIR / "tokenizer_v4")

    tokenizer = AutoTokenizer.from_pretrained(OUT_DIR / "tokenizer")
    tokenizer_v4 = AutoTokenizer.from_pretrained(OUT_DIR / "tokenizer_v4")
    vocab_size = len(tokenizer)

    model = seeded_model(vocab_size)
    model.save_pretrained(OUT_DIR / "text_encoder", safe_serialization=True)
    for extra in ["generation_config.json"]:
        (OUT_DIR / "text_encoder" / extra).unlink(missing_ok=True)

    # bf16 weights, f32 compute: round every parameter to bf16 and back.
    model_bf16 = copy.deepcopy(model)
    with torch.no_grad():
        for p in model_bf16.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    bf16_dir = OUT_DIR / "text_encoder_bf16"
    bf16_dir.mkdir()
    shutil.copy(OUT_DIR / "text_encoder" / "config.json", bf16_dir / "config.json")
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    names = sorted(state)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, bf16_dir / shard, metadata={"format": "pt"})
        weight_map.update({k: shard for k in keys})
    total = sum(v.numel() * 2 for v in state.values())
    (bf16_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )

    # Relative-position buckets as transformers computes them over a 512 x 512 matrix
    # (f32 logs truncated to integers: the edges are where a port can differ).
    attn = model.encoder.block[0].layer[0].SelfAttention
    buckets = {}
    for num_buckets, max_distance in [(32, 128), (32, 20)]:
        attn.relative_attention_num_buckets = num_buckets
        attn.relative_attention_max_distance = max_distance
        pos = torch.arange(512)
        table = attn._relative_position_bucket(pos[None, :] - pos[:, None])
        by_offset = {}
        for q in range(512):
            for rel, b in zip(range(-q, 512 - q), table[q].tolist()):
                if by_offset.setdefault(rel, b) != b:
                    raise SystemExit(f"bucket of {rel} depends on the query position")
        buckets[f"{num_buckets}_{max_distance}"] = [by_offset[r] for r in range(-511, 512)]
    attn.relative_attention_num_buckets = MODEL_CONFIG["relative_attention_num_buckets"]
    attn.relative_attention_max_distance = MODEL_CONFIG["relative_attention_max_distance"]
    (OUT_DIR / "buckets.json").write_text(json.dumps(dict(offset_from=-511, **buckets)))

    records = []
    for i, (name, prompt, max_length) in enumerate(PROMPTS):
        cleaned = prompt_clean(prompt)
        inputs = tokenizer(
            [cleaned],
            padding="max_length",
            max_length=max_length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        inputs_v4 = tokenizer_v4(
            [cleaned],
            padding="max_length",
            max_length=max_length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        if not torch.equal(inputs.input_ids, inputs_v4.input_ids):
            raise SystemExit(f"{name}: the v4-layout tokenizer gives other ids")
        ids, mask = inputs.input_ids, inputs.attention_mask
        hidden, embeds = pipeline_embeds(model, ids, mask)
        _, embeds_bf16 = pipeline_embeds(model_bf16, ids, mask)
        np.save(OUT_DIR / f"embeds_{i}.npy", embeds.numpy().astype("<f4"))
        np.save(OUT_DIR / f"hidden_{i}.npy", hidden.numpy().astype("<f4"))
        np.save(OUT_DIR / f"embeds_bf16_{i}.npy", embeds_bf16.numpy().astype("<f4"))
        n = int(mask.sum())
        records.append(
            dict(
                name=name,
                prompt=prompt,
                cleaned=cleaned,
                max_length=max_length,
                ids=ids[0].tolist(),
                mask=mask[0].tolist(),
                n=n,
                tokens=tokenizer.convert_ids_to_tokens(ids[0, :n].tolist()),
            )
        )
        print(f"{name:10s} n={n:2d} ids={ids[0, :n].tolist()}")

    unk = tokenizer.unk_token_id
    for must_unk in ["emoji"]:
        rec = next(r for r in records if r["name"] == must_unk)
        if unk not in rec["ids"]:
            raise SystemExit(f"{must_unk}: expected <unk> ({unk}) among {rec['ids']}")
    if not any(r["n"] == r["max_length"] and len(r["cleaned"]) > 60 for r in records):
        raise SystemExit("no prompt is truncated")

    (OUT_DIR / "prompts.json").write_text(
        json.dumps(
            dict(
                max_length=MAX_LENGTH,
                vocab_size=vocab_size,
                pad_id=tokenizer.pad_token_id,
                eos_id=tokenizer.eos_token_id,
                unk_id=unk,
                prompts=records,
            ),
            ensure_ascii=False,
            indent=1,
        )
    )
    (OUT_DIR / "versions.txt").write_text(
        f"python {platform.python_version()}\ntorch {torch.__version__}\n"
        f"transformers {transformers.__version__}\ntokenizers {tokenizers.__version__}\n"
        f"sentencepiece {spm.__version__}\n"
    )
    total = sum(p.stat().st_size for p in OUT_DIR.rglob("*") if p.is_file())
    print(f"wrote {OUT_DIR} ({total} bytes)")


if __name__ == "__main__":
    main()
