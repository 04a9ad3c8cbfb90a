//! `headroom serve`: the realtime streaming server (vLLM-Omni's `WS /v1/realtime/video`),
//! its web viewer, health, readiness and metrics, until SIGTERM or Ctrl-C.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use std::sync::Arc;

use headroom_engine::{replicated, Engine, EngineConfig, RankGroups};
use headroom_mem::{parse_size, AllocatorConfig, AllocatorPolicy, ReclaimPolicy};
use headroom_server::{Defaults, Limits, Server, ServerConfig};

/// Arguments of `headroom serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Built-in model (world, tiny, small, …), a diffusers pipeline folder with
    /// transformer/ and vae/, or an original Wan repo folder.
    #[arg(long, default_value = "world")]
    model: String,
    #[command(flatten)]
    decoders: crate::session_args::DecoderArgs,
    /// What the model's weights are held and computed in.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: crate::dtype_arg::DtypeArg,
    /// A transformer checkpoint over --model (Self-Forcing .pt, LingBot-World folder, …).
    #[arg(long)]
    transformer: Option<String>,
    /// The --transformer checkpoint's config.json (diffusers or original keys), for a
    /// checkpoint that carries none and whose shapes do not settle it.
    #[arg(long, requires = "transformer")]
    config: Option<std::path::PathBuf>,
    /// Reclaim policy: never, before-decode, bounded[:…], fit[:slack=F], always.
    #[arg(long, default_value = "before-decode")]
    policy: String,
    /// Allocator: planned (default: sessions replay a plan at the live peak), pytorch or
    /// expandable.
    #[arg(long, default_value = "planned")]
    allocator: String,
    /// Sessions generating at once, at most.
    #[arg(long, default_value_t = 1)]
    max_sessions: usize,
    /// Step the sessions generating at once together (one batched forward per DMD step,
    /// batched VAE work; every stream the same bytes): true or false.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    batch_steps: bool,
    /// Most sessions in one batched step (default: every session ready); beyond it the
    /// chunks due soonest on their playback clocks go first.
    #[arg(long)]
    max_batch: Option<usize>,
    /// Clients that may wait for a slot at once, first come first served (0: refuse at
    /// once when full).
    #[arg(long, default_value_t = 16)]
    max_queue: usize,
    /// Seconds a client may wait in the queue before it is refused with `capacity`.
    #[arg(long, default_value_t = 120.0)]
    queue_timeout: f64,
    /// KV page budget, taken at the first open: bytes (B, KiB, MiB, GiB), a fraction of
    /// the device capacity (--capacity, else physical memory; e.g. 0.05), or `auto`
    /// (exactly --max-sessions sessions of the first session's size, rebuilt while idle
    /// for a larger one). Pages hold 16 tokens, so every size shares them.
    #[arg(long, default_value = "auto")]
    kv_budget: String,
    /// Device capacity (B, KiB, MiB, GiB) to emulate a memory-tight device; physical
    /// memory by default.
    #[arg(long)]
    capacity: Option<String>,
    /// Largest session.start message (it may carry a data: image).
    #[arg(long, default_value = "4MiB")]
    max_start_message: String,
    /// Largest message after session.start.
    #[arg(long, default_value = "128KiB")]
    max_control_message: String,
    /// Seconds a new socket may take to send session.start.
    #[arg(long, default_value_t = 10.0)]
    start_timeout: f64,
    /// Seconds a session may go without progress (a chunk or a ping) before it ends.
    #[arg(long, default_value_t = 60.0)]
    stall_timeout: f64,
    /// Default width of a session.start that gives none (multiple of 16); default: the
    /// model's own size (its first_frame.png), else 416.
    #[arg(long)]
    width: Option<usize>,
    /// Default height of a session.start that gives none (multiple of 16); default: the
    /// model's own size, else 240.
    #[arg(long)]
    height: Option<usize>,
    /// Default frames of a session.start that gives none (12·K − 3), or 0: such a
    /// session streams until the client stops it.
    #[arg(long, default_value_t = 0)]
    frames: usize,
    /// Most frames one session may stream (default: unlimited): a session streamed
    /// until stopped ends after the last chunk within it, a longer num_frames is refused.
    #[arg(long)]
    max_session_frames: Option<usize>,
    /// Where the engine runs: cpu, cuda[:N] (on a mesh, rank r of a node takes
    /// cuda:N+r and the collectives run on NCCL) or cuda-check (the GPU path without a
    /// GPU: launches checked, frames black).
    #[arg(long, default_value = "cpu")]
    device: crate::device_arg::DeviceArg,
    /// A folder that keeps the planned allocator's plans across restarts (a corrupt or
    /// stale file is rebuilt).
    #[arg(long)]
    plan_cache: Option<std::path::PathBuf>,
    #[command(flatten)]
    ranks: crate::ranks::RankArgs,
}

fn seconds(value: f64, flag: &str) -> Result<Duration> {
    if !(value.is_finite() && value > 0.0) {
        bail!("--{flag} must be a positive number of seconds, got {value}");
    }
    Ok(Duration::from_secs_f64(value))
}

fn size(value: &str, flag: &str) -> Result<usize> {
    let bytes = parse_size(value).with_context(|| format!("--{flag}"))?;
    usize::try_from(bytes).with_context(|| format!("--{flag} {value} does not fit this machine"))
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    eprintln!("headroom serve: shutting down (open sessions end with session.done stopped=true)");
}

/// Runs `headroom serve`.
pub fn run(args: ServeArgs) -> Result<()> {
    let reclaim: ReclaimPolicy = args.policy.parse()?;
    let policy: AllocatorPolicy = args.allocator.parse()?;
    let capacity = args
        .capacity
        .as_deref()
        .map(parse_size)
        .transpose()
        .context("--capacity")?;
    if args.max_sessions == 0 {
        bail!("--max-sessions must be at least 1");
    }
    if args.max_batch == Some(0) {
        bail!("--max-batch must be at least 1");
    }
    if args.max_session_frames.is_some_and(|m| m < 9) {
        bail!("--max-session-frames must be at least 9 (a session's first chunk)");
    }
    let model = crate::builtin_world::resolve(&args.model)?;
    let (width, height) = crate::session_args::video_size(args.width, args.height, &model);
    let engine = args.decoders.apply(EngineConfig {
        model,
        transformer: args.transformer.clone(),
        transformer_config: args.config.clone(),
        allocator: AllocatorConfig::with_policy(policy),
        reclaim,
        kv_budget_bytes: crate::session_args::kv_budget(&args.kv_budget, capacity)?,
        capacity,
        weight_dtype: args.dtype.dtype(),
        plan_cache: args.plan_cache.clone(),
        ..EngineConfig::default()
    });
    let config = ServerConfig {
        model_name: args.model.clone(),
        max_sessions: args.max_sessions,
        max_queue: args.max_queue,
        batch_steps: args.batch_steps,
        max_batch: args.max_batch,
        queue_timeout: seconds(args.queue_timeout, "queue-timeout")?,
        limits: Limits {
            start_message_bytes: size(&args.max_start_message, "max-start-message")?,
            control_message_bytes: size(&args.max_control_message, "max-control-message")?,
            start_timeout: seconds(args.start_timeout, "start-timeout")?,
            stall_timeout: seconds(args.stall_timeout, "stall-timeout")?,
            max_session_frames: args.max_session_frames,
            ..Limits::default()
        },
        defaults: Defaults {
            width,
            height,
            num_frames: args.frames,
            ..Defaults::default()
        },
        ..ServerConfig::default()
    };
    if !args.ranks.is_single()? {
        return serve_mesh(&args, engine, config);
    }
    eprintln!("headroom serve: loading model {}", args.model);
    let server = match args
        .device
        .engine_device(&engine.allocator, reclaim, capacity)?
    {
        Some(device) => {
            let engine = EngineConfig {
                max_sessions: config.max_sessions,
                ..engine
            };
            let loaded = Engine::on_device(engine, device)
                .context("cannot load the engine on the device")?;
            Server::with_engine(loaded, None, config)?
        }
        None => Server::new(engine, config)?,
    };
    serve(&args, server)
}

/// `serve --tp T --sp S`: rank 0 serves and leads every session, the other ranks follow.
fn serve_mesh(args: &ServeArgs, mut engine: EngineConfig, config: ServerConfig) -> Result<()> {
    if args.max_sessions != 1 {
        bail!("--max-sessions {}: a sharded server runs one session at a time (every rank follows one schedule)", args.max_sessions);
    }
    let mesh = args.ranks.mesh()?;
    headroom_engine::validate::check_mesh(&engine, mesh)?;
    engine.max_sessions = 1;
    let on_gpu = args.device != crate::device_arg::DeviceArg::Cpu;
    let gpu = |local: usize| args.device.rank_gpu(local, &engine);
    let gpu: crate::ranks::GpuFor<'_> = &gpu;
    let load = |groups: &RankGroups, device: Option<headroom_tensor::Device>| match device {
        Some(device) => Engine::on_mesh_device(engine.clone(), device, groups),
        None => Engine::on_mesh(engine.clone(), engine.cpu_platform()?, groups),
    };
    args.ranks.launch(on_gpu.then_some(gpu), |groups, device| {
        if groups.rank() != 0 {
            if groups.backend() == "mpi" {
                // mpirun forwards SIGTERM and Ctrl-C to every rank: rank 0 shuts the
                // server down and then tells the followers, who must not die first.
                ignore_stop_signals();
            }
            let engine = load(&groups, device)?;
            replicated::follow(&engine, &groups.world)?;
            return Ok(());
        }
        eprintln!(
            "headroom serve: loading model {} on {} ranks (tp {} × sp {}, {})",
            args.model,
            mesh.ranks(),
            mesh.tp,
            mesh.sp,
            groups.backend()
        );
        let loaded = load(&groups, device)?;
        let server = Server::with_engine(loaded, Some(Arc::clone(&groups.world)), config.clone())?;
        let served = serve(args, server);
        let shutdown = replicated::lead_shutdown(&groups.world);
        served?;
        Ok(shutdown?)
    })?;
    Ok(())
}

/// Ignores SIGTERM and SIGINT in this process.
fn ignore_stop_signals() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: installing SIG_IGN for a signal has no preconditions; it runs before
        // any other thread of this follower handles signals.
        unsafe {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
}

/// Serves `server` until SIGTERM or Ctrl-C.
fn serve(args: &ServeArgs, server: Server) -> Result<()> {
    // The runtime only moves bytes; generation runs on each session's own thread.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("headroom-io")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        eprintln!("headroom serve: listening on http://{addr} (viewer at /, WebSocket at ws://{addr}/v1/realtime/video)");
        server.serve(listener, shutdown_signal()).await?;
        eprintln!("headroom serve: stopped");
        Ok(())
    })
}
