//! `headroom bench vae --decoder both`: the model's full VAE decode against a TAEHV tiny
//! decode of the same latents, a block (3 latent frames) at a time, in one run: time per
//! block (a stream's first and a later one), decoder state and allocated peak, and with
//! `reference`, `taehv.py` timed on the same shapes.

use std::path::{Path, PathBuf};
use std::time::Instant;

use headroom_engine::phases::DecodeStart;
use headroom_model::import::{load_vae, ImportOptions};
use headroom_model::{
    OutputFormat, StreamingDecodeState, TinyConfig, TinyDecoder, VaeConfig, VideoDecoder, WanVae,
};
use headroom_tensor::{DType, Device, Tensor};
use serde::Serialize;

use crate::{BenchError, Result};

/// What to compare.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderBenchConfig {
    /// `wan2.1` (the real VAE config, seeded) or a model folder (its `vae/`).
    pub model: String,
    /// A tiny decoder file; `None`: the folder's `tiny_decoder.safetensors`, else seeded
    /// weights of the released decoder's shapes.
    pub tiny_decoder: Option<PathBuf>,
    /// Video height in pixels.
    pub height: usize,
    /// Video width in pixels.
    pub width: usize,
    /// Weights (and compute) dtype of both decoders.
    pub dtype: DType,
    /// Timed repetitions (fresh streams); the best counts.
    pub reps: usize,
    /// The `taehv.py` timing command (`tools/bench_taehv.py …`), if any.
    pub reference: Option<String>,
}

/// One decoder's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecoderRow {
    /// `full` or `tiny`.
    pub decoder: String,
    /// Best milliseconds of a stream's first block (3 latent frames → 9 frames).
    pub first_block_ms: f64,
    /// Best milliseconds of a later block (3 latent frames → 12 frames).
    pub later_block_ms: f64,
    /// Bytes of the stream's state after a block.
    pub state_bytes: u64,
    /// Peak bytes allocated while decoding (weights excluded).
    pub allocated_peak_bytes: u64,
}

/// The comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecoderBenchReport {
    /// The model.
    pub model: String,
    /// CPU model name.
    pub cpu: String,
    /// Kernel threads.
    pub threads: usize,
    /// Video size.
    pub width: usize,
    /// Video size.
    pub height: usize,
    /// `f32` or `bf16`.
    pub dtype: String,
    /// Full, then tiny.
    pub rows: Vec<DecoderRow>,
    /// Full first-block time over tiny's.
    pub full_over_tiny: f64,
    /// `taehv.py`'s best seconds for the first block, when a reference ran.
    pub reference_first_block_ms: Option<f64>,
    /// `taehv.py`'s time over tiny's first block.
    pub reference_over_tiny: Option<f64>,
}

fn invalid(field: &'static str, rule: impl Into<String>) -> BenchError {
    BenchError::InvalidConfig {
        field,
        rule: rule.into(),
    }
}

/// The two decoders of `config.model`, refused unless they decode the same latents to
/// the same frames.
fn load(config: &DecoderBenchConfig, device: &Device) -> Result<(WanVae, TinyDecoder)> {
    let model = |e: headroom_model::ModelError| invalid("model", e.to_string());
    let folder = Path::new(&config.model);
    let vae = if config.model == "wan2.1" {
        WanVae::seeded(VaeConfig::default(), 0, device, config.dtype).map_err(model)?
    } else if folder.is_dir() {
        load_vae(folder, &ImportOptions::default(), device, config.dtype).map_err(model)?
    } else {
        return Err(invalid(
            "model",
            format!("{:?} is neither wan2.1 nor a model folder", config.model),
        ));
    };
    let own = folder.join(headroom_engine::TINY_DECODER_FILE);
    let tiny = match &config.tiny_decoder {
        Some(path) => TinyDecoder::load(path, device, config.dtype),
        None if own.is_file() => TinyDecoder::load(&own, device, config.dtype),
        None => TinyConfig::released_for(vae.config().z_dim)
            .and_then(|c| TinyDecoder::seeded(c, 1, device, config.dtype)),
    }
    .map_err(|e| invalid("tiny_decoder", e.to_string()))?;
    // A tiny decoder of another stage count would time other frames than the VAE's.
    let (vc, tc) = (vae.config(), tiny.config());
    let full = (vc.z_dim, vc.spatial_factor(), vc.temporal_factor());
    let small = (tc.latent_channels, tc.spatial_factor(), tc.t_upscale());
    if full != small {
        return Err(invalid(
            "tiny_decoder",
            format!(
                "decodes (channels, space, time) {small:?} and the VAE {full:?}: give the tiny decoder made for this VAE"
            ),
        ));
    }
    Ok((vae, tiny))
}

/// Times `decoder` on two blocks of `z` per rep (fresh streams).
fn measure(
    name: &str,
    decoder: &dyn VideoDecoder,
    blocks: &[Tensor; 2],
    reps: usize,
    device: &Device,
) -> Result<DecoderRow> {
    let (mut first, mut later) = (f64::INFINITY, f64::INFINITY);
    let mut state_bytes = 0;
    let platform = device.platform();
    let base = platform.memory_stats().allocated_now();
    platform.reset_peak_stats();
    for _ in 0..reps.max(1) {
        let mut state =
            StreamingDecodeState::new("bench").map_err(|e| invalid("session", e.to_string()))?;
        for (k, block) in blocks.iter().enumerate() {
            let start = Instant::now();
            decoder
                .decode_streams(
                    &[block],
                    &mut [&mut state],
                    OutputFormat::PlanarUint8,
                    &DecodeStart::on(platform.as_ref()),
                )
                .map_err(|e| invalid("decode", e.to_string()))?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            if k == 0 {
                first = first.min(ms);
            } else {
                later = later.min(ms);
            }
        }
        state_bytes = state.nbytes();
    }
    let peak = platform.memory_stats().allocated_bytes.all().peak as u64;
    Ok(DecoderRow {
        decoder: name.to_string(),
        first_block_ms: first,
        later_block_ms: later,
        state_bytes,
        allocated_peak_bytes: peak.saturating_sub(base),
    })
}

/// `taehv.py`'s first-block milliseconds through the reference command.
fn reference(config: &DecoderBenchConfig, channels: usize) -> Result<Option<f64>> {
    let Some(cmd) = &config.reference else {
        return Ok(None);
    };
    let dtype = if config.dtype == DType::BF16 {
        "bf16"
    } else {
        "f32"
    };
    let mut args = Vec::new();
    for (flag, value) in [
        ("--latent-channels", channels.to_string()),
        ("--height", config.height.to_string()),
        ("--width", config.width.to_string()),
        ("--frames", "3".to_string()),
        ("--dtype", dtype.to_string()),
        (
            "--threads",
            headroom_tensor::parallel::num_threads().to_string(),
        ),
        ("--reps", config.reps.max(1).to_string()),
    ] {
        args.extend([flag.to_string(), value]);
    }
    if let Some(file) = &config.tiny_decoder {
        args.extend(["--file".to_string(), file.display().to_string()]);
    }
    let v = crate::reference_json(cmd, &args)?;
    let seconds = v["decode_s"]
        .as_f64()
        .ok_or_else(|| invalid("reference", format!("no decode_s in its output: {v}")))?;
    Ok(Some(seconds * 1e3))
}

/// Runs the comparison.
pub fn run_decoder_bench(config: &DecoderBenchConfig) -> Result<DecoderBenchReport> {
    let device = Device::cpu()?;
    let (vae, tiny) = load(config, &device)?;
    let s = vae.config().spatial_factor();
    if config.height == 0
        || config.width == 0
        || !config.height.is_multiple_of(s)
        || !config.width.is_multiple_of(s)
    {
        return Err(invalid(
            "height / width",
            format!("positive multiples of the VAE's spatial factor {s}"),
        ));
    }
    let z = vae.config().z_dim;
    let shape = [1, z, 3, config.height / s, config.width / s];
    let blocks = [
        Tensor::randn(&shape, 1, 0, DType::F32, &device)?,
        Tensor::randn(&shape, 2, 0, DType::F32, &device)?,
    ];
    let rows = vec![
        measure("full", &vae, &blocks, config.reps, &device)?,
        measure("tiny", &tiny, &blocks, config.reps, &device)?,
    ];
    let reference_ms = reference(config, z)?;
    Ok(DecoderBenchReport {
        model: config.model.clone(),
        cpu: headroom_tensor::kernels::cpu::model_name(),
        threads: headroom_tensor::parallel::num_threads(),
        width: config.width,
        height: config.height,
        dtype: format!("{:?}", config.dtype).to_lowercase(),
        full_over_tiny: rows[0].first_block_ms / rows[1].first_block_ms,
        reference_over_tiny: reference_ms.map(|r| r / rows[1].first_block_ms),
        reference_first_block_ms: reference_ms,
        rows,
    })
}

/// `report` as a Markdown table headed by the comparison's settings (`model` as the
/// command line named it, `reps` timed streams), then the ratios.
pub fn markdown(report: &DecoderBenchReport, model: &str, reps: usize) -> String {
    let mut out = format!(
        "# bench vae --decoder both: {model} at {}x{}, {}, one block = 3 latent frames, best of {reps}, {} threads, {}\n\n",
        report.width, report.height, report.dtype, report.threads, report.cpu
    );
    out.push_str("| decoder | first block ms (9 frames) | later block ms (12 frames) | state MiB | allocated peak MiB |\n");
    out.push_str("|---|---|---|---|---|\n");
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    for r in &report.rows {
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            r.decoder,
            r.first_block_ms,
            r.later_block_ms,
            mib(r.state_bytes),
            mib(r.allocated_peak_bytes)
        ));
    }
    if let Some(ms) = report.reference_first_block_ms {
        out.push_str(&format!("| taehv.py (PyTorch) | {ms:.1} | — | — | — |\n"));
    }
    if let [full, tiny] = &report.rows[..] {
        out.push_str(&format!(
            "\nfull / tiny: {:.1}× the time of a first block, {:.1}× a later one; state {:.0}× smaller\n",
            report.full_over_tiny,
            full.later_block_ms / tiny.later_block_ms,
            full.state_bytes as f64 / tiny.state_bytes.max(1) as f64
        ));
    }
    if let Some(r) = report.reference_over_tiny {
        out.push_str(&format!(
            "taehv.py / tiny: {r:.2}× the time of a first block\n"
        ));
    }
    out
}
