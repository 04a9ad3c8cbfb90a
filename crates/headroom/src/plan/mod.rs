//! `headroom plan`: per-rank device memory of a deployment, predicted by meta execution.
//! The flags are in [`args`], the JSON report and the table in [`report`]; this file runs
//! the plan (an unbounded card for a session that does not fit) and writes the plot and
//! snapshots.

mod args;
mod report;

use anyhow::{Context, Result};
use headroom_bench::plan::{timeline, PlanConfig, PlanPlatform};
use headroom_bench::plot::{write_memory_png, Panel, XAxis};
use headroom_engine::plan::{plan_dtype, run_plan_sized, PlanReport};
use headroom_engine::Mesh;
use headroom_mem::{format_bytes, parse_size, AllocatorConfig, ReclaimPolicy};

pub use args::PlanArgs;
use report::{table, Heading};

/// Allocator events kept per rank when a plot or snapshots are asked for.
const HISTORY_EVENTS: usize = 400_000;

/// Runs `headroom plan`.
pub fn run(args: PlanArgs) -> Result<()> {
    let policies = args
        .policies
        .iter()
        .map(|p| p.parse::<ReclaimPolicy>())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let weight_dtype = plan_dtype(&args.model, &args.dtype).context("--dtype")?;
    if args.measure {
        args.device.require_host("plan --measure")?;
    }
    let capacity = match args.device.card_capacity()? {
        Some(card) => card,
        None => parse_size(&args.capacity).context("--capacity")?,
    };
    let keep_history = args.plot.is_some() || args.trace.is_some();
    let model = crate::builtin_world::resolve(&args.model)?;
    let (width, height) = crate::session_args::video_size(args.width, args.height, &model);
    let config = PlanConfig {
        model,
        transformer: args.transformer.clone(),
        height,
        width,
        frames: args.frames,
        mesh: Mesh {
            tp: args.tp,
            sp: args.sp,
        },
        capacity,
        allocator: AllocatorConfig::with_policy(args.allocator.parse()?),
        policies,
        kv_fraction: args.kv_fraction,
        chunks: args.chunks,
        weight_dtype,
        weights: args.weights,
        history: if keep_history { HISTORY_EVENTS } else { 0 },
        platform: if args.measure {
            PlanPlatform::Cpu
        } else {
            PlanPlatform::Sim
        },
        decoder: args.decoders.decoder,
        tiny_decoder: args.decoders.tiny_decoder.clone(),
    };
    let start = std::time::Instant::now();
    // A session that does not fit is planned on an unbounded card to say by how much,
    // instead of stopping at the first allocation that failed.
    let (rows, overflow) = run_plan_sized(&config)?;
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(dir) = &args.trace {
        std::fs::create_dir_all(dir).with_context(|| format!("--trace {}", dir.display()))?;
        for r in &rows {
            if let Some(pickle) = &r.snapshot_pickle {
                let path = dir.join(format!("rank{}-{}.pickle", r.rank, file_safe(&r.policy)));
                std::fs::write(&path, pickle)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    if let Some(path) = &args.plot {
        let panels: Vec<Panel> = rows
            .iter()
            .map(|r| {
                timeline(
                    &format!("rank {} · {}", r.rank, r.policy),
                    &r.trace,
                    r.final_bytes.0,
                    r.final_bytes.1,
                )
            })
            .collect();
        write_memory_png(
            path,
            &panels,
            XAxis::Events,
            "meta execution: x counts allocator events (the last ones kept per rank)",
        )?;
    }
    if args.json {
        println!("{}", PlanReport::new(&rows).to_json()?);
        return Ok(());
    }
    let heading = Heading {
        model: &args.model,
        allocator: &args.allocator,
        capacity,
    };
    print!("{}", table(&heading, &config, &rows));
    if overflow {
        println!(
            "\nThe session does not fit a {} card: the figures above are what it needs (planned on an unbounded card). Shard it (--tp/--sp; e.g. --tp 2 --sp 4 for lingbot-world-v2-14b), or lower --width/--height or --frames.",
            format_bytes(capacity)
        );
    }
    println!(
        "\n{} in {elapsed:.1} s ({} ranks × {} policies).",
        if args.measure {
            "measured on cpu"
        } else {
            "planned by meta execution"
        },
        config.mesh.ranks(),
        config.policies.len()
    );
    Ok(())
}

/// `s` with every character but ASCII letters, digits and `-` as `_`: a file name.
fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
