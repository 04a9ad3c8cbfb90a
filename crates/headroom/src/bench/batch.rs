//! `headroom bench batch`: sessions one after another against stepped together.

use anyhow::Result;
use clap::Args;
use headroom_bench::batch::{heading, markdown};
use headroom_bench::{run_batch_bench, BatchBenchConfig};
use headroom_mem::{AllocatorConfig, AllocatorPolicy, ReclaimPolicy};

use crate::engine_args::DecoderArgs;
use crate::session_args::DEFAULT_FRAMES;

/// Arguments of `headroom bench batch`.
#[derive(Debug, Args)]
pub struct BatchArgs {
    /// Built-in model (world, tiny, small, …) or a model folder.
    #[arg(long, default_value = "world")]
    model: String,
    /// Sessions at once, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    concurrency: Vec<usize>,
    /// Video width (multiple of 16).
    #[arg(long, default_value_t = 128)]
    width: usize,
    /// Video height (multiple of 16).
    #[arg(long, default_value_t = 96)]
    height: usize,
    /// Frames per session (12·K − 3).
    #[arg(long, default_value_t = DEFAULT_FRAMES)]
    frames: usize,
    /// Allocator: planned, pytorch or expandable.
    #[arg(long, default_value = "pytorch")]
    allocator: String,
    /// The decoder sessions use.
    #[command(flatten)]
    decoders: DecoderArgs,
    /// Print the rows as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `headroom bench batch`.
pub fn run(args: BatchArgs) -> Result<()> {
    let policy: AllocatorPolicy = args.allocator.parse()?;
    let config = BatchBenchConfig {
        engine: args.decoders.apply(headroom_engine::EngineConfig {
            model: crate::builtin_world::resolve(&args.model)?,
            allocator: AllocatorConfig::with_policy(policy),
            reclaim: ReclaimPolicy::BeforeDecode,
            ..headroom_engine::EngineConfig::default()
        }),
        width: args.width,
        height: args.height,
        frames: args.frames,
        concurrency: args.concurrency.clone(),
    };
    let rows = run_batch_bench(&config)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    print!(
        "{}{}",
        heading(&args.model, &args.allocator, &config),
        markdown(&rows)
    );
    Ok(())
}
