//! `headroom bench snapshot`: snapshot bytes, write and resume times, and the first
//! chunk after a resume against a chunk of the uninterrupted session.

use anyhow::Result;
use clap::Args;
use headroom_bench::snapshot::markdown;
use headroom_bench::{run_snapshot_bench, SnapshotBenchConfig, SnapshotModel};
use headroom_engine::EngineConfig;
use headroom_mem::ReclaimPolicy;
use headroom_tensor::DType;

/// Arguments of `headroom bench snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// Chunks before the first snapshot (the KV window of 18 frames is full after 6).
    #[arg(long, default_value_t = 6)]
    warmup: usize,
    /// Snapshots and resumes per model.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Folder for the snapshot files (removed after).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Print the rows as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `headroom bench snapshot`: `world` at 128×96 and `small` at 416×240 run here;
/// the seeded 1.3B at 832×480 in bf16 is reported from the plan's bytes.
pub fn run(args: SnapshotArgs) -> Result<()> {
    let engine = |model: String, dtype| EngineConfig {
        model,
        weight_dtype: dtype,
        reclaim: ReclaimPolicy::BeforeDecode,
        // The session and its resumed copy are open at once.
        max_sessions: 2,
        ..EngineConfig::default()
    };
    let models = vec![
        SnapshotModel {
            engine: engine(crate::builtin_world::resolve("world")?, DType::F32),
            label: "world".into(),
            width: 128,
            height: 96,
            run: true,
        },
        SnapshotModel {
            engine: engine("small".into(), DType::F32),
            label: "small".into(),
            width: 416,
            height: 240,
            run: true,
        },
        SnapshotModel {
            engine: engine("wan2.1-t2v-1.3b".into(), DType::BF16),
            label: "wan2.1-t2v-1.3b (bf16)".into(),
            width: 832,
            height: 480,
            run: false,
        },
    ];
    let config = SnapshotBenchConfig {
        models,
        warmup_chunks: args.warmup,
        reps: args.reps,
        dir: args.dir.unwrap_or_else(std::env::temp_dir),
    };
    let rows = run_snapshot_bench(&config)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "# bench snapshot: {} ({} path), {} threads, {} warm-up chunks, median of {} snapshots\n",
        headroom_tensor::kernels::cpu::model_name(),
        headroom_tensor::kernels::cpu::selected(),
        headroom_tensor::parallel::num_threads(),
        args.warmup,
        args.reps
    );
    print!("{}", markdown(&rows));
    Ok(())
}
