//! `headroom bench door`: a real client's time to first chunk on an idle server and with
//! many idle sockets open (sockets that never send `session.start`), side by side in one
//! run, with the resident memory those sockets add. The server runs in this process on
//! the `tiny` model (or `--model`); the idle sockets are bare upgraded TCP streams that
//! hold no buffers here, so the memory read is the server's.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use futures_util::{SinkExt, StreamExt};
use headroom_engine::EngineConfig;
use headroom_server::{DoorConfig, Server, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

/// Arguments of `headroom bench door`.
#[derive(Debug, Args)]
pub struct DoorArgs {
    /// Built-in model or model folder the server loads.
    #[arg(long, default_value = "tiny")]
    model: String,
    /// Idle sockets opened before the measured session.
    #[arg(long, default_value_t = 500)]
    idle: usize,
    /// Rounds, each one session on the idle server and one beside the idle sockets.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Frames of the measured session (12·K − 3).
    #[arg(long, default_value_t = 9)]
    frames: usize,
    /// Width of the measured session.
    #[arg(long, default_value_t = 48)]
    width: usize,
    /// Height of the measured session.
    #[arg(long, default_value_t = 32)]
    height: usize,
    /// The server's socket cap (default: the server's own, from its slots and queue).
    #[arg(long)]
    max_connections: Option<usize>,
}

/// Runs `headroom bench door`.
pub fn run(args: DoorArgs) -> Result<()> {
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("no async runtime")?;
    runtime.block_on(measure(&args))
}

/// One round's times to first chunk, in seconds.
struct Round {
    idle_server_s: f64,
    beside_idle_s: f64,
}

async fn measure(args: &DoorArgs) -> Result<()> {
    let engine = EngineConfig {
        model: args.model.clone(),
        ..EngineConfig::default()
    };
    let config = ServerConfig {
        model_name: args.model.clone(),
        door: DoorConfig {
            max_connections: args.max_connections,
            ..DoorConfig::default()
        },
        ..ServerConfig::default()
    };
    let cap = config
        .door
        .connection_cap(config.max_sessions, config.max_queue);
    let server = Server::new(engine, config).context("the server did not start")?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.clone().serve(listener, async {
        let _ = stopped.await;
    }));
    // A first session sizes the KV pool and warms the caches.
    first_chunk(addr, args).await?;
    let mut rounds = Vec::with_capacity(args.rounds);
    let mut grown = 0u64;
    for _ in 0..args.rounds {
        let idle_server_s = first_chunk(addr, args).await?;
        settle(&server, 1).await;
        let before = headroom_mem::rss::process_rss_bytes().unwrap_or(0);
        let mut idle = Vec::with_capacity(args.idle);
        for _ in 0..args.idle {
            idle.push(idle_socket(addr).await?);
        }
        settle(&server, cap as u64).await;
        let beside_idle_s = first_chunk(addr, args).await?;
        let after = headroom_mem::rss::process_rss_bytes().unwrap_or(0);
        grown = grown.max(after.saturating_sub(before));
        drop(idle);
        settle(&server, 0).await;
        rounds.push(Round {
            idle_server_s,
            beside_idle_s,
        });
    }
    let _ = stop.send(());
    serving.await??;
    println!(
        "bench door: {} idle sockets (cap {cap}), {}×{} × {} frames on {}, {} rounds",
        args.idle, args.width, args.height, args.frames, args.model, args.rounds
    );
    println!("| round | first chunk, idle server | beside the idle sockets | ratio |");
    println!("|---|---|---|---|");
    let mut ratios = Vec::with_capacity(rounds.len());
    for (i, r) in rounds.iter().enumerate() {
        let ratio = r.beside_idle_s / r.idle_server_s;
        ratios.push(ratio);
        println!(
            "| {i} | {:.3} s | {:.3} s | {ratio:.2}× |",
            r.idle_server_s, r.beside_idle_s
        );
    }
    ratios.sort_by(f64::total_cmp);
    let n = ratios.len();
    let median = (ratios[(n - 1) / 2] + ratios[n / 2]) / 2.0;
    println!(
        "median ratio {median:.2}×; resident memory the idle sockets added (most of any round): {}",
        headroom_mem::format_bytes(grown)
    );
    Ok(())
}

/// Waits until the server holds at most `open` sockets (those it closed are gone).
async fn settle(server: &Server, open: u64) {
    let metrics = server.metrics();
    let deadline = Instant::now() + Duration::from_secs(30);
    while metrics
        .connections_open
        .load(std::sync::atomic::Ordering::Relaxed)
        > open
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A session's time from its `session.start` to its first chunk; it then runs to its end.
async fn first_chunk(addr: SocketAddr, args: &DoorArgs) -> Result<f64> {
    let url = format!("ws://{addr}/v1/realtime/video");
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await?;
    let start = serde_json::json!({"type": "session.start", "num_frames": args.frames,
        "width": args.width, "height": args.height, "seed": 7});
    let sent = Instant::now();
    ws.send(Message::text(start.to_string())).await?;
    let mut first = None;
    while let Some(message) = ws.next().await {
        match message? {
            Message::Binary(_) if first.is_none() => first = Some(sent.elapsed().as_secs_f64()),
            Message::Text(text) if text.as_str().contains("\"session.done\"") => break,
            Message::Text(text) if text.as_str().contains("\"error\"") => {
                bail!("the session failed: {text}")
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    first.context("the session ended before its first chunk")
}

/// A WebSocket upgraded by hand and left silent.
async fn idle_socket(addr: SocketAddr) -> Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "GET /v1/realtime/video HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await?;
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.1 101") {
        bail!(
            "the upgrade was refused: {}",
            String::from_utf8_lossy(&head)
        );
    }
    Ok(stream)
}
