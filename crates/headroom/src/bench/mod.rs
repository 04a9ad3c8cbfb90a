//! `headroom bench …`: benchmarks printed as ratios measured in one run. One file per
//! subcommand holds its flags and turns them into the bench crate's configuration; the
//! bench crate runs it and renders its tables.

mod alloc;
mod batch;
mod door;
mod kernels;
mod models;
mod serve;
mod session;
mod snapshot;
mod vae;

use anyhow::Result;
use clap::{Args, Subcommand};

/// Arguments of `headroom bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Nanoseconds per cached allocate + free pair: headroom's allocator vs the system's.
    Alloc(alloc::AllocArgs),
    /// GFLOP/s of matmul, attention and conv3d at Wan shapes beside a bare GEMM.
    Kernels(kernels::KernelsArgs),
    /// Streaming VAE decode: ms per latent frame and allocator peaks.
    Vae(vae::VaeArgs),
    /// The DiT forward and the VAE decode of one AR block in f32, near-f32 and bf16, load
    /// excluded, with allocator peaks, beside diffusers on the same folder.
    Models(models::ModelsArgs),
    /// Matched A/B runs of reclaim policies over sequential sessions: memory, latency,
    /// reclaim cost and output hashes.
    Session(session::SessionArgs),
    /// Many sessions on one engine: one after another against stepped together with
    /// their forwards batched (aggregate fps, byte identity), in one run.
    Batch(batch::BatchArgs),
    /// A realtime-video client against a running `headroom serve`: time to first chunk,
    /// inter-chunk intervals, real-time factor and deadline attainment.
    Serve(serve::ServeArgs),
    /// A client's time to first chunk on an idle server and beside many idle sockets
    /// (no session.start), in one run, with the memory those sockets add.
    Door(door::DoorArgs),
    /// Session snapshots: bytes, write and resume times, and the first chunk after a
    /// resume against a chunk of the uninterrupted session.
    Snapshot(snapshot::SnapshotArgs),
}

/// Runs `headroom bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    match args.command {
        BenchCommand::Alloc(args) => alloc::run(args),
        BenchCommand::Kernels(args) => kernels::run(args),
        BenchCommand::Vae(args) => vae::run(args),
        BenchCommand::Models(args) => models::run(args),
        BenchCommand::Session(args) => session::run(args),
        BenchCommand::Serve(args) => serve::run(args),
        BenchCommand::Batch(args) => batch::run(args),
        BenchCommand::Door(args) => door::run(args),
        BenchCommand::Snapshot(args) => snapshot::run(args),
    }
}
