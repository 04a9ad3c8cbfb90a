//! `AutoencoderKLWan`'s config (diffusers 0.42.1 field names and defaults) and the
//! channel lists derived from it (WAN.md §2.1).

use serde::Deserialize;

use crate::error::{ModelError, Result};

/// The Wan 2.1 VAE config, as in a diffusers `vae/config.json`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct VaeConfig {
    /// Channels of the first stage.
    pub base_dim: usize,
    /// Latent channels.
    pub z_dim: usize,
    /// Channel multiplier per stage.
    pub dim_mult: Vec<usize>,
    /// Residual blocks per encoder stage (the decoder has one more).
    pub num_res_blocks: usize,
    /// Encoder scales (1, 0.5, …) that get an attention block after each residual block.
    pub attn_scales: Vec<f64>,
    /// Per stage but the last: whether the encoder also halves time.
    pub temperal_downsample: Vec<bool>,
    /// Image channels in.
    pub in_channels: usize,
    /// Image channels out.
    pub out_channels: usize,
    /// Per-channel latent mean, used by pipelines to (de)normalise latents.
    pub latents_mean: Vec<f32>,
    /// Per-channel latent standard deviation.
    pub latents_std: Vec<f32>,
    /// Wan 2.2 residual VAE flag (not supported).
    pub is_residual: bool,
    /// Wan 2.2 patchify (not supported).
    pub patch_size: Option<serde_json::Value>,
    /// Wan 2.2 decoder width (not supported).
    pub decoder_base_dim: Option<serde_json::Value>,
    /// Dropout (inactive at inference).
    pub dropout: f64,
}

impl Default for VaeConfig {
    fn default() -> Self {
        Self {
            base_dim: 96,
            z_dim: 16,
            dim_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            attn_scales: Vec::new(),
            temperal_downsample: vec![false, true, true],
            in_channels: 3,
            out_channels: 3,
            latents_mean: vec![
                -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134,
                -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
            ],
            latents_std: vec![
                2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526,
                2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
            ],
            is_residual: false,
            patch_size: None,
            decoder_base_dim: None,
            dropout: 0.0,
        }
    }
}

/// Most encoder/decoder stages a config may declare: the spatial compression is
/// `2^(stages − 1)`, so more would overflow it long before any real VAE needs them.
const MAX_STAGES: usize = 16;

impl VaeConfig {
    /// Parses a `config.json` value and checks it describes a Wan 2.1 VAE.
    pub fn from_json(value: &serde_json::Value) -> Result<Self> {
        let config: VaeConfig = serde_json::from_value(value.clone())
            .map_err(|e| ModelError::config("vae config.json", e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the rules the network relies on.
    pub fn validate(&self) -> Result<()> {
        let rule = |field: &str, rule: String| Err(ModelError::config(field, rule));
        if self.is_residual || self.patch_size.as_ref().is_some_and(|v| !v.is_null()) {
            return rule(
                "is_residual / patch_size",
                "this is a Wan 2.2 VAE; only the Wan 2.1 AutoencoderKLWan is supported".into(),
            );
        }
        if self.decoder_base_dim.as_ref().is_some_and(|v| !v.is_null()) {
            return rule("decoder_base_dim", "must be null (Wan 2.1)".into());
        }
        if self.base_dim == 0 || self.z_dim == 0 || self.num_res_blocks == 0 {
            return rule(
                "base_dim / z_dim / num_res_blocks",
                "must be at least 1".into(),
            );
        }
        if self.dim_mult.is_empty() || self.dim_mult.contains(&0) {
            return rule(
                "dim_mult",
                format!(
                    "must be non-empty positive multipliers, got {:?}",
                    self.dim_mult
                ),
            );
        }
        // The stage count sets the compression 2^(stages − 1); channel widths are
        // base_dim · dim_mult. Untrusted numbers: refuse before anything multiplies them.
        if self.dim_mult.len() > MAX_STAGES {
            return rule(
                "dim_mult",
                format!(
                    "at most {MAX_STAGES} stages are supported (Wan 2.1 has 4), got {}",
                    self.dim_mult.len()
                ),
            );
        }
        if let Some(m) = self
            .dim_mult
            .iter()
            .find(|&&m| m.checked_mul(self.base_dim).is_none())
        {
            return rule(
                "base_dim / dim_mult",
                format!(
                    "channel width base_dim {} × {m} does not fit in memory",
                    self.base_dim
                ),
            );
        }
        if self.temperal_downsample.len() != self.dim_mult.len() - 1 {
            return rule(
                "temperal_downsample",
                format!(
                    "needs one entry per stage but the last ({}), got {}",
                    self.dim_mult.len() - 1,
                    self.temperal_downsample.len()
                ),
            );
        }
        if self.dec_dims().iter().skip(1).any(|d| d % 2 != 0) {
            return rule(
                "base_dim",
                "decoder widths must be even (upsamplers halve them)".into(),
            );
        }
        Ok(())
    }

    /// Checks the latent statistics, which only the pipeline's (de)normalisation uses:
    /// a config whose `latents_mean` / `latents_std` do not match `z_dim` loads (as in
    /// diffusers) and is refused here, naming the field, when normalisation is asked for.
    pub fn validate_latent_stats(&self) -> Result<()> {
        for (field, v) in [
            ("latents_mean", &self.latents_mean),
            ("latents_std", &self.latents_std),
        ] {
            if v.len() != self.z_dim {
                return Err(ModelError::config(
                    field,
                    format!(
                        "latent (de)normalisation needs z_dim = {} values, got {}",
                        self.z_dim,
                        v.len()
                    ),
                ));
            }
        }
        if self.latents_std.contains(&0.0) {
            return Err(ModelError::config("latents_std", "values must be non-zero"));
        }
        Ok(())
    }

    /// `base_dim · [1] ++ dim_mult`.
    pub fn enc_dims(&self) -> Vec<usize> {
        std::iter::once(1)
            .chain(self.dim_mult.iter().copied())
            .map(|m| m * self.base_dim)
            .collect()
    }

    /// `base_dim · [dim_mult.last] ++ reverse(dim_mult)`.
    pub fn dec_dims(&self) -> Vec<usize> {
        let last = *self.dim_mult.last().unwrap_or(&1);
        std::iter::once(last)
            .chain(self.dim_mult.iter().rev().copied())
            .map(|m| m * self.base_dim)
            .collect()
    }

    /// `reverse(temperal_downsample)`.
    pub fn temperal_upsample(&self) -> Vec<bool> {
        self.temperal_downsample.iter().rev().copied().collect()
    }

    /// Spatial compression `2^(stages − 1)`.
    pub fn spatial_factor(&self) -> usize {
        1 << (self.dim_mult.len() - 1)
    }

    /// Temporal compression `2^(temporal stages)`.
    pub fn temporal_factor(&self) -> usize {
        1 << self.temperal_downsample.iter().filter(|&&t| t).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_and_stage_counts_that_overflow_are_refused_naming_the_field() {
        // Found by fuzz/fuzz_targets/config.rs: `[6666666666666666666]` deserialises as a
        // config whose first field, base_dim, overflowed `base_dim · dim_mult`.
        let err = VaeConfig::from_json(&serde_json::json!([6666666666666666666u64]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("base_dim / dim_mult"), "{err}");
        let err = VaeConfig::from_json(&serde_json::json!({
            "dim_mult": vec![1; 70],
            "temperal_downsample": vec![true; 69],
        }))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("dim_mult") && err.contains("at most 16"),
            "{err}"
        );
        let ok = VaeConfig::from_json(&serde_json::json!({})).unwrap();
        assert_eq!(ok.spatial_factor(), 8);
    }
}
