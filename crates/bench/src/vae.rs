//! `headroom bench vae`: streaming decode time per latent frame and the allocator's
//! peaks, at a stated config and resolution, on seeded weights.

use std::time::Instant;

use headroom_engine::phases::DecodeStart;
use headroom_model::{OutputFormat, StreamingDecodeState, StreamingDecoder, VaeConfig, WanVae};
use headroom_tensor::{DType, Device, Tensor};
use serde::Serialize;

use crate::{BenchError, Result};

/// What to decode.
#[derive(Debug, Clone, PartialEq)]
pub struct VaeBenchConfig {
    /// `wan2.1` (the real config) or `tiny`.
    pub config: String,
    /// Video height in pixels.
    pub height: usize,
    /// Video width in pixels.
    pub width: usize,
    /// Latent frames to decode (one per chunk).
    pub latent_frames: usize,
}

impl Default for VaeBenchConfig {
    fn default() -> Self {
        Self {
            config: "wan2.1".to_string(),
            height: 128,
            width: 128,
            latent_frames: 4,
        }
    }
}

/// The measurement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VaeBenchReport {
    /// Config name.
    pub config: String,
    /// Video height.
    pub height: usize,
    /// Video width.
    pub width: usize,
    /// Latent frames decoded.
    pub latent_frames: usize,
    /// Video frames produced.
    pub frames: usize,
    /// Milliseconds of the first latent frame (yields one video frame).
    pub first_frame_ms: f64,
    /// Mean milliseconds per later latent frame (each yields `temporal factor` frames).
    pub later_frame_ms: f64,
    /// Peak bytes allocated during the decode.
    pub allocated_peak_bytes: u64,
    /// Peak bytes reserved during the decode.
    pub reserved_peak_bytes: u64,
    /// Bytes of the session's decoder state after the decode.
    pub state_bytes: u64,
    /// The state size the config declares for this resolution.
    pub declared_state_bytes: u64,
}

/// A named VAE config.
pub fn named_config(name: &str) -> Result<VaeConfig> {
    match name {
        "wan2.1" => Ok(VaeConfig::default()),
        "tiny" => Ok(VaeConfig {
            base_dim: 8,
            z_dim: 16,
            dim_mult: vec![1, 2, 2, 2],
            num_res_blocks: 1,
            ..VaeConfig::default()
        }),
        other => Err(BenchError::InvalidConfig {
            field: "config",
            rule: format!("unknown VAE config {other:?}; use wan2.1 or tiny"),
        }),
    }
}

/// Decodes `latent_frames` latent frames one chunk each and reports time and memory.
pub fn run_vae_bench(config: &VaeBenchConfig) -> Result<VaeBenchReport> {
    let vae_config = named_config(&config.config)?;
    let s = vae_config.spatial_factor();
    if !config.height.is_multiple_of(s)
        || !config.width.is_multiple_of(s)
        || config.height == 0
        || config.width == 0
        || config.latent_frames == 0
    {
        return Err(BenchError::InvalidConfig {
            field: "height / width / frames",
            rule: format!("height and width must be positive multiples of {s}; frames at least 1"),
        });
    }
    let device = Device::cpu()?;
    let vae = WanVae::seeded(vae_config, 0, &device, DType::F32).map_err(|e| {
        BenchError::InvalidConfig {
            field: "vae",
            rule: e.to_string(),
        }
    })?;
    let z = Tensor::randn(
        &[
            1,
            vae.config().z_dim,
            config.latent_frames,
            config.height / s,
            config.width / s,
        ],
        1,
        0,
        DType::F32,
        &device,
    )?;
    let decoder = StreamingDecoder::new(&vae, None);
    let mut state = StreamingDecodeState::new("bench").map_err(|e| BenchError::InvalidConfig {
        field: "session",
        rule: e.to_string(),
    })?;
    let platform = device.platform().clone();
    platform.reset_peak_stats();
    let mut times = Vec::new();
    for i in 0..config.latent_frames {
        let chunk = z.narrow(2, i, 1)?;
        let start = Instant::now();
        decoder
            .decode_chunk_with(
                &chunk,
                &mut state,
                OutputFormat::Video,
                true,
                &DecodeStart::on(platform.as_ref()),
            )
            .map_err(|e| BenchError::InvalidConfig {
                field: "decode",
                rule: e.to_string(),
            })?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let stats = platform.memory_stats();
    let later = &times[1..];
    Ok(VaeBenchReport {
        config: config.config.clone(),
        height: config.height,
        width: config.width,
        latent_frames: config.latent_frames,
        frames: state.frames_decoded,
        first_frame_ms: times[0],
        later_frame_ms: if later.is_empty() {
            0.0
        } else {
            later.iter().sum::<f64>() / later.len() as f64
        },
        allocated_peak_bytes: stats.allocated_bytes.all().peak as u64,
        reserved_peak_bytes: stats.reserved_bytes.all().peak as u64,
        state_bytes: state.nbytes(),
        declared_state_bytes: decoder.declared_state_bytes(config.height, config.width, DType::F32),
    })
}

/// `report` as text lines: the decode's size, its times and its memory.
pub fn summary(report: &VaeBenchReport) -> String {
    let bytes = headroom_mem::format_bytes;
    let mut out = format!(
        "VAE {} at {}x{}: {} latent frames → {} frames ({} kernel threads)\n",
        report.config,
        report.width,
        report.height,
        report.latent_frames,
        report.frames,
        headroom_tensor::parallel::num_threads()
    );
    out.push_str(&format!(
        "first latent frame   {:>10.1} ms\n",
        report.first_frame_ms
    ));
    out.push_str(&format!(
        "later latent frames  {:>10.1} ms each\n",
        report.later_frame_ms
    ));
    out.push_str(&format!(
        "allocated peak       {:>10}\n",
        bytes(report.allocated_peak_bytes)
    ));
    out.push_str(&format!(
        "reserved peak        {:>10}\n",
        bytes(report.reserved_peak_bytes)
    ));
    out.push_str(&format!(
        "decoder state        {:>10} (declared by the config: {})\n",
        bytes(report.state_bytes),
        bytes(report.declared_state_bytes)
    ));
    out
}
