//! `headroom serve`: the realtime streaming server (vLLM-Omni's `WS /v1/realtime/video`),
//! its web viewer, health, readiness and metrics, until SIGTERM or Ctrl-C. The flags are
//! in [`args`]; this file builds the engine and the server, alone or on a mesh.

mod args;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use headroom_engine::{replicated, Engine, EngineConfig, Placement, RankGroups};
use headroom_mem::parse_size;
use headroom_server::{Defaults, DoorConfig, Limits, Server, ServerConfig};

pub use args::ServeArgs;

fn seconds(value: f64, flag: &str) -> Result<Duration> {
    if !(value.is_finite() && value > 0.0) {
        bail!("--{flag} must be a positive number of seconds, got {value}");
    }
    Ok(Duration::from_secs_f64(value))
}

/// `--flag S` where 0 is allowed (it turns something off or makes it immediate).
fn seconds_or_zero(value: f64, flag: &str) -> Result<Duration> {
    if value == 0.0 {
        return Ok(Duration::ZERO);
    }
    seconds(value, flag)
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
    if args.max_sessions == 0 {
        bail!("--max-sessions must be at least 1");
    }
    if args.max_batch == Some(0) {
        bail!("--max-batch must be at least 1");
    }
    if args.max_session_frames.is_some_and(|m| m < 9) {
        bail!("--max-session-frames must be at least 9 (a session's first chunk)");
    }
    let engine = args.engine.config(crate::builtin_world::WORLD)?;
    let (width, height) = crate::session_args::video_size(args.width, args.height, &engine.model);
    let model_name = args.engine.model.name(crate::builtin_world::WORLD);
    let config = ServerConfig {
        model_name: model_name.to_string(),
        max_sessions: args.max_sessions,
        max_queue: args.max_queue,
        batch_steps: args.batch_steps,
        max_batch: args.max_batch,
        scheduler: match args.scheduler {
            args::SchedulerArg::Deadline => headroom_server::Scheduler::Deadline,
            args::SchedulerArg::Arrival => headroom_server::Scheduler::Arrival,
        },
        queue_timeout: seconds(args.queue_timeout, "queue-timeout")?,
        ready_when_queueing: args.ready_when_queueing,
        drain_timeout: seconds_or_zero(args.drain_timeout, "drain-timeout")?,
        resume_window: seconds(args.resume_window, "resume-window")?,
        session_store: args.session_store.clone(),
        snapshot_every: args.snapshot_every.map(|n| n as usize),
        max_parked_bytes: args
            .max_parked_bytes
            .as_deref()
            .map(|v| parse_size(v).context("--max-parked-bytes"))
            .transpose()?,
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
            pacing: headroom_server::pacer::Pacing {
                enabled: args.pace,
                lead: seconds_or_zero(args.pacing_lead, "pacing-lead")?,
                max_lag: seconds(args.pacing_max_lag, "pacing-max-lag")?,
            },
            ..Defaults::default()
        },
        door: DoorConfig {
            api_keys: api_keys(&args.api_keys),
            allowed_origins: args.allowed_origins.clone(),
            max_connections: args.max_connections,
        },
        ..ServerConfig::default()
    };
    // Who may come in is checked before any weights load.
    config
        .door
        .validate()
        .context("--api-key / --max-connections")?;
    if !config.door.api_keys.is_empty() {
        eprintln!(
            "headroom serve: {} API key(s); every route but /, /health and /ready needs one",
            config.door.api_keys.len()
        );
    }
    if !args.ranks.is_single()? {
        return serve_mesh(&args, engine, config);
    }
    eprintln!("headroom serve: loading model {model_name}");
    let server = match args.engine.model.device.engine_device(
        &engine.allocator,
        engine.reclaim,
        engine.capacity,
    )? {
        Some(device) => {
            let engine = EngineConfig {
                max_sessions: config.max_sessions,
                ..engine
            };
            let loaded = Engine::load(engine, Placement::device(device))
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
    let device = args.engine.model.device;
    let on_gpu = device != crate::device_arg::DeviceArg::Cpu;
    let gpu = |local: usize| device.rank_gpu(local, &engine);
    let gpu: crate::ranks::GpuFor<'_> = &gpu;
    let load = |groups: &RankGroups, device: Option<headroom_tensor::Device>| {
        let device = match device {
            Some(device) => device,
            None => headroom_tensor::Device::new(engine.cpu_platform()?),
        };
        Engine::load(engine.clone(), Placement::rank(device, groups))
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
            args.engine.model.name(crate::builtin_world::WORLD),
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

/// The API keys of `--api-key` (as given: an empty one is refused, not ignored) and of
/// `HEADROOM_API_KEY` (comma-separated, blanks dropped).
fn api_keys(flags: &[String]) -> Vec<String> {
    flags.iter().cloned().chain(env_api_keys()).collect()
}

/// The keys of `HEADROOM_API_KEY` (comma-separated, blanks dropped): what `serve` takes
/// and `bench serve` sends.
pub fn env_api_keys() -> Vec<String> {
    let from_env = std::env::var("HEADROOM_API_KEY").unwrap_or_default();
    from_env
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect()
}
