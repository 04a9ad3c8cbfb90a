//! `headroom bench serve`: a realtime-video client that measures a running server the way
//! vLLM-Omni's realtime benchmark does: time to first chunk, inter-chunk intervals, the
//! real-time factor and deadline attainment at a target frame rate, over `sessions`
//! sessions with `concurrency` of them open at a time. With more clients than the server
//! has slots, the extra ones wait in its admission queue: each client's queue wait
//! (`session.start` → `video.start`) is reported, and whether every client was served.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::stats::percentile;
use crate::{BenchError, Result};

/// What to run.
#[derive(Debug, Clone)]
pub struct ServeBenchConfig {
    /// `ws://host:port/v1/realtime/video`.
    pub url: String,
    /// Sessions in all.
    pub sessions: usize,
    /// Sessions open at a time.
    pub concurrency: usize,
    /// Frames per session.
    pub frames: usize,
    /// Width.
    pub width: usize,
    /// Height.
    pub height: usize,
    /// Target playback rate for the deadlines.
    pub fps: f64,
    /// Output folder (`summary.json`).
    pub out: PathBuf,
    /// Before the measured clients, one more client starts a session and hangs up this
    /// many seconds after its `video.start` (mid-chunk); the measured clients start right
    /// after the hang-up, so their TTFC shows what a hang-up costs the next client.
    pub hang_up_after_s: Option<f64>,
    /// Sizes `(width, height)` the sessions draw from (a fixed draw per session number);
    /// empty: every session at `width` × `height`.
    pub sizes: Vec<(usize, usize)>,
    /// Share of sessions whose client hangs up: before its first chunk or after one of
    /// its chunks, drawn per session number (a soak, not a latency measurement: they
    /// count as `hung_up`, not in the timings).
    pub hang_up_share: f64,
    /// The server's API key, sent as `Authorization: Bearer` on the socket and on
    /// `/metrics` (`None`: a server without keys).
    pub api_key: Option<String>,
}

impl ServeBenchConfig {
    /// Session `i`'s size and the chunk its client hangs up after (`Some(0)`: before the
    /// first), from a fixed hash of `i`.
    pub fn draw(&self, i: usize) -> ((usize, usize), Option<usize>) {
        let mut z = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let size = match self.sizes.len() {
            0 => (self.width, self.height),
            n => self.sizes[(z % n as u64) as usize],
        };
        let unit = ((z >> 16) & 0xFFFF) as f64 / 65536.0;
        let chunks = self.frames.div_ceil(12).max(1);
        let hang_up = (unit < self.hang_up_share).then(|| ((z >> 40) as usize) % chunks);
        (size, hang_up)
    }
}

/// The server's allocator as `/metrics` said it through a run and after it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MemorySamples {
    /// Samples taken (every 200 ms while the sessions ran).
    pub samples: usize,
    /// The largest reserved over allocated of any sample.
    pub reserved_over_allocated_max: f64,
    /// The largest reserved bytes of any sample.
    pub reserved_max_bytes: i64,
    /// Allocated bytes once every session had ended.
    pub allocated_after_bytes: i64,
    /// Reserved bytes once every session had ended (the residency a run leaves).
    pub reserved_after_bytes: i64,
    /// What the engine keeps for its life, once every session had ended: weights, KV
    /// pool and prompt cache (`headroom_{weights,kv_pool,prompt_cache}_bytes`).
    pub resident_after_bytes: i64,
    /// Allocations that ran out of memory during the run (`headroom_ooms_total`).
    pub ooms: i64,
    /// Sessions the server refused during the run, for any reason.
    pub refused: i64,
}

/// The `/metrics` text of the server of `config`.
async fn metrics_text(config: &ServeBenchConfig) -> Option<String> {
    metrics_at(&config.url, config.api_key.as_deref()).await
}

/// The `/metrics` text of the server whose realtime endpoint is `url`.
pub(crate) async fn metrics_at(url: &str, api_key: Option<&str>) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("ws://")?;
    let host = rest.split('/').next()?;
    let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
    let key = api_key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\n{key}\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    Some(body)
}

/// The sum of the values of metric `name` (every label set) in `/metrics` text.
pub(crate) fn metric(body: &str, name: &str) -> Option<i64> {
    let values: Vec<f64> = body
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() as i64)
}

/// `headroom_allocated_bytes` and `headroom_reserved_bytes` from the `/metrics` of the
/// server of `config` (`None` when it cannot be read).
async fn sample_memory(config: &ServeBenchConfig) -> Option<(i64, i64)> {
    let body = metrics_text(config).await?;
    Some((
        metric(&body, "headroom_allocated_bytes")?,
        metric(&body, "headroom_reserved_bytes")?,
    ))
}

/// `headroom_ooms_total` and the refusals of every reason, now.
async fn sample_failures(config: &ServeBenchConfig) -> (i64, i64) {
    let body = metrics_text(config).await.unwrap_or_default();
    (
        metric(&body, "headroom_ooms_total").unwrap_or(0),
        metric(&body, "headroom_sessions_refused_total").unwrap_or(0),
    )
}

/// One session as the client saw it.
#[derive(Debug, Clone, Serialize)]
pub struct SessionTiming {
    /// Seconds the server kept the session in its admission queue (its `video.start`'s
    /// `queue_wait_ms`; 0 from a server that does not say).
    pub queue_wait_s: f64,
    /// Seconds from `session.start` to `video.start`: the queue wait plus opening the
    /// session (KV pages, prompt and first-frame encode).
    pub start_s: f64,
    /// Whether the server said `session.queued` before admitting it.
    pub queued: bool,
    /// Seconds from `session.start` to the first chunk's video bytes.
    pub ttfc_s: f64,
    /// Seconds between consecutive chunks' video bytes.
    pub intervals_s: Vec<f64>,
    /// Frames per chunk, in order.
    pub chunk_frames: Vec<usize>,
    /// Seconds from `session.start` to `session.done`.
    pub e2e_s: f64,
    /// Bytes of video received.
    pub bytes: usize,
}

/// A client the server did not serve.
#[derive(Debug, Clone, Serialize)]
pub struct Unserved {
    /// The client's number from 0.
    pub client: usize,
    /// What went wrong (the server's `error`, or the connection's).
    pub error: String,
}

/// The summary written to `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct ServeBenchSummary {
    /// Server address.
    pub url: String,
    /// Clients that ran.
    pub clients: usize,
    /// Sessions completed (served to their last chunk).
    pub sessions: usize,
    /// Sessions whose client hung up as drawn (`hang_up_share`).
    pub hung_up: usize,
    /// Whether every client was served.
    pub all_served: bool,
    /// Clients that waited in the admission queue.
    pub queued: usize,
    /// Median queue wait.
    pub queue_wait_p50_s: f64,
    /// 95th percentile queue wait.
    pub queue_wait_p95_s: f64,
    /// Longest queue wait.
    pub queue_wait_max_s: f64,
    /// Sessions open at a time.
    pub concurrency: usize,
    /// Frames per session.
    pub frames: usize,
    /// Target playback rate.
    pub fps: f64,
    /// Seconds after its `video.start` that a client hung up before the measured ones.
    pub hang_up_after_s: Option<f64>,
    /// Median time to first chunk.
    pub ttfc_p50_s: f64,
    /// 95th percentile time to first chunk.
    pub ttfc_p95_s: f64,
    /// Mean inter-chunk interval.
    pub interval_mean_s: f64,
    /// Median inter-chunk interval.
    pub interval_p50_s: f64,
    /// 95th percentile inter-chunk interval.
    pub interval_p95_s: f64,
    /// 99th percentile inter-chunk interval.
    pub interval_p99_s: f64,
    /// Longest inter-chunk interval.
    pub interval_max_s: f64,
    /// Seconds of video per second of generation after the first chunk (≥ 1 keeps up).
    pub realtime_factor: f64,
    /// Share of chunks that arrived before playback (started at the first chunk, at
    /// `fps`) needed them.
    pub deadline_attainment: f64,
    /// Seconds from the first `session.start` to the last session's end.
    pub wall_s: f64,
    /// Video frames received from every session over `wall_s`.
    pub aggregate_fps: f64,
    /// The server's memory through the run (its `/metrics`).
    pub memory: MemorySamples,
    /// Every served session's timings.
    pub per_session: Vec<SessionTiming>,
    /// Clients that were not served, and why.
    pub unserved: Vec<Unserved>,
}

pub(crate) fn ws_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::InvalidConfig {
        field: "url",
        rule: format!("the realtime session failed: {e}"),
    }
}

/// A socket to the server of `config`, with its API key when it has one.
async fn connect(config: &ServeBenchConfig) -> std::result::Result<Socket, String> {
    connect_to(&config.url, config.api_key.as_deref()).await
}

/// A realtime socket and the server's handshake response.
pub(crate) type Socket = (
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    tokio_tungstenite::tungstenite::handshake::client::Response,
);

/// A socket to `url`, sending `key` as `Authorization: Bearer` when given.
pub(crate) async fn connect_to(
    url: &str,
    key: Option<&str>,
) -> std::result::Result<
    (
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        tokio_tungstenite::tungstenite::handshake::client::Response,
    ),
    String,
> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().map_err(|e| e.to_string())?;
    if let Some(key) = key {
        let value = format!("Bearer {key}")
            .parse()
            .map_err(|_| "the API key is not a valid header value".to_string())?;
        request.headers_mut().insert("authorization", value);
    }
    tokio_tungstenite::connect_async(request)
        .await
        .map_err(|e| e.to_string())
}

/// Runs session `i` and times its chunks (`None`: its client hung up as drawn).
async fn one_session(config: &ServeBenchConfig, i: usize) -> Result<Option<SessionTiming>> {
    let ((width, height), hang_up) = config.draw(i);
    let seed = 42 + i as u64;
    let (mut ws, _) = connect(config).await.map_err(ws_err)?;
    let start = Instant::now();
    let (mut start_s, mut queue_wait_s, mut queued) = (None, 0.0, false);
    let request = json!({"type": "session.start", "format": "m4s", "num_frames": config.frames,
        "width": width, "height": height, "seed": seed, "fps": config.fps});
    ws.send(Message::text(request.to_string()))
        .await
        .map_err(ws_err)?;
    let (mut arrivals, mut chunk_frames, mut bytes) = (Vec::new(), Vec::new(), 0usize);
    while let Some(message) = ws.next().await {
        match message.map_err(ws_err)? {
            Message::Binary(b) => {
                arrivals.push(start.elapsed().as_secs_f64());
                bytes += b.len();
                if hang_up == Some(arrivals.len()) {
                    return Ok(None);
                }
            }
            Message::Text(text) => {
                let v: Value = serde_json::from_str(text.as_str()).map_err(ws_err)?;
                match v["type"].as_str() {
                    Some("session.queued") => queued = true,
                    Some("video.start") => {
                        start_s = Some(start.elapsed().as_secs_f64());
                        queue_wait_s = v["queue_wait_ms"].as_f64().unwrap_or(0.0) / 1e3;
                        if hang_up == Some(0) {
                            return Ok(None);
                        }
                    }
                    Some("video.chunk_metadata") => {
                        chunk_frames.push(v["num_frames"].as_u64().unwrap_or(0) as usize)
                    }
                    Some("session.done") => break,
                    Some("error") => return Err(ws_err(v)),
                    _ => {}
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    let e2e_s = start.elapsed().as_secs_f64();
    let _ = ws.close(None).await;
    let ttfc_s = *arrivals
        .first()
        .ok_or_else(|| ws_err("the session ended before its first chunk"))?;
    Ok(Some(SessionTiming {
        queue_wait_s,
        start_s: start_s.unwrap_or(0.0),
        queued,
        ttfc_s,
        intervals_s: arrivals.windows(2).map(|w| w[1] - w[0]).collect(),
        chunk_frames,
        e2e_s,
        bytes,
    }))
}

/// Starts a session and drops the connection `after_s` seconds after its `video.start`.
async fn hang_up(config: &ServeBenchConfig, after_s: f64) -> Result<()> {
    let (mut ws, _) = connect(config).await.map_err(ws_err)?;
    let request = json!({"type": "session.start", "format": "m4s", "num_frames": config.frames,
        "width": config.width, "height": config.height, "seed": 41, "fps": config.fps});
    ws.send(Message::text(request.to_string()))
        .await
        .map_err(ws_err)?;
    while let Some(message) = ws.next().await {
        if let Message::Text(text) = message.map_err(ws_err)? {
            let v: Value = serde_json::from_str(text.as_str()).map_err(ws_err)?;
            match v["type"].as_str() {
                Some("video.start") => break,
                Some("error") => return Err(ws_err(v)),
                _ => {}
            }
        }
    }
    tokio::time::sleep(std::time::Duration::from_secs_f64(after_s)).await;
    drop(ws);
    Ok(())
}

/// Playback starts when the first chunk arrives; chunk k is due when the frames before it
/// have played at `fps`. Returns (chunks on time, chunks after the first).
fn deadlines(s: &SessionTiming, fps: f64) -> (usize, usize) {
    let mut played = s.chunk_frames.first().copied().unwrap_or(0) as f64;
    let mut arrival = s.ttfc_s;
    let mut on_time = 0;
    for (k, interval) in s.intervals_s.iter().enumerate() {
        arrival += interval;
        let due = s.ttfc_s + played / fps;
        if arrival <= due {
            on_time += 1;
        }
        played += s.chunk_frames.get(k + 1).copied().unwrap_or(0) as f64;
    }
    (on_time, s.intervals_s.len())
}

/// Summarises session timings (`hung_up` sessions ended as drawn).
pub fn summarize(
    config: &ServeBenchConfig,
    per_session: Vec<SessionTiming>,
    unserved: Vec<Unserved>,
    hung_up: usize,
    wall_s: f64,
    memory: MemorySamples,
) -> ServeBenchSummary {
    let frames: usize = per_session
        .iter()
        .map(|s| s.chunk_frames.iter().sum::<usize>())
        .sum();
    let ttfc: Vec<f64> = per_session.iter().map(|s| s.ttfc_s).collect();
    let waits: Vec<f64> = per_session.iter().map(|s| s.queue_wait_s).collect();
    let intervals: Vec<f64> = per_session
        .iter()
        .flat_map(|s| s.intervals_s.iter().copied())
        .collect();
    let (on_time, due) = per_session
        .iter()
        .map(|s| deadlines(s, config.fps))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    // Video seconds produced after the first chunk over the time they took.
    let (video_s, gen_s) = per_session.iter().fold((0.0, 0.0), |acc, s| {
        let later: usize = s.chunk_frames.iter().skip(1).sum();
        (
            acc.0 + later as f64 / config.fps,
            acc.1 + s.intervals_s.iter().sum::<f64>(),
        )
    });
    let p = |v: &[f64], q: f64| percentile(v, q).unwrap_or(0.0);
    ServeBenchSummary {
        url: config.url.clone(),
        clients: per_session.len() + unserved.len() + hung_up,
        sessions: per_session.len(),
        hung_up,
        all_served: unserved.is_empty(),
        queued: per_session.iter().filter(|s| s.queued).count(),
        queue_wait_p50_s: p(&waits, 50.0),
        queue_wait_p95_s: p(&waits, 95.0),
        queue_wait_max_s: waits.iter().copied().fold(0.0, f64::max),
        concurrency: config.concurrency,
        frames: config.frames,
        fps: config.fps,
        hang_up_after_s: config.hang_up_after_s,
        ttfc_p50_s: p(&ttfc, 50.0),
        ttfc_p95_s: p(&ttfc, 95.0),
        interval_mean_s: if intervals.is_empty() {
            0.0
        } else {
            intervals.iter().sum::<f64>() / intervals.len() as f64
        },
        interval_p50_s: p(&intervals, 50.0),
        interval_p95_s: p(&intervals, 95.0),
        interval_p99_s: p(&intervals, 99.0),
        interval_max_s: intervals.iter().copied().fold(0.0, f64::max),
        realtime_factor: if gen_s > 0.0 { video_s / gen_s } else { 0.0 },
        deadline_attainment: if due > 0 {
            on_time as f64 / due as f64
        } else {
            1.0
        },
        wall_s,
        aggregate_fps: if wall_s > 0.0 {
            frames as f64 / wall_s
        } else {
            0.0
        },
        memory,
        per_session,
        unserved,
    }
}

/// Runs the benchmark against a running server and writes `summary.json`.
pub fn run_serve_bench(config: &ServeBenchConfig) -> Result<ServeBenchSummary> {
    if let Some(after) = config.hang_up_after_s {
        if !(after.is_finite() && after >= 0.0) {
            return Err(BenchError::InvalidConfig {
                field: "hang_up_after",
                rule: format!("must be a non-negative number of seconds, got {after}"),
            });
        }
    }
    if !(0.0..=1.0).contains(&config.hang_up_share) {
        return Err(BenchError::InvalidConfig {
            field: "hang_up_share",
            rule: format!("must be in [0, 1], got {}", config.hang_up_share),
        });
    }
    if config.sessions == 0 || config.concurrency == 0 || config.fps.is_nan() || config.fps <= 0.0 {
        return Err(BenchError::InvalidConfig {
            field: "sessions / concurrency / fps",
            rule: "must be positive".to_string(),
        });
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ws_err(format!("no async runtime: {e}")))?;
    let next = Arc::new(AtomicUsize::new(0));
    // Each of `concurrency` clients runs sessions one after another until `sessions` ran;
    // a refused or failed session is recorded, not fatal, so the report says who was
    // not served.
    let outcomes = runtime.block_on(async {
        if let Some(after) = config.hang_up_after_s {
            hang_up(config, after).await?;
        }
        let failures_before = sample_failures(config).await;
        let started = Instant::now();
        let workers = (0..config.concurrency.min(config.sessions)).map(|_| {
            let next = Arc::clone(&next);
            async move {
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= config.sessions {
                        return done;
                    }
                    done.push((i, one_session(config, i).await));
                }
            }
        });
        let running = std::sync::atomic::AtomicBool::new(true);
        let sessions = async {
            let out = futures_util::future::join_all(workers).await;
            running.store(false, Ordering::Relaxed);
            (out, started.elapsed().as_secs_f64())
        };
        let sampler = async {
            let mut memory = MemorySamples::default();
            while running.load(Ordering::Relaxed) {
                if let Some((allocated, reserved)) = sample_memory(config).await {
                    memory.samples += 1;
                    memory.reserved_max_bytes = memory.reserved_max_bytes.max(reserved);
                    if allocated > 0 {
                        let ratio = reserved as f64 / allocated as f64;
                        memory.reserved_over_allocated_max =
                            memory.reserved_over_allocated_max.max(ratio);
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            memory
        };
        let ((outcomes, wall_s), mut memory) = futures_util::future::join(sessions, sampler).await;
        // A session's end is sent after it released what it held.
        if let Some(body) = metrics_text(config).await {
            let m = |name| metric(&body, name).unwrap_or(0);
            memory.allocated_after_bytes = m("headroom_allocated_bytes");
            memory.reserved_after_bytes = m("headroom_reserved_bytes");
            memory.resident_after_bytes = m("headroom_weights_bytes")
                + m("headroom_kv_pool_bytes")
                + m("headroom_prompt_cache_bytes");
        }
        let failures_after = sample_failures(config).await;
        memory.ooms = failures_after.0 - failures_before.0;
        memory.refused = failures_after.1 - failures_before.1;
        Ok::<_, BenchError>((outcomes, wall_s, memory))
    })?;
    let (outcomes, wall_s, memory) = outcomes;
    let mut outcomes: Vec<_> = outcomes.into_iter().flatten().collect();
    outcomes.sort_by_key(|(i, _)| *i);
    let (mut per_session, mut unserved, mut hung_up) = (Vec::new(), Vec::new(), 0);
    for (client, outcome) in outcomes {
        match outcome {
            Ok(Some(timing)) => per_session.push(timing),
            Ok(None) => hung_up += 1,
            Err(e) => unserved.push(Unserved {
                client,
                error: e.to_string(),
            }),
        }
    }
    let summary = summarize(config, per_session, unserved, hung_up, wall_s, memory);
    std::fs::create_dir_all(&config.out).map_err(|e| BenchError::Io {
        path: config.out.clone(),
        message: e.to_string(),
    })?;
    let path = config.out.join("summary.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&summary).unwrap_or_default(),
    )
    .map_err(|e| BenchError::Io {
        path: path.clone(),
        message: e.to_string(),
    })?;
    Ok(summary)
}

/// One run's summary `s` (of `config`) as Markdown: its heading, the totals, the memory,
/// each client when there were several, the clients not served, and where the summary is.
pub fn markdown(s: &ServeBenchSummary, config: &ServeBenchConfig) -> String {
    let bytes = |b: i64| headroom_mem::format_bytes(b.max(0) as u64);
    let size = if config.sizes.is_empty() {
        format!("{}x{}", config.width, config.height)
    } else {
        config
            .sizes
            .iter()
            .map(|(w, h)| format!("{w}x{h}"))
            .collect::<Vec<_>>()
            .join(" or ")
    };
    let mut out = format!(
        "# bench serve: {} clients, concurrency {}, {} frames at {size}, target {} fps{}\n\n",
        s.clients,
        s.concurrency,
        s.frames,
        s.fps,
        s.hang_up_after_s
            .map(|t| format!(", after a client hung up {t} s into its session"))
            .unwrap_or_default()
    );
    out.push_str("| served | queued | queue wait p50 / p95 / max s | TTFC p50 / p95 s | interval mean / p50 / p95 / p99 / max s | real-time factor | deadline attainment |\n");
    out.push_str("|---|---|---|---|---|---|---|\n");
    out.push_str(&format!(
        "| {} / {}{} | {} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} / {:.2} / {:.2} / {:.2} | {:.3} | {:.1} % |\n",
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
    ));
    out.push_str(&format!(
        "\naggregate {:.2} fps over {:.1} s; server memory over {} samples: reserved / allocated at most {:.3}, reserved at most {}; after the run {} reserved, {} allocated, {} resident (weights + KV pool + prompt cache)\n",
        s.aggregate_fps,
        s.wall_s,
        s.memory.samples,
        s.memory.reserved_over_allocated_max,
        bytes(s.memory.reserved_max_bytes),
        bytes(s.memory.reserved_after_bytes),
        bytes(s.memory.allocated_after_bytes),
        bytes(s.memory.resident_after_bytes),
    ));
    out.push_str(&format!(
        "{} hung up as drawn; during the run the server refused {} and ran out of memory {} times\n",
        s.hung_up, s.memory.refused, s.memory.ooms
    ));
    if s.clients > 1 || s.hang_up_after_s.is_some() {
        out.push_str(
            "\n| client | queue wait s | video.start s | TTFC s | interval p50 / max s |\n",
        );
        out.push_str("|---|---|---|---|\n");
        for (i, c) in s.per_session.iter().enumerate() {
            let mut sorted = c.intervals_s.clone();
            sorted.sort_by(f64::total_cmp);
            let p50 = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
            let max = sorted.last().copied().unwrap_or(0.0);
            out.push_str(&format!(
                "| {i} | {:.2} | {:.2} | {:.2} | {p50:.2} / {max:.2} |\n",
                c.queue_wait_s, c.start_s, c.ttfc_s
            ));
        }
    }
    for u in &s.unserved {
        out.push_str(&format!("client {} not served: {}\n", u.client, u.error));
    }
    out.push_str(&format!("\nsummary.json in {}\n", config.out.display()));
    out
}

/// Runs at several concurrencies as Markdown, one row each, aggregate fps also as a
/// multiple of the first row's.
pub fn by_concurrency(rows: &[ServeBenchSummary]) -> String {
    let one = rows.first().map_or(0.0, |r| r.aggregate_fps);
    let mut out =
        String::from("# bench serve: by concurrency (aggregate over the first row's)\n\n");
    out.push_str("| concurrency | aggregate fps | × first | TTFC p50 s | interval p50 / p95 s | deadline attainment | reserved / allocated max | reserved after |\n");
    out.push_str("|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.2} | {:.2}× | {:.2} | {:.2} / {:.2} | {:.1} % | {:.3} | {} |\n",
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
            headroom_mem::format_bytes(r.memory.reserved_after_bytes.max(0) as u64),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_and_realtime_factor_follow_playback_at_the_target_rate() {
        let config = ServeBenchConfig {
            url: String::new(),
            sessions: 1,
            concurrency: 1,
            frames: 33,
            width: 0,
            height: 0,
            fps: 12.0,
            out: PathBuf::new(),
            hang_up_after_s: None,
            sizes: Vec::new(),
            hang_up_share: 0.0,
            api_key: None,
        };
        // 9 frames at 2 s, then 12-frame chunks 0.5 s and 2 s later: playback of the
        // first 9 frames lasts 0.75 s, so the second chunk is on time, the third late.
        let s = SessionTiming {
            queue_wait_s: 0.5,
            start_s: 0.7,
            queued: true,
            ttfc_s: 2.0,
            intervals_s: vec![0.5, 2.0],
            chunk_frames: vec![9, 12, 12],
            e2e_s: 4.5,
            bytes: 0,
        };
        assert_eq!(deadlines(&s, 12.0), (1, 2));
        let summary = summarize(
            &config,
            vec![s],
            vec![Unserved {
                client: 1,
                error: "capacity".to_string(),
            }],
            0,
            3.3,
            MemorySamples::default(),
        );
        assert!(!summary.all_served);
        assert_eq!(
            (summary.clients, summary.sessions, summary.queued),
            (2, 1, 1)
        );
        assert_eq!(summary.queue_wait_max_s, 0.5);
        assert!((summary.realtime_factor - 24.0 / 12.0 / 2.5).abs() < 1e-12);
        assert_eq!(summary.deadline_attainment, 0.5);
        assert_eq!(summary.interval_max_s, 2.0);
        assert!((summary.aggregate_fps - 33.0 / 3.3).abs() < 1e-9);
    }

    #[test]
    fn draws_mix_the_sizes_and_hang_up_the_share_asked_for() {
        let mut config = ServeBenchConfig {
            url: String::new(),
            sessions: 1000,
            concurrency: 4,
            frames: 33,
            width: 128,
            height: 96,
            fps: 16.0,
            out: PathBuf::new(),
            hang_up_after_s: None,
            sizes: Vec::new(),
            hang_up_share: 0.0,
            api_key: None,
        };
        assert!((0..1000).all(|i| config.draw(i) == ((128, 96), None)));
        config.sizes = vec![(128, 96), (160, 128)];
        config.hang_up_share = 0.25;
        let draws: Vec<_> = (0..1000).map(|i| config.draw(i)).collect();
        assert_eq!(draws, (0..1000).map(|i| config.draw(i)).collect::<Vec<_>>());
        let large = draws.iter().filter(|d| d.0 == (160, 128)).count();
        let hung: Vec<usize> = draws.iter().filter_map(|d| d.1).collect();
        assert!((400..600).contains(&large), "{large}");
        assert!((200..300).contains(&hung.len()), "{}", hung.len());
        assert!(hung.iter().all(|&k| k < 3) && (0..3).all(|k| hung.contains(&k)));
    }
}
