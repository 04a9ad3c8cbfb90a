//! `headroom`: the command line of the headroom engine.

mod bench;
mod builtin_world;
mod cuda;
mod device_arg;
mod dit;
mod dtype_arg;
mod engine_args;
mod generate;
mod help_order;
mod mem;
mod outputs;
mod plan;
mod ranks;
mod serve;
mod session_args;
mod snapshot;
mod text;
mod vae;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// headroom: stepwise streaming video diffusion that owns every byte.
#[derive(Debug, Parser)]
#[command(name = "headroom", version, about, propagate_version = true)]
struct Cli {
    /// Kernel threads (default: HEADROOM_THREADS, else all cores). Results are
    /// byte-identical for a given thread count.
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate a video: one streaming session on a built-in model (the main job).
    Generate(generate::GenerateArgs),
    /// Memory tools: replay allocation traces through headroom's allocator.
    Mem(mem::MemArgs),
    /// Benchmarks that print ratios measured side by side in one run.
    Bench(bench::BenchArgs),
    /// The realtime streaming server (vLLM-Omni's WS /v1/realtime/video) and its web viewer.
    Serve(serve::ServeArgs),
    /// The Wan VAE: decode latents and encode video (.npy in, .npy out).
    Vae(vae::VaeArgs),
    /// The Wan transformer: one full-sequence forward (.npy in, .npy out).
    Dit(dit::DitArgs),
    /// Predict per-card memory of a deployment (model, resolution, TP × SP, capacity,
    /// policies) by meta execution of a whole session.
    Plan(plan::PlanArgs),
    /// The UMT5 text encoder: a prompt to Wan text embeddings (.npy out).
    Text(text::TextArgs),
    /// Session snapshots: `inspect` prints what one holds and what it resumes on.
    Snapshot(snapshot::SnapshotArgs),
    /// The CUDA backend: compile-check the kernels (no GPU needed), self-test on a GPU.
    Cuda(cuda::CudaArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(threads) = cli.threads {
        if threads == 0 {
            eprintln!("error: --threads must be at least 1");
            return ExitCode::from(2);
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = if threads > cores {
            // More kernel threads than cores only contend (1000 turned 1 s into 120 s).
            eprintln!(
                "warning: --threads {threads} is more than the {cores} cores here; using {cores}"
            );
            cores
        } else {
            threads
        };
        headroom_tensor::parallel::set_threads(threads);
    }
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Mem(args) => mem::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Vae(args) => vae::run(args),
        Command::Dit(args) => dit::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Text(args) => text::run(args),
        Command::Snapshot(args) => snapshot::run(args),
        Command::Cuda(args) => cuda::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", one_line(&error));
            ExitCode::from(2)
        }
    }
}

/// An error and its causes on one line: a cause whose text is already said (libraries
/// often print their source inside their own message) is left out, and runs of
/// whitespace become one space.
fn one_line(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        let part = part.trim().trim_end_matches(['.', ':']).trim();
        if part.is_empty() || text.contains(part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(part);
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
