//! The UMT5 encoder config, read from a transformers `text_encoder/config.json`
//! (`UMT5Config`, transformers 5.x `configuration_umt5.py`), plus the shapes the built-in
//! seeded encoders use.

use std::path::Path;

use serde_json::Value;

use crate::error::{Result, TextError};

/// The activation of the feed-forward layer (`dense_act_fn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// GELU with the tanh approximation (`gelu_new`, `gelu_pytorch_tanh`): UMT5's.
    GeluTanh,
    /// Exact GELU (`gelu`).
    GeluErf,
    /// `relu`.
    Relu,
}

impl Activation {
    /// The activation transformers names `name` (an `ACT2FN` key).
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Activation::GeluTanh),
            "gelu" => Ok(Activation::GeluErf),
            "relu" => Ok(Activation::Relu),
            other => Err(TextError::config(
                "dense_act_fn",
                format!("must be gelu_new, gelu_pytorch_tanh, gelu or relu, got {other:?}"),
            )),
        }
    }
}

/// Shapes and constants of a UMT5 encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct Umt5Config {
    /// Rows of the token embedding.
    pub vocab_size: usize,
    /// Width of the residual stream (the embedding width handed to the DiT).
    pub d_model: usize,
    /// Width of one attention head.
    pub d_kv: usize,
    /// Hidden width of the feed-forward layer.
    pub d_ff: usize,
    /// Encoder blocks.
    pub num_layers: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Relative-position buckets (both directions together).
    pub relative_attention_num_buckets: usize,
    /// Distance from which relative positions share the last bucket.
    pub relative_attention_max_distance: usize,
    /// Epsilon of every RMS layer norm.
    pub layer_norm_epsilon: f32,
    /// Gated feed-forward (`wi_0`, `wi_1`) or plain (`wi`).
    pub is_gated_act: bool,
    /// Feed-forward activation.
    pub activation: Activation,
}

impl Umt5Config {
    /// The shape of UMT5-XXL's encoder (google/umt5-xxl, the Wan text encoder).
    pub fn umt5_xxl() -> Self {
        Self {
            vocab_size: 256_384,
            d_model: 4096,
            d_kv: 64,
            d_ff: 10_240,
            num_layers: 24,
            num_heads: 64,
            relative_attention_num_buckets: 32,
            relative_attention_max_distance: 128,
            layer_norm_epsilon: 1e-6,
            is_gated_act: true,
            activation: Activation::GeluTanh,
        }
    }

    /// A tiny encoder of width `d_model` over `vocab_size` tokens (the built-in seeded
    /// text encoders of the `tiny` and `small` presets).
    pub fn tiny(vocab_size: usize, d_model: usize) -> Self {
        Self {
            vocab_size,
            d_model,
            d_kv: 8,
            d_ff: 2 * d_model,
            num_layers: 2,
            num_heads: (d_model / 8).max(1),
            relative_attention_num_buckets: 32,
            relative_attention_max_distance: 128,
            layer_norm_epsilon: 1e-6,
            is_gated_act: true,
            activation: Activation::GeluTanh,
        }
    }

    /// Width of the concatenated attention heads (`num_heads · d_kv`).
    pub fn inner_dim(&self) -> usize {
        self.num_heads * self.d_kv
    }

    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| TextError::io(&path, e))?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| TextError::io(&path, format!("not valid JSON: {e}")))?;
        Self::from_json(&json)
    }

    /// Parses a `UMT5Config` JSON object; absent keys take transformers' defaults.
    pub fn from_json(json: &Value) -> Result<Self> {
        let usize_or = |key: &str, default: usize| -> Result<usize> {
            match json.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_u64().map(|v| v as usize).ok_or_else(|| {
                    TextError::config(key, format!("must be a whole number, got {v}"))
                }),
            }
        };
        // transformers parses `feed_forward_proj` as "[gated-]ACT"; `dense_act_fn` is the
        // ACT part and `is_gated_act` the prefix.
        let proj = json
            .get("feed_forward_proj")
            .and_then(Value::as_str)
            .unwrap_or("gated-gelu");
        let (gated, act) = match proj.split_once('-') {
            Some(("gated", act)) => (true, act),
            None => (false, proj),
            Some(_) => {
                return Err(TextError::config(
                    "feed_forward_proj",
                    format!("must be ACT or gated-ACT, got {proj:?}"),
                ))
            }
        };
        // `gated-gelu` means the tanh GELU (`gelu_new`) for backwards compatibility.
        let act = if proj == "gated-gelu" {
            "gelu_new"
        } else {
            act
        };
        let activation = Activation::from_name(act)?;
        let eps = match json.get("layer_norm_epsilon") {
            None | Some(Value::Null) => 1e-6,
            Some(v) => v.as_f64().ok_or_else(|| {
                TextError::config("layer_norm_epsilon", format!("must be a number, got {v}"))
            })? as f32,
        };
        let config = Self {
            vocab_size: usize_or("vocab_size", 250_112)?,
            d_model: usize_or("d_model", 512)?,
            d_kv: usize_or("d_kv", 64)?,
            d_ff: usize_or("d_ff", 1024)?,
            num_layers: usize_or("num_layers", 8)?,
            num_heads: usize_or("num_heads", 6)?,
            relative_attention_num_buckets: usize_or("relative_attention_num_buckets", 32)?,
            relative_attention_max_distance: usize_or("relative_attention_max_distance", 128)?,
            layer_norm_epsilon: eps,
            is_gated_act: gated,
            activation,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the rules the encoder relies on, naming the field that breaks one.
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("d_kv", self.d_kv),
            ("d_ff", self.d_ff),
            ("num_heads", self.num_heads),
        ] {
            if value == 0 {
                return Err(TextError::config(field, "must be at least 1"));
            }
        }
        if self.num_heads.checked_mul(self.d_kv).is_none() {
            return Err(TextError::config(
                "num_heads / d_kv",
                format!(
                    "their product (the attention width) does not fit in memory: {} × {}",
                    self.num_heads, self.d_kv
                ),
            ));
        }
        // Bidirectional buckets: half per direction, half of those exact.
        if self.relative_attention_num_buckets < 4 {
            return Err(TextError::config(
                "relative_attention_num_buckets",
                format!(
                    "must be at least 4, got {}",
                    self.relative_attention_num_buckets
                ),
            ));
        }
        let max_exact = self.relative_attention_num_buckets / 4;
        if self.relative_attention_max_distance <= max_exact {
            return Err(TextError::config(
                "relative_attention_max_distance",
                format!(
                    "must exceed num_buckets / 4 = {max_exact}, got {}",
                    self.relative_attention_max_distance
                ),
            ));
        }
        if self.layer_norm_epsilon.is_nan() || self.layer_norm_epsilon <= 0.0 {
            return Err(TextError::config("layer_norm_epsilon", "must be positive"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gated_gelu_means_the_tanh_gelu() {
        let c =
            Umt5Config::from_json(&serde_json::json!({"feed_forward_proj": "gated-gelu"})).unwrap();
        assert!(c.is_gated_act);
        assert_eq!(c.activation, Activation::GeluTanh);
        let c = Umt5Config::from_json(&serde_json::json!({"feed_forward_proj": "relu"})).unwrap();
        assert!(!c.is_gated_act);
        assert_eq!(c.activation, Activation::Relu);
    }

    #[test]
    fn bad_fields_are_named() {
        let err = Umt5Config::from_json(&serde_json::json!({"d_model": "big"}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("d_model"), "{err}");
        let err = Umt5Config::from_json(&serde_json::json!({"feed_forward_proj": "gated-swish"}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("dense_act_fn"), "{err}");
    }

    #[test]
    fn an_attention_width_that_overflows_is_refused_naming_the_fields() {
        let err = Umt5Config::from_json(&serde_json::json!({
            "num_heads": 1u64 << 40,
            "d_kv": 1u64 << 40,
        }))
        .unwrap_err()
        .to_string();
        assert!(err.contains("num_heads / d_kv"), "{err}");
    }
}
