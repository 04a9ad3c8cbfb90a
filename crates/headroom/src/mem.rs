//! `headroom mem …`: replay an allocation trace through our allocator and policies.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use headroom_mem::{
    format_bytes, parse_size, parse_trace, replay_on_sim, AllocatorPolicy, MemoryStats, Platform,
    ReclaimPolicy, ReplayOptions,
};

/// Arguments of `headroom mem`.
#[derive(Debug, Args)]
pub struct MemArgs {
    #[command(subcommand)]
    command: MemCommand,
}

#[derive(Debug, Subcommand)]
enum MemCommand {
    /// Replay a trace (our JSON lines or a PyTorch snapshot pickle) on a modelled device.
    Replay(ReplayArgs),
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// Trace file: JSON lines ({"op":"alloc","id":7,"size":1048576}) or a PyTorch
    /// snapshot pickle (torch.cuda.memory._dump_snapshot).
    trace: PathBuf,
    /// Allocator: pytorch, expandable or planned (each stretch between session_end lines
    /// recorded once, planned, then replayed at its planned offsets).
    #[arg(long, default_value = "pytorch", value_parser = parse_allocator)]
    allocator: AllocatorPolicy,
    /// Device capacity (B, KiB, MiB, GiB).
    #[arg(long, default_value = "64GiB", value_parser = parse_bytes)]
    capacity: u64,
    /// PyTorch's max_split_size (B, KiB, MiB, GiB); unlimited when absent.
    #[arg(long, value_parser = parse_bytes)]
    max_split_size: Option<u64>,
    /// Reclaim policy at phase lines: never, before-decode, bounded[:max_cached=F,min_free=F], fit[:slack=F], always.
    #[arg(long, default_value = "never", value_parser = parse_reclaim)]
    policy: ReclaimPolicy,
    /// Write the final snapshot: a PyTorch pickle for pytorch.org/memory_viz, or JSON if
    /// the name ends in .json.
    #[arg(long)]
    snapshot: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

fn parse_allocator(s: &str) -> Result<AllocatorPolicy, String> {
    s.parse().map_err(|e: headroom_mem::MemError| e.to_string())
}

fn parse_reclaim(s: &str) -> Result<ReclaimPolicy, String> {
    s.parse().map_err(|e: headroom_mem::MemError| e.to_string())
}

/// Runs `headroom mem`.
pub fn run(args: MemArgs) -> Result<()> {
    match args.command {
        MemCommand::Replay(args) => replay_cmd(args),
    }
}

/// Events kept for `--snapshot`: enough for long traces, bounded so memory stays small.
const SNAPSHOT_HISTORY: usize = 1 << 20;

fn replay_cmd(args: ReplayArgs) -> Result<()> {
    let bytes = std::fs::read(&args.trace)
        .with_context(|| format!("cannot read trace {}", args.trace.display()))?;
    let ops = parse_trace(&bytes).with_context(|| format!("in {}", args.trace.display()))?;
    let options = ReplayOptions {
        allocator: args.allocator,
        capacity: args.capacity,
        max_split_size: args.max_split_size,
        policy: args.policy,
        history: if args.snapshot.is_some() {
            SNAPSHOT_HISTORY
        } else {
            0
        },
    };
    let (report, platform) = replay_on_sim(&ops, &options)?;
    let allocated_peak = report.stats.allocated_bytes.all().peak.max(0) as u64;
    let reserved_peak = report.stats.reserved_bytes.all().peak.max(0) as u64;
    let over_bound = report.reserved_over_allocated_peak();
    if let Some(path) = &args.snapshot {
        let snapshot = platform.allocator().snapshot();
        let out = if crate::outputs::has_extension(path, "json") {
            snapshot.to_json().into_bytes()
        } else {
            snapshot.to_pickle()
        };
        std::fs::write(path, out)
            .with_context(|| format!("cannot write snapshot {}", path.display()))?;
    }
    if args.json {
        let trace = args.trace.display().to_string();
        println!("{}", report.to_json(&trace, &options));
    } else {
        println!(
            "replayed {} ops from {} on a {} device · allocator {} · policy {}",
            report.ops,
            args.trace.display(),
            format_bytes(args.capacity),
            args.allocator,
            args.policy
        );
        print_table(&report.stats);
        println!(
            "reserved peak {} = {over_bound:.3} × the allocated peak {} (the bound)",
            format_bytes(reserved_peak),
            format_bytes(allocated_peak)
        );
        if args.allocator == AllocatorPolicy::Planned {
            println!(
                "planned: {} hits, {} misses, {} served by the caching path",
                report.stats.planned_hits,
                report.stats.planned_misses,
                format_bytes(report.stats.fallback_bytes)
            );
        }
        println!(
            "alloc retries {} · OOMs {} (failed allocs {}, ignored frees {}) · device allocs {} · device frees {}",
            report.stats.num_alloc_retries,
            report.stats.num_ooms,
            report.failed_allocs,
            report.ignored_frees,
            report.stats.num_device_alloc,
            report.stats.num_device_free
        );
        println!(
            "reclaims {} in {:.3} ms, {} given back",
            report.stats.num_reclaims,
            report.stats.reclaim_ns as f64 / 1e6,
            format_bytes(report.stats.reclaimed_bytes)
        );
        if let Some(path) = &args.snapshot {
            println!("snapshot written to {}", path.display());
        }
    }
    Ok(())
}

fn print_table(stats: &MemoryStats) {
    println!("{:<22}{:>14}{:>14}", "", "current", "peak");
    let rows = [
        ("allocated", stats.allocated_bytes.all()),
        ("reserved", stats.reserved_bytes.all()),
        ("requested", stats.requested_bytes.all()),
        ("inactive split", stats.inactive_split_bytes.all()),
    ];
    for (name, stat) in rows {
        println!(
            "{:<22}{:>14}{:>14}",
            name,
            format_bytes(stat.current.max(0) as u64),
            format_bytes(stat.peak.max(0) as u64)
        );
    }
    println!(
        "{:<22}{:>14}{:>14}",
        "segments",
        stats.segment.all().current,
        stats.segment.all().peak
    );
}
