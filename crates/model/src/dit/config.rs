//! `WanTransformer3DModel`'s config (diffusers 0.42.1 names and defaults; WAN.md §3.1).

use serde::Deserialize;

use crate::error::{ModelError, Result};

/// The Wan transformer config, as in a diffusers `transformer/config.json`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct DitConfig {
    /// Patch size (t, h, w).
    pub patch_size: [usize; 3],
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Dimension per head.
    pub attention_head_dim: usize,
    /// Latent channels in (16; 36 for the image-conditioned variant).
    pub in_channels: usize,
    /// Latent channels out (`None` = `in_channels`).
    pub out_channels: Option<usize>,
    /// Text embedding width (4096 for umT5-XXL).
    pub text_dim: usize,
    /// Width of the sinusoidal timestep embedding.
    pub freq_dim: usize,
    /// Feed-forward width.
    pub ffn_dim: usize,
    /// Transformer blocks.
    pub num_layers: usize,
    /// Whether cross-attention has its affine LayerNorm (`norm2`).
    pub cross_attn_norm: bool,
    /// q/k normalisation (always RMS across heads in 2.1).
    pub qk_norm: Option<String>,
    /// Epsilon of every norm.
    pub eps: f64,
    /// Positions per RoPE axis.
    pub rope_max_seq_len: usize,
    /// I2V image embedder width (not supported: must be null).
    pub image_dim: Option<serde_json::Value>,
    /// Added KV projection (not supported: must be null).
    pub added_kv_proj_dim: Option<serde_json::Value>,
    /// Positional embedding length (not supported: must be null).
    pub pos_embed_seq_len: Option<serde_json::Value>,
    /// headroom's own key (diffusers ignores it): the session's first latent frame is the
    /// given image's latents, not the network's x0 for it (image-conditioned models only;
    /// the loop of a model trained with that frame as the truth, Wan 2.2 TI2V's way).
    pub keep_first_frame: bool,
    /// headroom's own key: each DMD step's velocity is pushed away from a still camera's,
    /// `v_still + g·(v_keys − v_still)` (two forwards a step; 1 = off, camera models only).
    pub camera_guidance: f64,
    /// headroom's own key: the flow shift of the DMD steps the model was trained at, the
    /// sessions' default (5, Self-Forcing's, when absent; a small latent grid wants less).
    pub flow_shift: f64,
}

impl Default for DitConfig {
    fn default() -> Self {
        Self {
            patch_size: [1, 2, 2],
            num_attention_heads: 40,
            attention_head_dim: 128,
            in_channels: 16,
            out_channels: Some(16),
            text_dim: 4096,
            freq_dim: 256,
            ffn_dim: 13824,
            num_layers: 40,
            cross_attn_norm: true,
            qk_norm: Some("rms_norm_across_heads".to_string()),
            eps: 1e-6,
            rope_max_seq_len: 1024,
            image_dim: None,
            added_kv_proj_dim: None,
            pos_embed_seq_len: None,
            keep_first_frame: false,
            camera_guidance: 1.0,
            flow_shift: 5.0,
        }
    }
}

impl DitConfig {
    /// Parses a `config.json` value and checks it describes a supported Wan transformer.
    pub fn from_json(value: &serde_json::Value) -> Result<Self> {
        let config: DitConfig = serde_json::from_value(value.clone())
            .map_err(|e| ModelError::config("transformer config.json", e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the rules the network relies on.
    pub fn validate(&self) -> Result<()> {
        let unsupported = |v: &Option<serde_json::Value>| v.as_ref().is_some_and(|v| !v.is_null());
        if unsupported(&self.image_dim)
            || unsupported(&self.added_kv_proj_dim)
            || unsupported(&self.pos_embed_seq_len)
        {
            return Err(ModelError::config(
                "image_dim / added_kv_proj_dim / pos_embed_seq_len",
                "must be null: the Wan 2.1 I2V image branch is not supported (36-channel image conditioning works through in_channels)",
            ));
        }
        if self.num_attention_heads == 0 || self.attention_head_dim == 0 || self.num_layers == 0 {
            return Err(ModelError::config(
                "num_attention_heads / attention_head_dim / num_layers",
                "must be at least 1",
            ));
        }
        if self
            .num_attention_heads
            .checked_mul(self.attention_head_dim)
            .is_none()
        {
            return Err(ModelError::config(
                "num_attention_heads / attention_head_dim",
                format!(
                    "their product (the model width) does not fit in memory: {} × {}",
                    self.num_attention_heads, self.attention_head_dim
                ),
            ));
        }
        if !self.attention_head_dim.is_multiple_of(2) || self.attention_head_dim < 6 {
            return Err(ModelError::config(
                "attention_head_dim",
                format!(
                    "must be even and ≥ 6 for the 3-axis RoPE, got {}",
                    self.attention_head_dim
                ),
            ));
        }
        if !self.freq_dim.is_multiple_of(2) || self.freq_dim == 0 {
            return Err(ModelError::config(
                "freq_dim",
                format!("must be even and positive, got {}", self.freq_dim),
            ));
        }
        if self.patch_size.contains(&0) {
            return Err(ModelError::config(
                "patch_size",
                format!("must be positive, got {:?}", self.patch_size),
            ));
        }
        if self.keep_first_frame && !self.takes_image_condition() {
            return Err(ModelError::config(
                "keep_first_frame",
                format!(
                    "needs an image-conditioned model (in_channels = 2·out_channels + {IMAGE_MASK_CHANNELS}), got in {} / out {}",
                    self.in_channels,
                    self.out_channels()
                ),
            ));
        }
        if let Some(rule) = crate::dmd::guidance_scale_error(self.camera_guidance) {
            return Err(ModelError::config("camera_guidance", rule));
        }
        if let Some(rule) = crate::dmd::flow_shift_error(self.flow_shift) {
            return Err(ModelError::config("flow_shift", rule));
        }
        Ok(())
    }

    /// `heads · head_dim`.
    pub fn dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Output channels.
    pub fn out_channels(&self) -> usize {
        self.out_channels.unwrap_or(self.in_channels)
    }

    /// Whether the input is Wan 2.1 I2V's `[noise | mask (4) | first-frame latents]`:
    /// `in_channels = 2 · out_channels + 4` (36 for the 16-channel Wan VAE).
    pub fn takes_image_condition(&self) -> bool {
        // Checked: the channel counts come from an untrusted config.json.
        self.out_channels()
            .checked_mul(2)
            .and_then(|c| c.checked_add(IMAGE_MASK_CHANNELS))
            == Some(self.in_channels)
    }
}

/// Mask channels of Wan 2.1 I2V's image condition, in front of its latents.
pub const IMAGE_MASK_CHANNELS: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_condition_is_two_latents_and_the_mask_for_any_latent_width() {
        let with = |i, o| DitConfig {
            in_channels: i,
            out_channels: Some(o),
            ..DitConfig::default()
        };
        assert!(with(36, 16).takes_image_condition());
        assert!(with(100, 48).takes_image_condition());
        assert!(!with(16, 16).takes_image_condition());
        assert!(!with(52, 48).takes_image_condition());
    }

    #[test]
    fn keeping_the_first_frame_needs_an_image_condition() {
        let keep = |i, o| DitConfig {
            in_channels: i,
            out_channels: Some(o),
            keep_first_frame: true,
            ..DitConfig::default()
        };
        assert!(keep(36, 16).validate().is_ok());
        let err = keep(16, 16).validate().unwrap_err().to_string();
        assert!(err.contains("keep_first_frame"), "{err}");
        assert!(err.contains("in 16 / out 16"), "{err}");
    }

    #[test]
    fn flow_shift_defaults_to_five_and_is_a_finite_number_above_zero() {
        let parsed = DitConfig::from_json(&serde_json::json!({ "flow_shift": 1.5 })).unwrap();
        assert_eq!(parsed.flow_shift, 1.5);
        let absent = DitConfig::from_json(&serde_json::json!({})).unwrap();
        assert_eq!(absent.flow_shift, 5.0);
        for bad in [0.0, -1.0, f64::NAN] {
            let config = DitConfig {
                flow_shift: bad,
                ..DitConfig::default()
            };
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains("flow_shift") && err.contains("> 0"), "{err}");
        }
    }

    #[test]
    fn camera_guidance_is_a_finite_number_of_at_least_zero() {
        let json = |g: serde_json::Value| serde_json::json!({ "camera_guidance": g });
        let parsed = DitConfig::from_json(&json(serde_json::json!(2.0))).unwrap();
        assert_eq!(parsed.camera_guidance, 2.0);
        assert_eq!(
            DitConfig::from_json(&serde_json::json!({}))
                .unwrap()
                .camera_guidance,
            1.0
        );
        for bad in [-0.5, f64::INFINITY] {
            let config = DitConfig {
                camera_guidance: bad,
                ..DitConfig::default()
            };
            let err = config.validate().unwrap_err().to_string();
            assert!(
                err.contains("camera_guidance") && err.contains("≥ 0"),
                "{err}"
            );
        }
    }

    #[test]
    fn channel_counts_that_overflow_are_refused_not_a_panic() {
        // Found by fuzz/fuzz_targets/config.rs: a width or channel count near usize::MAX.
        let json = serde_json::json!({
            "num_attention_heads": 1u64 << 40,
            "attention_head_dim": 1u64 << 40,
        });
        let err = DitConfig::from_json(&json).unwrap_err().to_string();
        assert!(
            err.contains("num_attention_heads / attention_head_dim"),
            "{err}"
        );
        let json = serde_json::json!({
            "in_channels": 36,
            "out_channels": u64::MAX,
            "keep_first_frame": true,
        });
        let err = DitConfig::from_json(&json).unwrap_err().to_string();
        assert!(err.contains("keep_first_frame"), "{err}");
    }
}
