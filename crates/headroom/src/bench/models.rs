//! `headroom bench models`: one AR block's DiT forward and VAE decode per compute mode.

use anyhow::Result;
use clap::Args;
use headroom_bench::models::{heading, markdown, ModelBenchReport};
use headroom_bench::{run_model_bench, ModelBenchConfig};

use crate::session_args::DEFAULT_SIZE;

/// Arguments of `headroom bench models`.
#[derive(Debug, Args)]
pub struct ModelsArgs {
    /// A diffusers pipeline folder (transformer/ + vae/); the seeded wan2.1-t2v-1.3b preset
    /// when absent (then no reference can run).
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Modes, comma-separated: f32, near-f32, bf16, int8 (bf16 with the DiT blocks' linears
    /// W8A8; diffusers runs bf16 beside it). With f32 first, later modes' DiT outputs are
    /// compared with it (relative L2).
    #[arg(long, value_delimiter = ',', default_value = "f32,near-f32,bf16")]
    modes: Vec<String>,
    /// Timed repetitions after one warm-up (best counts).
    #[arg(long, default_value_t = 1)]
    reps: usize,
    /// Video width in pixels.
    #[arg(long, default_value_t = DEFAULT_SIZE.0)]
    width: usize,
    /// Video height in pixels.
    #[arg(long, default_value_t = DEFAULT_SIZE.1)]
    height: usize,
    /// A transformer checkpoint in any layout (an 8-bit ComfyUI, Kijai or lightx2v file
    /// included) timed in place of the folder's own, with the folder's (or the seeded
    /// 1.3B's) config as its base.
    #[arg(long)]
    transformer: Option<std::path::PathBuf>,
    /// The diffusers timing command, e.g. "python tools/bench_diffusers_models.py".
    #[arg(long)]
    reference: Option<String>,
    /// Print the rows as JSON.
    #[arg(long)]
    json: bool,
    /// Works to run, comma-separated: dit, vae (default: both).
    #[arg(long, value_delimiter = ',')]
    works: Vec<String>,
    /// After the timed runs, one more run of each work with every op recorded: wall
    /// time, calls and bytes moved per op kind (conv3d, linear, attention, norms, …).
    #[arg(long)]
    profile: bool,
}

/// Runs `headroom bench models`.
pub fn run(args: ModelsArgs) -> Result<()> {
    let config = ModelBenchConfig {
        model: args.model,
        transformer: args.transformer,
        modes: args.modes,
        reps: args.reps,
        width: args.width,
        height: args.height,
        reference: args.reference,
        works: args.works,
        profile: args.profile,
    };
    let rows = run_model_bench(&config)?;
    if args.json {
        // Through a `Value`, whose maps keep their keys sorted, as `--json` always has.
        println!("{}", serde_json::to_value(ModelBenchReport::new(rows))?);
        return Ok(());
    }
    print!("{}{}", heading(&config), markdown(&rows));
    Ok(())
}
