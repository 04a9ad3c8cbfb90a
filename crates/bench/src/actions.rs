//! `headroom bench serve --actions N`: key-to-display from the client's side.
//!
//! A client holds one open-ended, paced session per lead and changes its key (a camera
//! velocity, alternating direction) every `every` chunks, at a point drawn at random
//! inside the chunk's media time, until `N` changes were seen. It plays as the pacer
//! intends: the first chunk at its arrival, chunk k after the media time of the chunks
//! before it, so frame f of chunk k plays at `origin + media_before(k) + f / fps`.
//! Key-to-display is the time from sending a change to the playing of the frame it
//! starts at (`started_event_frames` in the chunk metadata). The bound of a chunked
//! design with pacing: one chunk's media time (waiting for the boundary), one chunk's
//! generation, and the lead.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::serve::{connect_to, ws_err};
use crate::stats::percentile;
use crate::Result;

/// What `bench serve --actions` runs.
#[derive(Debug, Clone)]
pub struct ActionsBenchConfig {
    /// The server and the sessions' video.
    pub target: PacedTarget,
    /// Key changes measured per lead.
    pub changes: usize,
    /// Chunks between key changes.
    pub every: usize,
    /// Pacing leads to measure, in seconds.
    pub leads: Vec<f64>,
}

/// One lead's key-to-display figures.
#[derive(Debug, Clone, Serialize)]
pub struct ActionsRow {
    /// The pacing lead, seconds.
    pub lead_s: f64,
    /// Changes measured.
    pub changes: usize,
    /// Median key-to-display, seconds.
    pub p50_s: f64,
    /// 95th percentile.
    pub p95_s: f64,
    /// Largest.
    pub max_s: f64,
    /// Median chunk generation time on the server (`latency_ms`), seconds.
    pub chunk_generation_s: f64,
    /// The chunked design's bound at this lead: a chunk's media time + a chunk's
    /// generation + the lead + 100 ms.
    pub bound_s: f64,
}

/// A small deterministic generator (the points changes are sent at, churn's lengths).
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    /// The next draw in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Media seconds before chunk `k` (9 frames, then 12 a chunk).
pub(crate) fn media_before(k: usize, fps: f64) -> f64 {
    if k == 0 {
        0.0
    } else {
        (9 + 12 * (k - 1)) as f64 / fps
    }
}

/// A paced, open-ended session on `target` (its server, size and fps), seed `seed`,
/// released `lead` seconds before its chunks play.
pub(crate) struct PacedSession<'a> {
    /// The server and the video.
    pub target: &'a PacedTarget,
    /// Noise seed.
    pub seed: usize,
    /// Pacing lead, seconds.
    pub lead: f64,
}

/// The server paced sessions connect to and the video they ask for.
#[derive(Debug, Clone)]
pub struct PacedTarget {
    /// The realtime endpoint.
    pub url: String,
    /// The server's API key, if it has one.
    pub api_key: Option<String>,
    /// Video width.
    pub width: usize,
    /// Video height.
    pub height: usize,
    /// Frames per second.
    pub fps: u32,
}

impl PacedSession<'_> {
    /// Connects and sends the `session.start`.
    pub(crate) async fn open(&self) -> Result<Ws> {
        let t = self.target;
        let (mut ws, _) = connect_to(&t.url, t.api_key.as_deref())
            .await
            .map_err(ws_err)?;
        let start = json!({"type": "session.start", "format": "m4s", "width": t.width,
            "height": t.height, "fps": t.fps, "seed": self.seed,
            "extra_params": {"pace_to_media_time": true, "pacing_lead_seconds": self.lead}});
        ws.send(Message::text(start.to_string()))
            .await
            .map_err(ws_err)?;
        Ok(ws)
    }
}

/// A realtime socket.
pub(crate) type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Stops the session and closes the socket (either may fail: the server may be gone).
pub(crate) async fn stop_and_close(ws: &mut Ws) {
    let _ = ws
        .send(Message::text(json!({"type": "session.stop"}).to_string()))
        .await;
    let _ = ws.close(None).await;
}

async fn one_lead(cfg: &ActionsBenchConfig, lead: f64) -> Result<ActionsRow> {
    let mut ws = PacedSession {
        target: &cfg.target,
        seed: 7,
        lead,
    }
    .open()
    .await?;
    let fps = f64::from(cfg.target.fps);
    let chunk_media = 12.0 / fps;
    let mut rng = Lcg(0x5eed ^ lead.to_bits());
    let mut origin: Option<Instant> = None;
    let mut sent: HashMap<String, Instant> = HashMap::new();
    let (mut latencies, mut generation) = (Vec::new(), Vec::new());
    let mut chunks = 0usize;
    let mut next_send: Option<Instant> = None;
    let mut changes = 0usize;
    while latencies.len() < cfg.changes {
        let wait = next_send.map(|t| t.saturating_duration_since(Instant::now()));
        let message = match wait {
            Some(w) => match tokio::time::timeout(w, ws.next()).await {
                Ok(m) => m,
                Err(_) => {
                    // Time to change keys.
                    changes += 1;
                    let id = format!("key-{changes}");
                    let z = if changes.is_multiple_of(2) {
                        0.05
                    } else {
                        -0.05
                    };
                    let change = json!({"type": "session.interaction", "interaction": {
                        "event_id": id, "event": {"multi_modal_data": {"camera": {
                        "mode": "velocity", "data": {"translation": [0.0, 0.0, z],
                        "rotation": [0.0, 0.0, 0.0, 1.0]}}}}}});
                    ws.send(Message::text(change.to_string()))
                        .await
                        .map_err(ws_err)?;
                    sent.insert(id, Instant::now());
                    next_send = None;
                    continue;
                }
            },
            None => ws.next().await,
        };
        let Some(message) = message else { break };
        match message.map_err(ws_err)? {
            Message::Binary(_) => {
                let now = Instant::now();
                origin.get_or_insert(now);
                chunks += 1;
                if chunks.is_multiple_of(cfg.every.max(1)) && next_send.is_none() {
                    next_send = Some(now + Duration::from_secs_f64(rng.unit() * chunk_media));
                }
            }
            Message::Text(text) => {
                let v: Value = serde_json::from_str(text.as_str()).map_err(ws_err)?;
                match v["type"].as_str() {
                    Some("video.chunk_metadata") => {
                        generation.push(v["latency_ms"].as_f64().unwrap_or(0.0) / 1e3);
                        let k = v["generation_chunk_index"].as_u64().unwrap_or(0) as usize;
                        let frames = v["started_event_frames"].as_object().cloned();
                        for (id, frame) in frames.into_iter().flatten() {
                            let (Some(at), Some(origin)) = (sent.remove(&id), origin) else {
                                continue;
                            };
                            let f = frame.as_f64().unwrap_or(0.0);
                            let plays =
                                origin + Duration::from_secs_f64(media_before(k, fps) + f / fps);
                            latencies.push(plays.saturating_duration_since(at).as_secs_f64());
                        }
                    }
                    Some("error") => return Err(ws_err(v)),
                    _ => {}
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    stop_and_close(&mut ws).await;
    let pct = |p| percentile(&latencies, p).unwrap_or(f64::NAN);
    let gen = percentile(&generation, 50.0).unwrap_or(f64::NAN);
    Ok(ActionsRow {
        lead_s: lead,
        changes: latencies.len(),
        p50_s: pct(50.0),
        p95_s: pct(95.0),
        max_s: pct(100.0),
        chunk_generation_s: gen,
        bound_s: chunk_media + gen + lead + 0.1,
    })
}

/// Runs every lead in turn against the server.
pub fn run_actions_bench(cfg: &ActionsBenchConfig) -> Result<Vec<ActionsRow>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ws_err)?;
    runtime.block_on(async {
        let mut rows = Vec::new();
        for &lead in &cfg.leads {
            rows.push(one_lead(cfg, lead).await?);
        }
        Ok(rows)
    })
}

/// The rows as a markdown table.
pub fn markdown(rows: &[ActionsRow]) -> String {
    let mut out = String::from(
        "| lead s | changes | key-to-display p50 s | p95 s | max s | chunk generation s | bound s (chunk media + generation + lead + 0.1) |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {:.3} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |\n",
            r.lead_s, r.changes, r.p50_s, r.p95_s, r.max_s, r.chunk_generation_s, r.bound_s
        ));
    }
    out
}
