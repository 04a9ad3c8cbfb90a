//! `headroom bench alloc`: cached allocate + free pairs, ours against the system's.

use anyhow::Result;
use clap::Args;
use headroom_bench::alloc::{table, AllocBenchReport};
use headroom_bench::{run_alloc_bench, AllocBenchConfig};
use headroom_mem::{parse_size, AllocatorPolicy};

/// Arguments of `headroom bench alloc`.
#[derive(Debug, Args)]
pub struct AllocArgs {
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
    /// headroom's allocator: pytorch, expandable or planned.
    #[arg(long, default_value = "pytorch")]
    policy: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `headroom bench alloc`.
pub fn run(args: AllocArgs) -> Result<()> {
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
        let report = AllocBenchReport {
            policy: policy.name(),
            rows,
        };
        // Through a `Value`, whose maps keep their keys sorted, as `--json` always has.
        println!("{}", serde_json::to_value(report)?);
        return Ok(());
    }
    print!("{}", table(&config, &rows));
    Ok(())
}
