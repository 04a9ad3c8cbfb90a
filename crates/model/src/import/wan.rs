//! The original Wan layout (Wan-AI's `WanModel` repos, and what Self-Forcing, ComfyUI
//! and LingBot-World wrap): key names and `config.json` keys of `wan/modules/model.py`,
//! turned into diffusers' `WanTransformer3DModel` names. Written from the mapping that
//! diffusers' `convert_wan_transformer_to_diffusers` performs; no tensor is split or
//! reshaped. The trap is the norms: the original block's `norm3` is the cross-attention
//! LayerNorm (diffusers' `norm2`), and its `norm2` (no weights) is diffusers' `norm3`.

use serde_json::Value;

use crate::dit::DitConfig;
use crate::error::{ModelError, Result};

/// Whether `names` (wrappers already stripped) use the original Wan key names.
pub fn has_original_names<'a>(mut names: impl Iterator<Item = &'a String>) -> bool {
    names.any(|k| {
        k.starts_with("time_embedding.")
            || k.starts_with("head.head.")
            || k.contains(".self_attn.")
            || k.contains(".cross_attn.")
    })
}

/// Our (diffusers) name of the original Wan DiT tensor `key`.
pub fn rename(key: &str) -> String {
    const TOP: [(&str, &str); 11] = [
        (
            "time_embedding.0.",
            "condition_embedder.time_embedder.linear_1.",
        ),
        (
            "time_embedding.2.",
            "condition_embedder.time_embedder.linear_2.",
        ),
        (
            "text_embedding.0.",
            "condition_embedder.text_embedder.linear_1.",
        ),
        (
            "text_embedding.2.",
            "condition_embedder.text_embedder.linear_2.",
        ),
        ("time_projection.1.", "condition_embedder.time_proj."),
        ("head.head.", "proj_out."),
        ("head.modulation", "scale_shift_table"),
        (
            "img_emb.proj.0.",
            "condition_embedder.image_embedder.norm1.",
        ),
        (
            "img_emb.proj.1.",
            "condition_embedder.image_embedder.ff.net.0.proj.",
        ),
        (
            "img_emb.proj.3.",
            "condition_embedder.image_embedder.ff.net.2.",
        ),
        (
            "img_emb.proj.4.",
            "condition_embedder.image_embedder.norm2.",
        ),
    ];
    for (from, to) in TOP {
        if let Some(rest) = key.strip_prefix(from) {
            return format!("{to}{rest}");
        }
    }
    let Some(rest) = key.strip_prefix("blocks.") else {
        return key.to_string();
    };
    let Some((index, inner)) = rest.split_once('.') else {
        return key.to_string();
    };
    format!("blocks.{index}.{}", rename_in_block(inner))
}

/// The part of a block key after `blocks.N.`.
fn rename_in_block(inner: &str) -> String {
    for (from, to) in [("self_attn.", "attn1."), ("cross_attn.", "attn2.")] {
        if let Some(rest) = inner.strip_prefix(from) {
            let rest = match rest.split_once('.') {
                Some((proj, tail)) => {
                    let proj = match proj {
                        "q" => "to_q",
                        "k" => "to_k",
                        "v" => "to_v",
                        "o" => "to_out.0",
                        "k_img" => "add_k_proj",
                        "v_img" => "add_v_proj",
                        "norm_k_img" => "norm_added_k",
                        other => other,
                    };
                    format!("{proj}.{tail}")
                }
                None => rest.to_string(),
            };
            return format!("{to}{rest}");
        }
    }
    const INNER: [(&str, &str); 5] = [
        ("modulation", "scale_shift_table"),
        ("ffn.0.", "ffn.net.0.proj."),
        ("ffn.2.", "ffn.net.2."),
        // The swap: cross-attention's affine norm is norm3 in Wan, norm2 in diffusers.
        ("norm3.", "norm2."),
        ("norm2.", "norm3."),
    ];
    for (from, to) in INNER {
        if let Some(rest) = inner.strip_prefix(from) {
            return format!("{to}{rest}");
        }
    }
    inner.to_string()
}

/// Whether a `config.json` value uses the original `WanModel` keys.
pub fn is_original_config(value: &Value) -> bool {
    value.get("dim").is_some() && value.get("num_heads").is_some()
}

fn field<'a>(value: &'a Value, name: &str) -> Result<&'a Value> {
    value
        .get(name)
        .ok_or_else(|| ModelError::config(name, "missing from the original Wan config.json"))
}

fn count(value: &Value, name: &str) -> Result<usize> {
    field(value, name)?
        .as_u64()
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| ModelError::config(name, "must be a non-negative integer"))
}

/// A [`DitConfig`] from an original Wan `config.json` (`dim`, `num_heads`, `ffn_dim`,
/// `freq_dim`, `in_dim`, `out_dim`, `num_layers`, `text_dim`, `qk_norm`,
/// `cross_attn_norm`, `eps`, `patch_size`; `window_size`, `text_len` and `model_type`
/// are not needed by the network).
pub fn config_from_original(value: &Value) -> Result<DitConfig> {
    let dim = count(value, "dim")?;
    let heads = count(value, "num_heads")?;
    if heads == 0 || !dim.is_multiple_of(heads) {
        return Err(ModelError::config(
            "num_heads",
            format!("must divide dim = {dim}, got {heads}"),
        ));
    }
    let defaults = DitConfig::default();
    let flag =
        |name: &str, default: bool| value.get(name).and_then(Value::as_bool).unwrap_or(default);
    let patch_size = match value.get("patch_size") {
        Some(v) => serde_json::from_value::<[usize; 3]>(v.clone())
            .map_err(|_| ModelError::config("patch_size", "must be three integers"))?,
        None => defaults.patch_size,
    };
    let in_channels = count(value, "in_dim")?;
    let config = DitConfig {
        patch_size,
        num_attention_heads: heads,
        attention_head_dim: dim / heads,
        in_channels,
        out_channels: Some(
            value
                .get("out_dim")
                .map_or(Ok(in_channels), |_| count(value, "out_dim"))?,
        ),
        text_dim: value
            .get("text_dim")
            .map_or(Ok(defaults.text_dim), |_| count(value, "text_dim"))?,
        freq_dim: value
            .get("freq_dim")
            .map_or(Ok(defaults.freq_dim), |_| count(value, "freq_dim"))?,
        ffn_dim: count(value, "ffn_dim")?,
        num_layers: count(value, "num_layers")?,
        cross_attn_norm: flag("cross_attn_norm", true),
        qk_norm: flag("qk_norm", true).then(|| "rms_norm_across_heads".to_string()),
        eps: value
            .get("eps")
            .and_then(Value::as_f64)
            .unwrap_or(defaults.eps),
        ..defaults
    };
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn original_names_map_to_diffusers_names_with_the_norm_swap() {
        for (from, to) in [
            ("patch_embedding.weight", "patch_embedding.weight"),
            (
                "time_embedding.0.weight",
                "condition_embedder.time_embedder.linear_1.weight",
            ),
            (
                "time_projection.1.bias",
                "condition_embedder.time_proj.bias",
            ),
            (
                "text_embedding.2.weight",
                "condition_embedder.text_embedder.linear_2.weight",
            ),
            ("head.head.weight", "proj_out.weight"),
            ("head.modulation", "scale_shift_table"),
            ("blocks.3.modulation", "blocks.3.scale_shift_table"),
            ("blocks.0.self_attn.q.weight", "blocks.0.attn1.to_q.weight"),
            ("blocks.0.self_attn.o.bias", "blocks.0.attn1.to_out.0.bias"),
            (
                "blocks.0.self_attn.norm_q.weight",
                "blocks.0.attn1.norm_q.weight",
            ),
            (
                "blocks.12.cross_attn.k.weight",
                "blocks.12.attn2.to_k.weight",
            ),
            ("blocks.1.norm3.weight", "blocks.1.norm2.weight"),
            ("blocks.1.norm2.bias", "blocks.1.norm3.bias"),
            ("blocks.1.ffn.0.weight", "blocks.1.ffn.net.0.proj.weight"),
            ("blocks.1.ffn.2.bias", "blocks.1.ffn.net.2.bias"),
            // LingBot's camera adapter keeps its names.
            (
                "blocks.4.cam_injector_layer1.weight",
                "blocks.4.cam_injector_layer1.weight",
            ),
            (
                "patch_embedding_wancamctrl.weight",
                "patch_embedding_wancamctrl.weight",
            ),
            (
                "c2ws_hidden_states_layer2.bias",
                "c2ws_hidden_states_layer2.bias",
            ),
        ] {
            assert_eq!(rename(from), to, "{from}");
        }
    }

    #[test]
    fn an_original_config_becomes_the_diffusers_config() {
        let value = serde_json::json!({
            "_class_name": "WanModel", "dim": 1536, "eps": 1e-6, "ffn_dim": 8960,
            "freq_dim": 256, "in_dim": 16, "model_type": "t2v", "num_heads": 12,
            "num_layers": 30, "out_dim": 16, "text_len": 512
        });
        assert!(is_original_config(&value));
        let c = config_from_original(&value).unwrap();
        assert_eq!(
            (c.num_attention_heads, c.attention_head_dim, c.num_layers),
            (12, 128, 30)
        );
        assert_eq!((c.ffn_dim, c.in_channels, c.out_channels()), (8960, 16, 16));
        assert!(c.cross_attn_norm && c.qk_norm.is_some());
    }
}
