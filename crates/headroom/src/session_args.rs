//! The options every command that runs sessions shares (`generate`, `bench session`).

use anyhow::{Context, Result};
use clap::Args;
use headroom_mem::{format_bytes, parse_size, HostMemory};

/// Which model, how much video, and on how large a device.
#[derive(Debug, Args)]
pub struct SessionShape {
    /// Built-in model (world, tiny, small, wan2.1-t2v-1.3b, lingbot-world-v2-14b), a
    /// diffusers pipeline folder with transformer/ and vae/, or an original Wan repo
    /// folder (config.json, DiT safetensors, Wan2.1_VAE.pth, T5 .pth + google/umt5-xxl/).
    /// Default: world for generate, small for bench.
    #[arg(long)]
    pub model: Option<String>,
    /// Frames: 12·K − 3 for K chunks (`until-stop`, a session without an end, is for
    /// `headroom serve`: a file needs an end).
    #[arg(long, default_value_t = 33, value_parser = parse_frames)]
    pub frames: usize,
    /// Width in pixels (multiple of 16); default: the model's own size (its
    /// first_frame.png), else 416.
    #[arg(long)]
    pub width: Option<usize>,
    /// Height in pixels (multiple of 16); default: the model's own size, else 240.
    #[arg(long)]
    pub height: Option<usize>,
    /// Noise seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Device capacity (B, KiB, MiB, GiB) to emulate a memory-tight device; physical
    /// memory by default. `bounded` reclaim fractions refer to it.
    #[arg(long)]
    pub capacity: Option<String>,
    /// Device: cpu, cuda or cuda:N (a build with --features cuda), or cuda-check (the
    /// GPU path's launches checked on the host, nothing computed).
    #[arg(long, default_value = "cpu")]
    pub device: crate::device_arg::DeviceArg,
    /// What the model's weights are held and computed in.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: crate::dtype_arg::DtypeArg,
}

/// Which decoder sessions decode with: `--decoder` and `--tiny-decoder`.
#[derive(Debug, Clone, Args)]
pub struct DecoderArgs {
    /// full (the model's own VAE) or tiny (a TAEHV tiny decoder: `--tiny-decoder`, else
    /// the model folder's tiny_decoder.safetensors, else for a built-in model seeded
    /// weights of taew2_1's or taew2_2's shapes).
    #[arg(long, default_value = "full")]
    pub decoder: headroom_model::DecoderKind,
    /// A TAEHV tiny decoder file (taew2_1 / taew2_2, .pth or .safetensors), loaded beside
    /// the model so sessions may choose it.
    #[arg(long)]
    pub tiny_decoder: Option<std::path::PathBuf>,
}

impl DecoderArgs {
    /// `config` with these choices.
    pub fn apply(&self, config: headroom_engine::EngineConfig) -> headroom_engine::EngineConfig {
        headroom_engine::EngineConfig {
            decoder: self.decoder,
            tiny_decoder: self.tiny_decoder.clone(),
            ..config
        }
    }
}

/// Video size when neither the command line nor the model gives one.
pub const DEFAULT_SIZE: (usize, usize) = (416, 240);

impl SessionShape {
    /// The model the engine loads (`world` resolved to its folder), `default` when
    /// `--model` is absent.
    pub fn resolved_model(&self, default: &str) -> Result<String> {
        crate::builtin_world::resolve(self.model.as_deref().unwrap_or(default))
    }

    /// `(width, height)`: as given, else the size of the model folder's own first frame,
    /// else [`DEFAULT_SIZE`].
    pub fn size(&self, model: &str) -> (usize, usize) {
        video_size(self.width, self.height, model)
    }

    /// `--capacity` in bytes, if given.
    pub fn capacity_bytes(&self) -> Result<Option<u64>> {
        self.capacity
            .as_deref()
            .map(parse_size)
            .transpose()
            .context("--capacity")
    }
}

/// `(width, height)` from the flags, filling what is missing from the model folder's own
/// first frame, else [`DEFAULT_SIZE`].
pub fn video_size(width: Option<usize>, height: Option<usize>, model: &str) -> (usize, usize) {
    let native = headroom_engine::first_frame::native_size(std::path::Path::new(model))
        .unwrap_or(DEFAULT_SIZE);
    (width.unwrap_or(native.0), height.unwrap_or(native.1))
}

/// `--kv-budget`: `auto` (`None`), a size, or a fraction in (0, 1] of the device
/// capacity (`capacity`, else physical memory). A fraction is said on stderr with the
/// bytes it came to, since on a host it is a share of the whole machine.
pub fn kv_budget(value: &str, capacity: Option<u64>) -> Result<Option<u64>> {
    if value == "auto" {
        return Ok(None);
    }
    if value.contains('.') {
        if let Ok(fraction) = value.parse::<f64>() {
            if !(fraction > 0.0 && fraction <= 1.0) {
                anyhow::bail!("--kv-budget {value}: a fraction must be in (0, 1]");
            }
            let (total, of) = match capacity {
                Some(c) => (c, "--capacity"),
                None => (HostMemory::physical_memory(), "physical memory"),
            };
            let bytes = (total as f64 * fraction) as u64;
            eprintln!(
                "--kv-budget {value}: {} of KV pages ({value} of {} {of})",
                format_bytes(bytes),
                format_bytes(total)
            );
            return Ok(Some(bytes));
        }
    }
    let bytes = parse_size(value).context("--kv-budget")?;
    if bytes == 0 {
        anyhow::bail!("--kv-budget {value}: must be at least one page (e.g. 64MiB), or auto");
    }
    Ok(Some(bytes))
}

/// A frame count: a number, or `until-stop` (0), a session that streams until stopped.
pub fn parse_frames(value: &str) -> std::result::Result<usize, String> {
    match value.trim() {
        "until-stop" => Ok(0),
        v => v
            .parse()
            .map_err(|_| format!("{v:?} is not a frame count (12·K − 3) or until-stop")),
    }
}

/// Refuses a session without an end where `command` writes a file.
pub fn require_end(command: &str, frames: usize) -> Result<()> {
    if frames == 0 {
        anyhow::bail!(
            "--frames until-stop: {command} needs an end, give 12·K − 3 frames (9, 21, 33, …); a session that streams until stopped runs under `headroom serve` (session.start without num_frames)"
        );
    }
    Ok(())
}
