//! `headroom bench serve --realtime N,…`: how many paced, open-ended sessions one server
//! keeps on time.
//!
//! For each count `N`, `N` clients start paced open-ended sessions, staggered over one
//! chunk's media time (viewers do not arrive in step), and each plays what it receives
//! as the pacer intends: the first chunk on arrival, chunk k after the media time of
//! the chunks before it. A chunk is on time when it arrives no later than it plays.
//! Each session is measured for `seconds` from its first chunk, then stopped. A client
//! the server queues (real-time capacity, slots or memory) and does not admit within
//! the run counts as queued, not as late: admission is what keeps the others on time.
//! With `churn`, sessions arrive and leave at random instead (3–15 s each, 0–2 s
//! apart, for `seconds` in all). While the sessions run, `/metrics` is sampled every 200 ms for the allocator's
//! allocated and reserved bytes (their peaks' ratio is what churn costs in memory).

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use crate::actions::{media_before, stop_and_close, Lcg, PacedSession, PacedTarget};
use crate::serve::{metric, metrics_at, ws_err};
use crate::stats::percentile;
use crate::Result;

/// What `bench serve --realtime` runs.
#[derive(Debug, Clone)]
pub struct RealtimeBenchConfig {
    /// The server and the sessions' video.
    pub target: PacedTarget,
    /// Session counts to try, in turn.
    pub counts: Vec<usize>,
    /// Seconds each session is measured from its first chunk.
    pub seconds: f64,
    /// The pacing lead the sessions ask for, seconds.
    pub lead: f64,
    /// Sessions arrive and leave at random: each of the `N` clients runs sessions of
    /// 3–15 s one after another, 0–2 s apart, for `seconds` in all (round compositions
    /// change all the time).
    pub churn: bool,
}

/// One count's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RealtimeRow {
    /// Sessions started.
    pub sessions: usize,
    /// Sessions admitted (their first chunk arrived within the run).
    pub admitted: usize,
    /// Chunks received by admitted sessions (the first of each not counted: it sets
    /// the session's clock).
    pub chunks: usize,
    /// Share of those chunks that arrived by the time they play.
    pub on_time: f64,
    /// 99th percentile of arrival − play time, seconds (≤ 0: on time).
    pub p99_late_s: f64,
    /// Largest arrival − play time, seconds.
    pub max_late_s: f64,
    /// `headroom_deadline_misses_total` during the run.
    pub deadline_misses: i64,
    /// Largest allocated bytes of any `/metrics` sample.
    pub allocated_peak_bytes: i64,
    /// Largest reserved bytes of any sample.
    pub reserved_peak_bytes: i64,
    /// The allocator's own peaks at the end of the run (`headroom_allocated_peak_bytes`,
    /// `headroom_reserved_peak_bytes`: since the server started).
    pub allocator_peaks: (i64, i64),
    /// Whether every admitted session's p99 chunk was on time.
    pub all_on_time: bool,
}

/// One client slot under churn: sessions of random length one after another until
/// `end_by`; the lateness of every chunk of every admitted session.
async fn churning(
    cfg: &RealtimeBenchConfig,
    slot: usize,
    delay: Duration,
    end_by: Instant,
) -> Result<Option<Vec<f64>>> {
    tokio::time::sleep(delay).await;
    let mut rng = Lcg(0xc4u64 ^ (slot as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut late: Option<Vec<f64>> = None;
    let mut k = 0;
    while Instant::now() + Duration::from_secs(3) < end_by {
        let seconds = 3.0 + 12.0 * rng.unit();
        let got = one_client(cfg, 1000 * slot + k, Duration::ZERO, end_by, seconds).await?;
        if let Some(l) = got {
            late.get_or_insert_with(Vec::new).extend(l);
        }
        k += 1;
        tokio::time::sleep(Duration::from_secs_f64(2.0 * rng.unit())).await;
    }
    Ok(late)
}

/// One client: its lateness per chunk after the first (`None`: never admitted).
async fn one_client(
    cfg: &RealtimeBenchConfig,
    seed: usize,
    delay: Duration,
    end_by: Instant,
    seconds: f64,
) -> Result<Option<Vec<f64>>> {
    tokio::time::sleep(delay).await;
    let mut ws = PacedSession {
        target: &cfg.target,
        seed,
        lead: cfg.lead,
    }
    .open()
    .await?;
    let fps = f64::from(cfg.target.fps);
    let mut origin: Option<Instant> = None;
    let mut late = Vec::new();
    let mut index = 0usize;
    loop {
        let until = match origin {
            Some(o) => (o + Duration::from_secs_f64(seconds)).min(end_by),
            None => end_by,
        };
        let left = until.saturating_duration_since(Instant::now());
        let Ok(message) = tokio::time::timeout(left, ws.next()).await else {
            break;
        };
        let Some(message) = message else { break };
        match message.map_err(ws_err)? {
            Message::Binary(_) => {
                let now = Instant::now();
                let o = *origin.get_or_insert(now);
                if index > 0 {
                    // Arrival less play time: negative when early.
                    late.push((now - o).as_secs_f64() - media_before(index, fps));
                }
                index += 1;
            }
            Message::Text(text) => {
                let v: Value = serde_json::from_str(text.as_str()).map_err(ws_err)?;
                if v["type"] == "error" {
                    break;
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    stop_and_close(&mut ws).await;
    Ok(origin.map(|_| late))
}

/// (allocated, reserved) bytes from `/metrics` now.
async fn memory(cfg: &RealtimeBenchConfig) -> Option<(i64, i64, i64)> {
    let body = metrics_at(&cfg.target.url, cfg.target.api_key.as_deref()).await?;
    Some((
        metric(&body, "headroom_allocated_bytes")?,
        metric(&body, "headroom_reserved_bytes")?,
        metric(&body, "headroom_deadline_misses_total").unwrap_or(0),
    ))
}

async fn one_count(cfg: &RealtimeBenchConfig, n: usize) -> Result<RealtimeRow> {
    let chunk = 12.0 / f64::from(cfg.target.fps);
    let misses_before = memory(cfg).await.map_or(0, |m| m.2);
    // Every client is started within a chunk; one that is not admitted by the time the
    // others finish counts as queued.
    let end_by = Instant::now() + Duration::from_secs_f64(chunk + cfg.seconds + 5.0);
    let clients = (0..n).map(|i| {
        let delay = Duration::from_secs_f64(chunk * i as f64 / n as f64);
        async move {
            if cfg.churn {
                churning(cfg, i, delay, end_by).await
            } else {
                one_client(cfg, 100 + i, delay, end_by, cfg.seconds).await
            }
        }
    });
    let sampler = async {
        let (mut alloc, mut reserved) = (0i64, 0i64);
        while Instant::now() < end_by {
            if let Some((a, r, _)) = memory(cfg).await {
                alloc = alloc.max(a);
                reserved = reserved.max(r);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        (alloc, reserved)
    };
    // The sampler runs to the end of the run, past the last client.
    let (results, peaks) = tokio::join!(futures_util::future::join_all(clients), sampler);
    let misses_after = memory(cfg).await.map_or(misses_before, |m| m.2);
    let body = metrics_at(&cfg.target.url, cfg.target.api_key.as_deref())
        .await
        .unwrap_or_default();
    let allocator_peaks = (
        metric(&body, "headroom_allocated_peak_bytes").unwrap_or(0),
        metric(&body, "headroom_reserved_peak_bytes").unwrap_or(0),
    );
    let mut admitted = 0;
    let mut late = Vec::new();
    let mut all_on_time = true;
    for r in results {
        if let Some(l) = r? {
            admitted += 1;
            if percentile(&l, 99.0).is_some_and(|p| p > 0.0) {
                all_on_time = false;
            }
            late.extend(l);
        }
    }
    let on = late.iter().filter(|&&x| x <= 0.0).count();
    Ok(RealtimeRow {
        sessions: n,
        admitted,
        chunks: late.len(),
        on_time: if late.is_empty() {
            0.0
        } else {
            on as f64 / late.len() as f64
        },
        p99_late_s: percentile(&late, 99.0).unwrap_or(f64::NAN),
        max_late_s: percentile(&late, 100.0).unwrap_or(f64::NAN),
        deadline_misses: misses_after - misses_before,
        allocated_peak_bytes: peaks.0,
        reserved_peak_bytes: peaks.1,
        allocator_peaks,
        all_on_time: all_on_time && admitted > 0,
    })
}

/// Runs every count in turn against the server.
pub fn run_realtime_bench(cfg: &RealtimeBenchConfig) -> Result<Vec<RealtimeRow>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ws_err)?;
    runtime.block_on(async {
        let mut rows = Vec::new();
        for &n in &cfg.counts {
            rows.push(one_count(cfg, n).await?);
            // Let the server release the last sessions before the next count.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        Ok(rows)
    })
}

/// The rows as a markdown table.
pub fn markdown(rows: &[RealtimeRow]) -> String {
    let mut out = String::from(
        "| sessions | admitted | chunks | on time | p99 late s | max late s | deadline misses | sampled allocated max MiB | sampled reserved max MiB | ratio | allocator peaks MiB (allocated / reserved) | ratio | all on time (p99) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let mib = |b: i64| b as f64 / (1u64 << 20) as f64;
        let ratio = |a: i64, r: i64| {
            if a > 0 {
                r as f64 / a as f64
            } else {
                f64::NAN
            }
        };
        let (pa, pr) = r.allocator_peaks;
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} % | {:.3} | {:.3} | {} | {:.1} | {:.1} | {:.3} | {:.1} / {:.1} | {:.3} | {} |\n",
            r.sessions,
            r.admitted,
            r.chunks,
            r.on_time * 100.0,
            r.p99_late_s,
            r.max_late_s,
            r.deadline_misses,
            mib(r.allocated_peak_bytes),
            mib(r.reserved_peak_bytes),
            ratio(r.allocated_peak_bytes, r.reserved_peak_bytes),
            mib(pa),
            mib(pr),
            ratio(pa, pr),
            if r.all_on_time { "yes" } else { "no" },
        ));
    }
    out
}
