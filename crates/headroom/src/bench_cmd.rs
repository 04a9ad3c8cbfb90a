//! `headroom bench …`: benchmarks printed as ratios measured in one run.

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::session_args::SessionShape;
use headroom_bench::{
    run_alloc_bench, run_kernel_bench, run_session_bench, run_vae_bench, AllocBenchConfig,
    KernelBenchConfig, SessionBenchConfig, VaeBenchConfig,
};
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
    /// GFLOP/s of matmul, attention and conv3d at Wan shapes beside a bare GEMM.
    Kernels(KernelsArgs),
    /// Streaming VAE decode: ms per latent frame and allocator peaks.
    Vae(VaeArgs),
    /// The DiT forward and the VAE decode of one AR block in f32, near-f32 and bf16, load
    /// excluded, with allocator peaks, beside diffusers on the same folder.
    Models(ModelsArgs),
    /// Matched A/B runs of reclaim policies over sequential sessions: memory, latency,
    /// reclaim cost and output hashes.
    Session(SessionArgs),
    /// Many sessions on one engine: one after another against stepped together with
    /// their forwards batched (aggregate fps, byte identity), in one run.
    Batch(BatchArgs),
    /// A realtime-video client against a running `headroom serve`: time to first chunk,
    /// inter-chunk intervals, real-time factor and deadline attainment.
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
struct ModelsArgs {
    /// A diffusers pipeline folder (transformer/ + vae/); the seeded wan2.1-t2v-1.3b preset
    /// when absent (then no reference can run).
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Modes, comma-separated: f32, near-f32, bf16.
    #[arg(long, value_delimiter = ',', default_value = "f32,near-f32,bf16")]
    modes: Vec<String>,
    /// Timed repetitions after one warm-up (best counts).
    #[arg(long, default_value_t = 1)]
    reps: usize,
    /// Video width in pixels.
    #[arg(long, default_value_t = 416)]
    width: usize,
    /// Video height in pixels.
    #[arg(long, default_value_t = 240)]
    height: usize,
    /// The diffusers timing command, e.g. "python tools/bench_diffusers_models.py".
    #[arg(long)]
    reference: Option<String>,
    /// Print the rows as JSON.
    #[arg(long)]
    json: bool,
    /// Works to run, comma-separated: dit, vae (default: both).
    #[arg(long, value_delimiter = ',')]
    works: Vec<String>,
    /// After the timed runs, one more run of each work with every op recorded: wall
    /// time, calls and bytes moved per op kind (conv3d, linear, attention, norms, …).
    #[arg(long)]
    profile: bool,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// The server's realtime endpoint.
    #[arg(long, default_value = "ws://127.0.0.1:8000/v1/realtime/video")]
    url: String,
    /// Sessions in all.
    #[arg(long, default_value_t = 4)]
    sessions: usize,
    /// Clients at a time (more than the server's slots: the rest wait in its queue);
    /// several, comma-separated, run one after another and are compared.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    concurrency: Vec<usize>,
    /// Frames per session: 12·K − 3.
    #[arg(long, default_value_t = 33)]
    frames: usize,
    /// Width in pixels.
    #[arg(long, default_value_t = 416)]
    width: usize,
    /// Height in pixels.
    #[arg(long, default_value_t = 240)]
    height: usize,
    /// Playback rate the deadlines assume.
    #[arg(long, default_value_t = 16.0)]
    fps: f64,
    /// Output folder (summary.json).
    #[arg(long, default_value = "bench-serve")]
    out: std::path::PathBuf,
    /// First, one client starts a session and hangs up this many seconds after its
    /// video.start (mid-chunk); the measured clients start right after.
    #[arg(long)]
    hang_up_after: Option<f64>,
    /// Sizes the sessions draw from, comma-separated WxH (a fixed draw per session);
    /// default: every session at --width × --height.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<String>,
    /// Share of sessions whose client hangs up before its first chunk or after one of
    /// them (drawn per session; a soak: they are counted, not timed).
    #[arg(long, default_value_t = 0.0)]
    hang_up_share: f64,
}

#[derive(Debug, Args)]
struct SessionArgs {
    #[command(flatten)]
    shape: SessionShape,
    /// Reclaim policies to compare, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "never,before-decode,bounded,fit,always"
    )]
    policies: Vec<String>,
    /// Allocators to compare, comma-separated: planned (the default, as for generate,
    /// serve and plan), pytorch, expandable.
    #[arg(long, value_delimiter = ',', default_value = "planned")]
    allocator: Vec<String>,
    /// PyTorch's max_split_size (B, KiB, MiB, GiB; > 20 MiB): blocks this large are never
    /// split. Unlimited by default, as in PyTorch.
    #[arg(long)]
    max_split_size: Option<String>,
    /// Sequential sessions per run.
    #[arg(long, default_value_t = 3)]
    sessions: usize,
    /// Unrecorded runs per policy first.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Recorded runs per policy.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Sampling period in milliseconds.
    #[arg(long, default_value_t = 20)]
    sample_ms: u64,
    /// Output folder (samples.csv, summary.json, summary.md).
    #[arg(long, default_value = "bench-session")]
    out: std::path::PathBuf,
    #[command(flatten)]
    decoders: crate::session_args::DecoderArgs,
    #[command(flatten)]
    ranks: crate::ranks::RankArgs,
}

#[derive(Debug, Args)]
struct VaeArgs {
    /// VAE config: wan2.1 (the real one, seeded weights) or tiny.
    #[arg(long, default_value = "wan2.1")]
    config: String,
    /// Video height in pixels.
    #[arg(long, default_value_t = 128)]
    height: usize,
    /// Video width in pixels.
    #[arg(long, default_value_t = 128)]
    width: usize,
    /// Latent frames to decode, one chunk each.
    #[arg(long, default_value_t = 4)]
    frames: usize,
    /// full (the streaming decode of --config, per latent frame) or both: the model's
    /// full VAE against a TAEHV tiny decoder, a block (3 latent frames) at a time, with
    /// --model, --tiny-decoder, --dtype, --reps and --reference.
    #[arg(long, default_value = "full")]
    decoder: String,
    /// With --decoder both: wan2.1 (the real VAE config, seeded), world, or a model
    /// folder (its vae/ and tiny_decoder.safetensors).
    #[arg(long, default_value = "wan2.1")]
    model: String,
    /// With --decoder both: a TAEHV file (default: the model folder's, else seeded
    /// weights of taew2_1's or taew2_2's shapes).
    #[arg(long)]
    tiny_decoder: Option<std::path::PathBuf>,
    /// With --decoder both: weights and compute dtype of both decoders.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: crate::dtype_arg::DtypeArg,
    /// With --decoder both: timed fresh streams per decoder; the best counts.
    #[arg(long, default_value_t = 2)]
    reps: usize,
    /// With --decoder both: taehv.py timed on the same shapes in the same run, e.g.
    /// "python tools/bench_taehv.py --taehv /path/to/taehv.py".
    #[arg(long)]
    reference: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct KernelsArgs {
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
    /// headroom's allocator: pytorch, expandable or planned.
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
        BenchCommand::Kernels(args) => kernels(args),
        BenchCommand::Vae(args) => vae(args),
        BenchCommand::Models(args) => models(args),
        BenchCommand::Session(args) => session(args),
        BenchCommand::Serve(args) => serve(args),
        BenchCommand::Batch(args) => batch(args),
    }
}

#[derive(Debug, Args)]
struct BatchArgs {
    /// Built-in model (world, tiny, small, …) or a model folder.
    #[arg(long, default_value = "world")]
    model: String,
    /// Sessions at once, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    concurrency: Vec<usize>,
    /// Video width (multiple of 16).
    #[arg(long, default_value_t = 128)]
    width: usize,
    /// Video height (multiple of 16).
    #[arg(long, default_value_t = 96)]
    height: usize,
    /// Frames per session (12·K − 3).
    #[arg(long, default_value_t = 33)]
    frames: usize,
    /// Allocator: planned, pytorch or expandable.
    #[arg(long, default_value = "pytorch")]
    allocator: String,
    #[command(flatten)]
    decoders: crate::session_args::DecoderArgs,
    /// Print the rows as JSON.
    #[arg(long)]
    json: bool,
}

fn batch(args: BatchArgs) -> Result<()> {
    let policy: AllocatorPolicy = args.allocator.parse()?;
    let config = headroom_bench::BatchBenchConfig {
        engine: args.decoders.apply(headroom_engine::EngineConfig {
            model: crate::builtin_world::resolve(&args.model)?,
            allocator: headroom_mem::AllocatorConfig::with_policy(policy),
            reclaim: headroom_mem::ReclaimPolicy::BeforeDecode,
            ..headroom_engine::EngineConfig::default()
        }),
        width: args.width,
        height: args.height,
        frames: args.frames,
        concurrency: args.concurrency.clone(),
    };
    let rows = headroom_bench::run_batch_bench(&config)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "# bench batch: {} ({} decoder) at {}x{}, {} frames per session, {} allocator, {} threads, {}\n",
        args.model,
        args.decoders.decoder,
        args.width,
        args.height,
        args.frames,
        args.allocator,
        headroom_tensor::parallel::num_threads(),
        headroom_tensor::kernels::cpu::model_name(),
    );
    print!("{}", headroom_bench::batch::markdown(&rows));
    Ok(())
}

fn serve(args: ServeArgs) -> Result<()> {
    if let [one] = args.concurrency[..] {
        serve_one(&args, one, args.out.clone())?;
        return Ok(());
    }
    let mut rows = Vec::new();
    for &c in &args.concurrency {
        rows.push(serve_one(&args, c, args.out.join(format!("c{c}")))?);
        println!();
    }
    let one = rows.first().map_or(0.0, |r| r.aggregate_fps);
    println!("# bench serve: by concurrency (aggregate over the first row's)\n");
    println!("| concurrency | aggregate fps | × first | TTFC p50 s | interval p50 / p95 s | deadline attainment | reserved / allocated max | reserved after |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.2} | {:.2}× | {:.2} | {:.2} / {:.2} | {:.1} % | {:.3} | {} |",
            r.concurrency,
            r.aggregate_fps,
            if one > 0.0 {
                r.aggregate_fps / one
            } else {
                0.0
            },
            r.ttfc_p50_s,
            r.interval_p50_s,
            r.interval_p95_s,
            100.0 * r.deadline_attainment,
            r.memory.reserved_over_allocated_max,
            format_bytes(r.memory.reserved_after_bytes.max(0) as u64),
        );
    }
    Ok(())
}

/// One `bench serve` run at `concurrency` clients, printed; its summary.
fn serve_one(
    args: &ServeArgs,
    concurrency: usize,
    out: std::path::PathBuf,
) -> Result<headroom_bench::serve::ServeBenchSummary> {
    let config = headroom_bench::serve::ServeBenchConfig {
        url: args.url.clone(),
        sessions: args.sessions,
        concurrency,
        frames: args.frames,
        width: args.width,
        height: args.height,
        fps: args.fps,
        out,
        hang_up_after_s: args.hang_up_after,
        sizes: args
            .sizes
            .iter()
            .map(|s| parse_wxh(s))
            .collect::<Result<Vec<_>>>()?,
        hang_up_share: args.hang_up_share,
    };
    let s = headroom_bench::serve::run_serve_bench(&config)?;
    println!(
        "# bench serve: {} clients, concurrency {}, {} frames at {}, target {} fps{}\n",
        s.clients,
        s.concurrency,
        s.frames,
        if config.sizes.is_empty() {
            format!("{}x{}", config.width, config.height)
        } else {
            config
                .sizes
                .iter()
                .map(|(w, h)| format!("{w}x{h}"))
                .collect::<Vec<_>>()
                .join(" or ")
        },
        s.fps,
        s.hang_up_after_s
            .map(|t| format!(", after a client hung up {t} s into its session"))
            .unwrap_or_default()
    );
    println!("| served | queued | queue wait p50 / p95 / max s | TTFC p50 / p95 s | interval mean / p50 / p95 / p99 / max s | real-time factor | deadline attainment |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} / {}{} | {} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} / {:.2} / {:.2} / {:.2} | {:.3} | {:.1} % |",
        s.sessions,
        s.clients,
        if s.all_served { " (all)" } else { "" },
        s.queued,
        s.queue_wait_p50_s,
        s.queue_wait_p95_s,
        s.queue_wait_max_s,
        s.ttfc_p50_s,
        s.ttfc_p95_s,
        s.interval_mean_s,
        s.interval_p50_s,
        s.interval_p95_s,
        s.interval_p99_s,
        s.interval_max_s,
        s.realtime_factor,
        100.0 * s.deadline_attainment
    );
    println!(
        "\naggregate {:.2} fps over {:.1} s; server memory over {} samples: reserved / allocated at most {:.3}, reserved at most {}; after the run {} reserved, {} allocated, {} resident (weights + KV pool + prompt cache)",
        s.aggregate_fps,
        s.wall_s,
        s.memory.samples,
        s.memory.reserved_over_allocated_max,
        format_bytes(s.memory.reserved_max_bytes.max(0) as u64),
        format_bytes(s.memory.reserved_after_bytes.max(0) as u64),
        format_bytes(s.memory.allocated_after_bytes.max(0) as u64),
        format_bytes(s.memory.resident_after_bytes.max(0) as u64),
    );
    println!(
        "{} hung up as drawn; during the run the server refused {} and ran out of memory {} times",
        s.hung_up, s.memory.refused, s.memory.ooms
    );
    if s.clients > 1 || s.hang_up_after_s.is_some() {
        println!("\n| client | queue wait s | video.start s | TTFC s | interval p50 / max s |");
        println!("|---|---|---|---|");
        for (i, c) in s.per_session.iter().enumerate() {
            let mut sorted = c.intervals_s.clone();
            sorted.sort_by(f64::total_cmp);
            let p50 = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
            let max = sorted.last().copied().unwrap_or(0.0);
            println!(
                "| {i} | {:.2} | {:.2} | {:.2} | {p50:.2} / {max:.2} |",
                c.queue_wait_s, c.start_s, c.ttfc_s
            );
        }
    }
    for u in &s.unserved {
        println!("client {} not served: {}", u.client, u.error);
    }
    println!("\nsummary.json in {}", config.out.display());
    if !s.all_served {
        anyhow::bail!(
            "{} of {} clients were not served",
            s.unserved.len(),
            s.clients
        );
    }
    Ok(s)
}

/// `WxH` as `(width, height)`.
fn parse_wxh(s: &str) -> Result<(usize, usize)> {
    let parsed = s
        .split_once(['x', 'X'])
        .and_then(|(w, h)| Some((w.trim().parse().ok()?, h.trim().parse().ok()?)));
    parsed.ok_or_else(|| anyhow::anyhow!("--sizes: {s:?} is not WxH (e.g. 128x96)"))
}

fn session(args: SessionArgs) -> Result<()> {
    args.shape.device.require_host("bench session")?;
    let policies = args
        .policies
        .iter()
        .map(|p| p.parse::<headroom_mem::ReclaimPolicy>())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let model = args.shape.resolved_model("small")?;
    let (width, height) = args.shape.size(&model);
    crate::session_args::require_end(
        "bench session times a session with an end; it",
        args.shape.frames,
    )?;
    let config = SessionBenchConfig {
        model,
        policies,
        allocators: args
            .allocator
            .iter()
            .map(|a| a.parse::<headroom_mem::AllocatorPolicy>())
            .collect::<std::result::Result<Vec<_>, _>>()?,
        max_split_size: args
            .max_split_size
            .as_deref()
            .map(headroom_mem::parse_size)
            .transpose()?,
        sessions: args.sessions,
        warmup: args.warmup,
        reps: args.reps,
        sample_ms: args.sample_ms,
        out: args.out.clone(),
        frames: args.shape.frames,
        width,
        height,
        seed: args.shape.seed,
        capacity: args.shape.capacity_bytes()?,
        dtype: args.shape.dtype.dtype(),
        decoder: args.decoders.decoder,
        tiny_decoder: args.decoders.tiny_decoder.clone(),
        groups: None,
    };
    let summary = if args.ranks.is_single()? {
        run_session_bench(&config)?
    } else {
        headroom_engine::validate::check_mesh(
            &headroom_engine::EngineConfig {
                model: config.model.clone(),
                ..headroom_engine::EngineConfig::default()
            },
            args.ranks.mesh()?,
        )?;
        let summary = args.ranks.launch(None, |groups, _| {
            let config = SessionBenchConfig {
                groups: Some(groups),
                ..config.clone()
            };
            Ok(run_session_bench(&config)?)
        })?;
        match summary {
            Some(s) => s,
            None => return Ok(()),
        }
    };
    print!("{}", headroom_bench::session::markdown(&summary));
    println!(
        "
raw samples, summary.json and summary.md in {}",
        args.out.display()
    );
    Ok(())
}

fn vae(args: VaeArgs) -> Result<()> {
    match args.decoder.as_str() {
        "full" => {}
        "both" => return decoders(args),
        other => anyhow::bail!("--decoder {other:?}: use full or both"),
    }
    let report = run_vae_bench(&VaeBenchConfig {
        config: args.config,
        height: args.height,
        width: args.width,
        latent_frames: args.frames,
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "VAE {} at {}x{}: {} latent frames → {} frames ({} kernel threads)",
        report.config,
        report.width,
        report.height,
        report.latent_frames,
        report.frames,
        headroom_tensor::parallel::num_threads()
    );
    println!("first latent frame   {:>10.1} ms", report.first_frame_ms);
    println!(
        "later latent frames  {:>10.1} ms each",
        report.later_frame_ms
    );
    println!(
        "allocated peak       {:>10}",
        format_bytes(report.allocated_peak_bytes)
    );
    println!(
        "reserved peak        {:>10}",
        format_bytes(report.reserved_peak_bytes)
    );
    println!(
        "decoder state        {:>10} (declared by the config: {})",
        format_bytes(report.state_bytes),
        format_bytes(report.declared_state_bytes)
    );
    Ok(())
}

/// `bench vae --decoder both`: full against tiny on one block.
fn decoders(args: VaeArgs) -> Result<()> {
    let report = headroom_bench::run_decoder_bench(&headroom_bench::DecoderBenchConfig {
        model: if args.model == "wan2.1" {
            args.model.clone()
        } else {
            crate::builtin_world::resolve(&args.model)?
        },
        tiny_decoder: args.tiny_decoder.clone(),
        height: args.height,
        width: args.width,
        dtype: args.dtype.dtype(),
        reps: args.reps,
        reference: args.reference.clone(),
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "# bench vae --decoder both: {} at {}x{}, {}, one block = 3 latent frames, best of {}, {} threads, {}\n",
        args.model, report.width, report.height, report.dtype, args.reps, report.threads, report.cpu
    );
    println!("| decoder | first block ms (9 frames) | later block ms (12 frames) | state MiB | allocated peak MiB |");
    println!("|---|---|---|---|---|");
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    for r in &report.rows {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r.decoder,
            r.first_block_ms,
            r.later_block_ms,
            mib(r.state_bytes),
            mib(r.allocated_peak_bytes)
        );
    }
    if let Some(ms) = report.reference_first_block_ms {
        println!("| taehv.py (PyTorch) | {ms:.1} | — | — | — |");
    }
    println!(
        "\nfull / tiny: {:.1}× the time of a first block, {:.1}× a later one; state {:.0}× smaller",
        report.full_over_tiny,
        report.rows[0].later_block_ms / report.rows[1].later_block_ms,
        report.rows[0].state_bytes as f64 / report.rows[1].state_bytes.max(1) as f64
    );
    if let Some(r) = report.reference_over_tiny {
        println!("taehv.py / tiny: {r:.2}× the time of a first block");
    }
    Ok(())
}

fn kernels(args: KernelsArgs) -> Result<()> {
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
        Some(device) => headroom_bench::kernels::run_kernel_bench_on(device, &config)?,
        None => run_kernel_bench(&config)?,
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "cpu": headroom_tensor::kernels::cpu::model_name(), "threads": headroom_tensor::parallel::num_threads(), "kernels": rows })
        );
        return Ok(());
    }
    println!(
        "{}: best of {} runs each, {} kernel threads; peak = the path's bare arithmetic loop on every thread (bf16: the tiles' or vdpbf16ps' own; near-f32: a third of it); gemm crate = one bare f32 gemm call of the FLOP-equivalent shape",
        headroom_tensor::kernels::cpu::model_name(),
        config.reps,
        headroom_tensor::parallel::num_threads()
    );
    if let Some(device) = &gpu {
        let name = device.launcher().map(|l| l.describe()).unwrap_or_default();
        println!("on {name}: the reference column is one bf16 cuBLASLt GEMM of the FLOP-equivalent shape");
    }
    println!(
        "{:<40}{:>8}{:>10}{:>10}{:>10}{:>8}{:>11}{:>14}",
        "kernel", "path", "compute", "GFLOP/s", "peak", "% peak", "gemm crate", "scratch peak"
    );
    for row in rows {
        let peak = row
            .peak_gflops
            .map_or("—".to_string(), |p| format!("{p:.0}"));
        let frac = row
            .fraction_of_peak
            .map_or("—".to_string(), |f| format!("{:.0}%", 100.0 * f));
        println!(
            "{:<40}{:>8}{:>10}{:>10.1}{:>10}{:>8}{:>11.1}{:>14}",
            row.name,
            row.path,
            row.compute,
            row.gflops,
            peak,
            frac,
            row.reference_gflops,
            format_bytes(row.scratch_peak_bytes)
        );
    }
    Ok(())
}

fn models(args: ModelsArgs) -> Result<()> {
    let config = headroom_bench::ModelBenchConfig {
        model: args.model,
        modes: args.modes,
        reps: args.reps,
        width: args.width,
        height: args.height,
        reference: args.reference,
        works: args.works,
        profile: args.profile,
    };
    let rows = headroom_bench::run_model_bench(&config)?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "cpu": headroom_tensor::kernels::cpu::model_name(), "threads": headroom_tensor::parallel::num_threads(), "path": headroom_tensor::kernels::cpu::selected().name(), "rows": rows })
        );
        return Ok(());
    }
    println!(
        "{}: one AR block: 3 latent frames at {}x{}, 512 text tokens; best of {} after a warm-up; {} kernel threads, path {}",
        headroom_tensor::kernels::cpu::model_name(),
        config.width,
        config.height,
        config.reps,
        headroom_tensor::parallel::num_threads(),
        headroom_tensor::kernels::cpu::selected()
    );
    print!("{}", headroom_bench::models::markdown(&rows));
    Ok(())
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
