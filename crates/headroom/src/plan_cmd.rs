//! `headroom plan`: per-rank device memory of a deployment, predicted by meta execution.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use headroom_bench::plan::{run_plan, timeline, PlanConfig, PlanPlatform, RankPlan};
use headroom_bench::plot::{write_memory_png, Panel, XAxis};
use headroom_engine::Mesh;
use headroom_mem::{format_bytes, parse_size, AllocatorConfig, ReclaimPolicy};
use headroom_tensor::DType;

/// The capacity a session that does not fit is planned on, to say what it needs (1 PiB).
const UNBOUNDED: u64 = 1 << 50;

/// Allocator events kept per rank when a plot or snapshots are asked for.
const HISTORY_EVENTS: usize = 400_000;

/// Options of `headroom plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Built-in model (world, tiny, small, wan2.1-t2v-1.3b, lingbot-world-v2-14b), a
    /// diffusers pipeline folder or an original Wan repo folder (only headers and configs are read).
    #[arg(long, default_value = "lingbot-world-v2-14b")]
    model: String,
    /// A transformer checkpoint over --model (Self-Forcing .pt, LingBot-World folder, …).
    #[arg(long)]
    transformer: Option<String>,
    /// Video height in pixels.
    #[arg(long, default_value_t = 480)]
    height: usize,
    /// Video width in pixels.
    #[arg(long, default_value_t = 832)]
    width: usize,
    /// Frames of the session: 12·K − 3 for K chunks, or `until-stop`: a session without
    /// an end, planned at its steady state (its KV window full), whose peak every later
    /// chunk repeats.
    #[arg(long, default_value_t = 117, value_parser = crate::session_args::parse_frames)]
    frames: usize,
    /// Tensor-parallel degree (heads and FFN split across ranks).
    #[arg(long, default_value_t = 1)]
    tp: usize,
    /// Sequence-parallel (Ulysses) degree (tokens split across ranks).
    #[arg(long, default_value_t = 1)]
    sp: usize,
    /// Memory of each card (B, KiB, MiB, GiB).
    #[arg(long, default_value = "64GiB")]
    capacity: String,
    /// Device whose capacity to plan for: cpu (use --capacity) or cuda[:N] (the card's
    /// memory as the driver reports it replaces --capacity; needs --features cuda).
    #[arg(long, default_value = "cpu")]
    device: crate::device_arg::DeviceArg,
    /// Allocator: planned (the default of generate, serve and bench session too),
    /// pytorch or expandable.
    #[arg(long, default_value = "planned")]
    allocator: String,
    /// Reclaim policies to plan, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "never,before-decode")]
    policies: Vec<String>,
    /// KV pool as a fraction of the memory free after the weights (default: exactly one
    /// session's window of pages).
    #[arg(long)]
    kv_fraction: Option<f64>,
    /// Chunks to run (default: the whole session).
    #[arg(long)]
    chunks: Option<usize>,
    /// Weight dtype: bf16, f32, or auto (what the model runs in: f32 for the tiny and
    /// small built-ins and pipeline folders, as `generate` runs them; bf16 for the real
    /// model shapes, as they are deployed).
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Run on the host (`cpu`) instead of meta execution: measures what the plan
    /// predicts (small models only).
    #[arg(long)]
    measure: bool,
    #[command(flatten)]
    decoders: crate::session_args::DecoderArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Write a memory timeline per rank and policy to this PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write a PyTorch snapshot pickle per rank and policy into this folder (memory_viz).
    #[arg(long)]
    trace: Option<PathBuf>,
}

/// Runs `headroom plan`.
pub fn run(args: PlanArgs) -> Result<()> {
    let policies = args
        .policies
        .iter()
        .map(|p| p.parse::<ReclaimPolicy>())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let weight_dtype = match args.dtype.as_str() {
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        // The real model shapes are deployed in bf16; everything `generate` runs here
        // (the small built-ins, pipeline folders) runs in f32.
        "auto"
            if matches!(
                args.model.as_str(),
                "wan2.1-t2v-1.3b" | "lingbot-world-v2-14b"
            ) =>
        {
            DType::BF16
        }
        "auto" => DType::F32,
        other => anyhow::bail!("--dtype must be auto, bf16 or f32, got {other:?}"),
    };
    if args.measure {
        args.device.require_host("plan --measure")?;
    }
    let capacity = match args.device.card_capacity()? {
        Some(card) => card,
        None => parse_size(&args.capacity).context("--capacity")?,
    };
    let keep_history = args.plot.is_some() || args.trace.is_some();
    let config = PlanConfig {
        model: crate::builtin_world::resolve(&args.model)?,
        transformer: args.transformer.clone(),
        height: args.height,
        width: args.width,
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
    let (rows, overflow) = match run_plan(&config) {
        Ok(rows) => (rows, false),
        // The session does not fit: plan it on an unbounded card to say by how much,
        // instead of stopping at the first allocation that failed.
        Err(e) if e.does_not_fit() && !args.measure && args.kv_fraction.is_none() => {
            let unbounded = PlanConfig {
                capacity: UNBOUNDED,
                ..config.clone()
            };
            let mut rows = run_plan(&unbounded).with_context(|| format!("{e}"))?;
            for r in &mut rows {
                r.headroom_bytes = capacity as i64 - r.peak_reserved_bytes as i64;
            }
            (rows, true)
        }
        Err(e) => return Err(e.into()),
    };
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
        let fits = rows.iter().all(|r| r.headroom_bytes >= 0);
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "fits": fits, "ranks": rows }))?
        );
        return Ok(());
    }
    print!("{}", table(&args, capacity, &rows));
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

/// The per-rank table, then the worst rank of each policy.
fn table(args: &PlanArgs, capacity: u64, rows: &[RankPlan]) -> String {
    let gb = |b: u64| format!("{:.2}", b as f64 / 1e9);
    let mut out = format!(
        "# plan: {} ({} decoder) at {}x{}, {}, TP{} x SP{}, {} per card ({} allocator)\n\n",
        args.model,
        args.decoders.decoder,
        args.width,
        args.height,
        match args.frames {
            0 => "until stopped (its steady state)".to_string(),
            n => format!("{n} frames"),
        },
        args.tp,
        args.sp,
        format_bytes(capacity),
        args.allocator
    );
    out.push_str("| rank | policy | weights GB | KV GB | decoder state GB | conditioning GB | peak allocated GB | peak reserved GB | post-session reserved GB | headroom GB | peak phase |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} |\n",
            r.rank,
            r.policy,
            gb(r.weights_bytes),
            gb(r.kv_bytes),
            gb(r.decoder_state_bytes),
            gb(r.conditioning_bytes),
            gb(r.peak_allocated_bytes),
            gb(r.peak_reserved_bytes),
            gb(r.post_session_reserved_bytes),
            r.headroom_bytes as f64 / 1e9,
            r.peak_phase
        ));
    }
    out.push('\n');
    let mut policies: Vec<&str> = rows.iter().map(|r| r.policy.as_str()).collect();
    policies.dedup();
    for policy in policies {
        let worst = rows
            .iter()
            .filter(|r| r.policy == policy)
            .max_by_key(|r| r.peak_reserved_bytes);
        if let Some(w) = worst {
            out.push_str(&format!(
                "- {policy}: per-card peak {} MB reserved ({} MB allocated) of {} MB, post-session {} MB — {}\n",
                w.peak_reserved_bytes / 1_000_000,
                w.peak_allocated_bytes / 1_000_000,
                capacity / 1_000_000,
                w.post_session_reserved_bytes / 1_000_000,
                if w.headroom_bytes >= 0 { "fits" } else { "DOES NOT FIT" }
            ));
        }
    }
    out
}
