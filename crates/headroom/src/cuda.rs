//! `headroom cuda`: the CUDA backend's tools.
//!
//! `kernels` compiles every embedded kernel module with NVRTC for an arch (no GPU needed)
//! and prints each kernel's registers, spill bytes and static shared memory. `selftest`
//! runs every op on the GPU and on the CPU and prints the largest difference per op
//! against its tolerance (needs `--features cuda` and a GPU; exit 2 with the reason
//! otherwise).

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use headroom_tensor::cuda::{compile_all, DiskCache, KernelStats, Nvrtc};

/// Options of `headroom cuda`.
#[derive(Debug, Args)]
pub struct CudaArgs {
    #[command(subcommand)]
    command: CudaCommand,
}

#[derive(Debug, Subcommand)]
enum CudaCommand {
    /// Compile every kernel for an arch with NVRTC and report its resources.
    Kernels(KernelsArgs),
    /// Run every op on cuda and on cpu; print the max error per op against its tolerance.
    Selftest(SelftestArgs),
}

/// Options of `headroom cuda kernels`.
#[derive(Debug, Args)]
struct KernelsArgs {
    /// Target arch: sm_80, sm_86, sm_89, sm_90 or sm_90a.
    #[arg(long, default_value = "sm_90")]
    arch: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Compile afresh instead of reading the cubin cache (HEADROOM_CUDA_CACHE, else
    /// ~/.cache/headroom/cuda).
    #[arg(long)]
    no_cache: bool,
}

/// Options of `headroom cuda selftest`.
#[derive(Debug, Args)]
struct SelftestArgs {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `headroom cuda …`.
pub fn run(args: CudaArgs) -> Result<()> {
    match args.command {
        CudaCommand::Kernels(a) => kernels(a),
        CudaCommand::Selftest(a) => selftest(a),
    }
}

fn kernels(args: KernelsArgs) -> Result<()> {
    headroom_tensor::cuda::compile::check_arch(&args.arch)?;
    let nvrtc = Nvrtc::get()?;
    let cache = if args.no_cache {
        None
    } else {
        DiskCache::default_location()
    };
    let modules = compile_all(&args.arch, cache.as_ref())?;
    let kernels: Vec<&KernelStats> = modules.iter().flat_map(|m| &m.kernels).collect();
    if let Some(reason) = modules.iter().find_map(|m| m.cache_error.as_ref()) {
        eprintln!("warning: kernels compiled but not cached: {reason}");
    }
    if args.json {
        let out = serde_json::json!({
            "arch": args.arch,
            "nvrtc_version": nvrtc.version(),
            "kernels": kernels,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "NVRTC {} from {}; {} kernels in {} modules for {}",
        nvrtc.version(),
        nvrtc.dir().display(),
        kernels.len(),
        modules.len(),
        args.arch
    );
    println!(
        "{:<12} {:<24} {:<12} {:>9} {:>11} {:>12}",
        "module", "kernel", "op", "registers", "spill_bytes", "shared_bytes"
    );
    for k in &kernels {
        println!(
            "{:<12} {:<24} {:<12} {:>9} {:>11} {:>12}",
            k.module, k.name, k.op, k.registers, k.spill_bytes, k.shared_bytes
        );
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn selftest(args: SelftestArgs) -> Result<()> {
    let report = headroom_tensor::ops::selftest::run(args.device)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("self-test on {}", report.device);
        println!(
            "{:<12} {:<42} {:>10} {:>10}  result",
            "op", "check", "max_error", "tolerance"
        );
        for r in &report.ops {
            println!(
                "{:<12} {:<42} {:>10.3e} {:>10.3e}  {}",
                r.op,
                r.kernel,
                r.max_error,
                r.tolerance,
                if r.passed { "pass" } else { "FAIL" }
            );
        }
    }
    if report.ops.iter().any(|r| !r.passed) {
        bail!("selftest: some ops differ from the CPU beyond their tolerance");
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn selftest(args: SelftestArgs) -> Result<()> {
    let _ = (args.device, args.json);
    bail!("this build has no CUDA support (build with --features cuda)")
}
