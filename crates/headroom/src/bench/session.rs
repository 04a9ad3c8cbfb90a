//! `headroom bench session`: matched A/B runs of reclaim policies and allocators over
//! sequential sessions, alone or on a mesh.

use anyhow::Result;
use clap::Args;
use headroom_bench::{run_session_bench, SessionBenchConfig};

use crate::engine_args::{DecoderArgs, ModelArgs};
use crate::ranks::RankArgs;
use crate::session_args::SessionShape;

/// Arguments of `headroom bench session`.
#[derive(Debug, Args)]
#[command(mut_args(|arg| crate::help_order::place(arg, &HELP_ORDER)))]
pub struct SessionArgs {
    /// The model, its device, dtype and capacity.
    #[command(flatten)]
    model: ModelArgs,
    /// Frames, size and seed.
    #[command(flatten)]
    shape: SessionShape,
    /// Reclaim policies to compare, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "never,before-decode,bounded,fit,always"
    )]
    policies: Vec<String>,
    /// Allocators to compare, comma-separated: planned (the default, as for generate,
    /// serve and plan), pytorch, expandable.
    #[arg(long, value_delimiter = ',', default_value = "planned")]
    allocator: Vec<String>,
    /// PyTorch's max_split_size (B, KiB, MiB, GiB; > 20 MiB): blocks this large are never
    /// split. Unlimited by default, as in PyTorch.
    #[arg(long)]
    max_split_size: Option<String>,
    /// Sequential sessions per run.
    #[arg(long, default_value_t = 3)]
    sessions: usize,
    /// Unrecorded runs per policy first.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Recorded runs per policy.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Sampling period in milliseconds.
    #[arg(long, default_value_t = 20)]
    sample_ms: u64,
    /// Output folder (samples.csv, summary.json, summary.md).
    #[arg(long, default_value = "bench-session")]
    out: std::path::PathBuf,
    /// The decoder sessions use.
    #[command(flatten)]
    decoders: DecoderArgs,
    /// The TP × SP mesh and its collective backend.
    #[command(flatten)]
    ranks: RankArgs,
}

/// `bench session --help`'s flags in order, the model's among the session's.
pub const HELP_ORDER: [&str; 22] = [
    "model",
    "frames",
    "width",
    "height",
    "seed",
    "capacity",
    "device",
    "dtype",
    "weights",
    "policies",
    "allocator",
    "max_split_size",
    "sessions",
    "warmup",
    "reps",
    "sample_ms",
    "out",
    "decoder",
    "tiny_decoder",
    "tp",
    "sp",
    "comm",
];

/// Runs `headroom bench session`.
pub fn run(args: SessionArgs) -> Result<()> {
    args.model.device.require_host("bench session")?;
    let policies = args
        .policies
        .iter()
        .map(|p| p.parse::<headroom_mem::ReclaimPolicy>())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let model = args.model.resolved_model("small")?;
    let (width, height) = args.shape.size(&model);
    crate::session_args::require_end(
        "bench session times a session with an end; it",
        args.shape.frames,
    )?;
    let config = SessionBenchConfig {
        model,
        policies,
        allocators: args
            .allocator
            .iter()
            .map(|a| a.parse::<headroom_mem::AllocatorPolicy>())
            .collect::<std::result::Result<Vec<_>, _>>()?,
        max_split_size: args
            .max_split_size
            .as_deref()
            .map(headroom_mem::parse_size)
            .transpose()?,
        sessions: args.sessions,
        warmup: args.warmup,
        reps: args.reps,
        sample_ms: args.sample_ms,
        out: args.out.clone(),
        frames: args.shape.frames,
        width,
        height,
        seed: args.shape.seed,
        capacity: args.model.capacity_bytes()?,
        dtype: args.model.dtype.dtype(),
        weights: args.model.weights,
        decoder: args.decoders.decoder,
        tiny_decoder: args.decoders.tiny_decoder.clone(),
        groups: None,
    };
    let summary = if args.ranks.is_single()? {
        run_session_bench(&config)?
    } else {
        headroom_engine::validate::check_mesh(
            &headroom_engine::EngineConfig {
                model: config.model.clone(),
                ..headroom_engine::EngineConfig::default()
            },
            args.ranks.mesh()?,
        )?;
        let summary = args.ranks.launch(None, |groups, _| {
            let config = SessionBenchConfig {
                groups: Some(groups),
                ..config.clone()
            };
            Ok(run_session_bench(&config)?)
        })?;
        match summary {
            Some(s) => s,
            None => return Ok(()),
        }
    };
    print!("{}", headroom_bench::session::markdown(&summary));
    println!(
        "\nraw samples, summary.json and summary.md in {}",
        args.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn help_lists_every_flag_in_its_order() {
        assert_eq!(
            crate::help_order::listed(&["bench", "session"]),
            super::HELP_ORDER
        );
    }
}
