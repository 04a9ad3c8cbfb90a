//! `headroom bench …`: benchmarks printed as ratios measured in one run.

use anyhow::Result;
use clap::{Args, Subcommand};
use headroom_bench::{run_alloc_bench, AllocBenchConfig};
use headroom_mem::{format_bytes, parse_size, AllocatorPolicy};

/// Arguments of `headroom bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Nanoseconds per cached allocate + free pair: headroom's allocator vs the system's.
    Alloc(AllocArgs),
}

#[derive(Debug, Args)]
struct AllocArgs {
    /// Request sizes (B, KiB, MiB, GiB), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "512B,64KiB,1MiB,16MiB,256MiB"
    )]
    sizes: Vec<String>,
    /// Allocate + free pairs per round.
    #[arg(long, default_value_t = 20_000)]
    pairs: u64,
    /// Interleaved rounds; the median counts.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// headroom's allocator policy: pytorch or expandable.
    #[arg(long, default_value = "pytorch")]
    policy: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `headroom bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    match args.command {
        BenchCommand::Alloc(args) => alloc(args),
    }
}

fn alloc(args: AllocArgs) -> Result<()> {
    let sizes = args
        .sizes
        .iter()
        .map(|s| parse_size(s))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let policy: AllocatorPolicy = args.policy.parse()?;
    let config = AllocBenchConfig {
        sizes,
        pairs: args.pairs,
        rounds: args.rounds,
        policy,
    };
    let rows = run_alloc_bench(&config)?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "policy": policy.name(), "rows": rows })
        );
        return Ok(());
    }
    println!(
        "cached allocate+free pairs, median of {} interleaved rounds of {} pairs (policy {policy})",
        config.rounds, config.pairs
    );
    println!(
        "{:>10}{:>16}{:>14}{:>10}",
        "size", "headroom ns", "system ns", "ratio"
    );
    for row in rows {
        println!(
            "{:>10}{:>16.1}{:>14.1}{:>9.1}×",
            format_bytes(row.size),
            row.headroom_ns,
            row.system_ns,
            row.speedup
        );
    }
    println!("ratio = system ns / headroom ns (higher is better for headroom)");
    Ok(())
}
