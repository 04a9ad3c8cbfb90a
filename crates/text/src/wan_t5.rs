//! Wan's own T5 checkpoint (`models_t5_umt5-xxl-enc-bf16.pth`, `wan/modules/t5.py`)
//! and the tokenizer beside it (`google/umt5-xxl/`), as shipped in the Wan2.1 repos.
//! Its names map one to one onto transformers' `UMT5EncoderModel`: `token_embedding` →
//! `shared`, `blocks.i.attn.{q,k,v,o}` → `encoder.block.i.layer.0.SelfAttention.…`,
//! `blocks.i.pos_embedding.embedding` → `….relative_attention_bias`, `ffn.gate.0` →
//! `wi_0` (the GELU branch), `ffn.fc1` → `wi_1`, `ffn.fc2` → `wo`, `norm1` / `norm2` /
//! `norm` → the layer norms. The file has no config: the shapes give it.

use std::path::{Path, PathBuf};

use headroom_model::checkpoint::Tensors;
use headroom_model::WeightStore;
use headroom_tensor::{DType, Device};

use crate::config::{Activation, Umt5Config};
use crate::error::{Result, TextError};

/// The T5 checkpoint's file name in a Wan repo folder.
pub const WAN_T5_FILE: &str = "models_t5_umt5-xxl-enc-bf16.pth";
/// The tokenizer folder in a Wan repo folder.
pub const WAN_TOKENIZER_DIR: &str = "google/umt5-xxl";

/// The T5 `.pth` and tokenizer folder of a Wan repo folder, if it has both.
pub fn wan_files(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let (t5, tok) = (dir.join(WAN_T5_FILE), dir.join(WAN_TOKENIZER_DIR));
    (t5.is_file() && tok.is_dir()).then_some((t5, tok))
}

/// The transformers name of Wan T5 tensor `key`, or `None` if the layout lacks it.
pub fn rename(key: &str) -> Option<String> {
    match key {
        "token_embedding.weight" => return Some("shared.weight".into()),
        "norm.weight" => return Some("encoder.final_layer_norm.weight".into()),
        _ => {}
    }
    let (index, rest) = key.strip_prefix("blocks.")?.split_once('.')?;
    let p = format!("encoder.block.{index}.layer");
    Some(match rest {
        "norm1.weight" => format!("{p}.0.layer_norm.weight"),
        "norm2.weight" => format!("{p}.1.layer_norm.weight"),
        "pos_embedding.embedding.weight" => {
            format!("{p}.0.SelfAttention.relative_attention_bias.weight")
        }
        "ffn.gate.0.weight" => format!("{p}.1.DenseReluDense.wi_0.weight"),
        "ffn.fc1.weight" => format!("{p}.1.DenseReluDense.wi_1.weight"),
        "ffn.fc2.weight" => format!("{p}.1.DenseReluDense.wo.weight"),
        other => {
            let proj = other.strip_prefix("attn.")?.strip_suffix(".weight")?;
            if !["q", "k", "v", "o"].contains(&proj) {
                return None;
            }
            format!("{p}.0.SelfAttention.{proj}.weight")
        }
    })
}

/// The weights of a Wan T5 `.pth` under transformers names (unknown tensors keep theirs,
/// so a network that does not use them reports them).
pub fn open(path: &Path, device: &Device, dtype: DType) -> Result<WeightStore> {
    let tensors = Tensors::single(path)?;
    Ok(WeightStore::renamed(
        tensors,
        |k| Some(rename(k).unwrap_or_else(|| k.to_string())),
        "Wan T5",
        device,
        dtype,
    ))
}

/// The encoder config implied by the shapes of `store` (transformers names).
pub fn config_from_shapes(store: &WeightStore, path: &Path) -> Result<Umt5Config> {
    let need = |key: &str, dim: usize| -> Result<usize> {
        store
            .shape_of(key)
            .and_then(|s| s.get(dim).copied())
            .ok_or_else(|| {
                TextError::io(
                    path,
                    format!("no tensor {key:?} in a file read as Wan's T5 layout"),
                )
            })
    };
    let num_layers = store
        .keys()
        .iter()
        .filter_map(|k| {
            k.strip_prefix("encoder.block.")?
                .split_once('.')?
                .0
                .parse::<usize>()
                .ok()
        })
        .max()
        .map_or(0, |m| m + 1);
    let attn = "encoder.block.0.layer.0.SelfAttention";
    let inner = need(&format!("{attn}.q.weight"), 0)?;
    let num_heads = need(&format!("{attn}.relative_attention_bias.weight"), 1)?;
    if num_heads == 0 || !inner.is_multiple_of(num_heads) {
        return Err(TextError::config(
            "num_heads",
            format!("{num_heads} heads do not divide the attention width {inner}"),
        ));
    }
    let config = Umt5Config {
        vocab_size: need("shared.weight", 0)?,
        d_model: need("shared.weight", 1)?,
        d_kv: inner / num_heads,
        d_ff: need("encoder.block.0.layer.1.DenseReluDense.wi_1.weight", 0)?,
        num_layers,
        num_heads,
        relative_attention_num_buckets: need(&format!("{attn}.relative_attention_bias.weight"), 0)?,
        relative_attention_max_distance: 128,
        layer_norm_epsilon: 1e-6,
        is_gated_act: true,
        activation: Activation::GeluTanh,
    };
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wan_t5_names_map_onto_umt5_names() {
        for (from, to) in [
            ("token_embedding.weight", "shared.weight"),
            ("norm.weight", "encoder.final_layer_norm.weight"),
            (
                "blocks.3.attn.q.weight",
                "encoder.block.3.layer.0.SelfAttention.q.weight",
            ),
            (
                "blocks.3.attn.o.weight",
                "encoder.block.3.layer.0.SelfAttention.o.weight",
            ),
            (
                "blocks.0.pos_embedding.embedding.weight",
                "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            ),
            (
                "blocks.1.norm1.weight",
                "encoder.block.1.layer.0.layer_norm.weight",
            ),
            (
                "blocks.1.norm2.weight",
                "encoder.block.1.layer.1.layer_norm.weight",
            ),
            (
                "blocks.1.ffn.gate.0.weight",
                "encoder.block.1.layer.1.DenseReluDense.wi_0.weight",
            ),
            (
                "blocks.1.ffn.fc1.weight",
                "encoder.block.1.layer.1.DenseReluDense.wi_1.weight",
            ),
            (
                "blocks.1.ffn.fc2.weight",
                "encoder.block.1.layer.1.DenseReluDense.wo.weight",
            ),
        ] {
            assert_eq!(rename(from).as_deref(), Some(to), "{from}");
        }
        assert_eq!(rename("blocks.1.attn.x.weight"), None);
    }
}
