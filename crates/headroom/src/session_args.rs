//! The options every command that runs sessions shares (`generate`, `bench session`).

use anyhow::{Context, Result};
use clap::Args;
use headroom_mem::parse_size;

/// Which model, how much video, and on how large a device.
#[derive(Debug, Args)]
pub struct SessionShape {
    /// Built-in model (tiny, small, wan2.1-t2v-1.3b, lingbot-world-v2-14b), a diffusers
    /// pipeline folder with transformer/ and vae/, or an original Wan repo folder
    /// (config.json, DiT safetensors, Wan2.1_VAE.pth, T5 .pth + google/umt5-xxl/).
    #[arg(long, default_value = "small")]
    pub model: String,
    /// Frames: 12·K − 3 for K chunks.
    #[arg(long, default_value_t = 33)]
    pub frames: usize,
    /// Width in pixels (multiple of 16).
    #[arg(long, default_value_t = 416)]
    pub width: usize,
    /// Height in pixels (multiple of 16).
    #[arg(long, default_value_t = 240)]
    pub height: usize,
    /// Noise seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Device capacity (B, KiB, MiB, GiB) to emulate a memory-tight device; physical
    /// memory by default. `bounded` reclaim fractions refer to it.
    #[arg(long)]
    pub capacity: Option<String>,
    /// Device: cpu, cuda or cuda:N (cuda needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    pub device: crate::device_arg::DeviceArg,
    /// What the model's weights are held and computed in.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: crate::dtype_arg::DtypeArg,
}

impl SessionShape {
    /// `--capacity` in bytes, if given.
    pub fn capacity_bytes(&self) -> Result<Option<u64>> {
        self.capacity
            .as_deref()
            .map(parse_size)
            .transpose()
            .context("--capacity")
    }
}
