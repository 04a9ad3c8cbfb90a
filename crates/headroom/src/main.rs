//! `headroom`: the command line of the headroom engine.

mod bench_cmd;
mod builtin_world;
mod cuda_cmd;
mod device_arg;
mod dit_cmd;
mod dtype_arg;
mod generate_cmd;
mod mem_cmd;
mod outputs;
mod plan_cmd;
mod ranks;
mod serve_cmd;
mod session_args;
mod text_cmd;
mod vae_cmd;

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
    Generate(generate_cmd::GenerateArgs),
    /// Memory tools: replay allocation traces through headroom's allocator.
    Mem(mem_cmd::MemArgs),
    /// Benchmarks that print ratios measured side by side in one run.
    Bench(bench_cmd::BenchArgs),
    /// The realtime streaming server (vLLM-Omni's WS /v1/realtime/video) and its web viewer.
    Serve(serve_cmd::ServeArgs),
    /// The Wan VAE: decode latents and encode video (.npy in, .npy out).
    Vae(vae_cmd::VaeArgs),
    /// The Wan transformer: one full-sequence forward (.npy in, .npy out).
    Dit(dit_cmd::DitArgs),
    /// Predict per-card memory of a deployment (model, resolution, TP × SP, capacity,
    /// policies) by meta execution of a whole session.
    Plan(plan_cmd::PlanArgs),
    /// The UMT5 text encoder: a prompt to Wan text embeddings (.npy out).
    Text(text_cmd::TextArgs),
    /// The CUDA backend: compile-check the kernels (no GPU needed), self-test on a GPU.
    Cuda(cuda_cmd::CudaArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(threads) = cli.threads {
        if threads == 0 {
            eprintln!("error: --threads must be at least 1");
            return ExitCode::from(2);
        }
        headroom_tensor::parallel::set_threads(threads);
    }
    let result = match cli.command {
        Command::Generate(args) => generate_cmd::run(args),
        Command::Mem(args) => mem_cmd::run(args),
        Command::Bench(args) => bench_cmd::run(args),
        Command::Serve(args) => serve_cmd::run(args),
        Command::Vae(args) => vae_cmd::run(args),
        Command::Dit(args) => dit_cmd::run(args),
        Command::Plan(args) => plan_cmd::run(args),
        Command::Text(args) => text_cmd::run(args),
        Command::Cuda(args) => cuda_cmd::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}
