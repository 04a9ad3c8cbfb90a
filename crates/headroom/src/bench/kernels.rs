//! `headroom bench kernels`: GFLOP/s of the model's ops at Wan shapes beside a bare GEMM.

use anyhow::Result;
use clap::Args;
use headroom_bench::kernels::{run_kernel_bench_on, table, KernelBenchReport};
use headroom_bench::{run_kernel_bench, KernelBenchConfig};

/// Arguments of `headroom bench kernels`.
#[derive(Debug, Args)]
pub struct KernelsArgs {
    /// Timed repetitions of each side; the best counts.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Divide the long axes by this factor (1 = the real shapes).
    #[arg(long, default_value_t = 1)]
    shrink: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// `cpu` (every CPU path), `cuda[:N]` (the ops on the GPU, each against cuBLASLt's
    /// bf16 GEMM), or `cuda-check` (the GPU path's launches checked; timings meaningless).
    #[arg(long, default_value = "cpu")]
    device: crate::device_arg::DeviceArg,
}

/// Runs `headroom bench kernels`.
pub fn run(args: KernelsArgs) -> Result<()> {
    let config = KernelBenchConfig {
        reps: args.reps,
        shrink: args.shrink,
    };
    let gpu = args.device.engine_device(
        &headroom_mem::AllocatorConfig::default(),
        headroom_mem::ReclaimPolicy::Never,
        None,
    )?;
    let rows = match &gpu {
        Some(device) => run_kernel_bench_on(device, &config)?,
        None => run_kernel_bench(&config)?,
    };
    if args.json {
        // Through a `Value`, whose maps keep their keys sorted, as `--json` always has.
        println!("{}", serde_json::to_value(KernelBenchReport::new(rows))?);
        return Ok(());
    }
    let name = gpu.map(|device| device.launcher().map(|l| l.describe()).unwrap_or_default());
    print!("{}", table(&config, &rows, name.as_deref()));
    Ok(())
}
