//! Built-in model configs: `tiny` (tests), `small` (the embedded default, seeded weights,
//! sized for a 2-core CPU), and the shapes of the real models (run as meta execution on
//! a `sim` platform).

use headroom_model::{DitConfig, VaeConfig};

use crate::error::{EngineError, Result};

/// A transformer + VAE pair.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPreset {
    /// Name.
    pub name: &'static str,
    /// Transformer config.
    pub dit: DitConfig,
    /// VAE config.
    pub vae: VaeConfig,
}

/// Names of the built-in presets.
pub const PRESETS: [&str; 4] = ["tiny", "small", "wan2.1-t2v-1.3b", "lingbot-world-v2-14b"];

impl ModelPreset {
    /// The preset called `name`.
    pub fn named(name: &str) -> Result<Self> {
        let dit = DitConfig::default();
        let vae = VaeConfig::default();
        Ok(match name {
            "tiny" => Self {
                name: "tiny",
                dit: DitConfig {
                    // Four heads: enough to shard over TP2 × SP2.
                    num_attention_heads: 4,
                    attention_head_dim: 12,
                    in_channels: 36,
                    out_channels: Some(16),
                    text_dim: 16,
                    freq_dim: 32,
                    ffn_dim: 48,
                    num_layers: 2,
                    ..dit
                },
                vae: VaeConfig {
                    base_dim: 8,
                    dim_mult: vec![1, 1, 1, 1],
                    num_res_blocks: 1,
                    ..vae
                },
            },
            "small" => Self {
                name: "small",
                dit: DitConfig {
                    num_attention_heads: 4,
                    attention_head_dim: 64,
                    in_channels: 36,
                    out_channels: Some(16),
                    text_dim: 64,
                    freq_dim: 64,
                    ffn_dim: 1024,
                    num_layers: 4,
                    ..dit
                },
                vae: VaeConfig {
                    base_dim: 16,
                    num_res_blocks: 1,
                    ..vae
                },
            },
            "wan2.1-t2v-1.3b" => Self {
                name: "wan2.1-t2v-1.3b",
                dit: DitConfig {
                    num_attention_heads: 12,
                    ffn_dim: 8960,
                    num_layers: 30,
                    ..dit
                },
                vae,
            },
            "lingbot-world-v2-14b" => Self {
                name: "lingbot-world-v2-14b",
                dit: DitConfig {
                    in_channels: 36,
                    out_channels: Some(16),
                    ..dit
                },
                vae,
            },
            other => {
                return Err(EngineError::request(
                    "model",
                    format!(
                        "unknown model {other:?}; built-in models are {}",
                        PRESETS.join(", ")
                    ),
                ))
            }
        })
    }
}
