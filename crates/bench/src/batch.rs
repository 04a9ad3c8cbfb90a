//! `headroom bench batch`: many sessions on one engine, one at a time against stepped
//! together by the scheduler (their forwards batched), in the same run.
//!
//! For each concurrency N the same N requests (different seeds and camera scripts) run
//! twice on one engine: one after another, each whole (what a server with one slot
//! does), and together through [`headroom_engine::scheduler::next_chunks`]. Each row
//! reports aggregate frames per second, the time spent denoising (DMD steps and
//! commits) and decoding, the allocator's peaks, and whether every session's frames
//! were byte-identical between the two runs. Ratios are against one session alone,
//! measured in the same run.

use std::time::{Duration, Instant};

use headroom_engine::{scheduler, Chunk, Engine, EngineConfig, Session, SessionRequest};
use headroom_model::camera::Keys;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::BenchError;

/// What `bench batch` runs.
#[derive(Debug, Clone)]
pub struct BatchBenchConfig {
    /// The engine (model, allocator, reclaim); `max_sessions` is raised to the largest N.
    pub engine: EngineConfig,
    /// Video width.
    pub width: usize,
    /// Video height.
    pub height: usize,
    /// Frames per session (12·K − 3).
    pub frames: usize,
    /// Concurrencies to measure.
    pub concurrency: Vec<usize>,
}

/// One concurrency's measurements, one at a time and stepped together.
#[derive(Debug, Clone, Serialize)]
pub struct BatchRow {
    /// Sessions.
    pub sessions: usize,
    /// Aggregate frames per second, one session after another.
    pub sequential_fps: f64,
    /// Aggregate frames per second, stepped together with batched forwards.
    pub batched_fps: f64,
    /// Batched fps over one session's fps alone (the N = 1 sequential run).
    pub batched_vs_one: f64,
    /// Seconds in denoise + commit, sequential and batched.
    pub denoise_s: [f64; 2],
    /// Seconds in the decode, sequential and batched.
    pub decode_s: [f64; 2],
    /// Allocated peak bytes, sequential and batched.
    pub allocated_peak_bytes: [u64; 2],
    /// Reserved peak bytes, sequential and batched.
    pub reserved_peak_bytes: [u64; 2],
    /// Whether every session's frames were the same bytes in both runs.
    pub identical: bool,
}

/// Camera scripts the sessions cycle through (one key set per latent frame).
const SCRIPTS: [&str; 4] = ["w", "l", "j", "d"];

fn request(cfg: &BatchBenchConfig, k: usize) -> Result<SessionRequest, BenchError> {
    let latent = cfg.frames.div_ceil(4);
    let key = Keys::parse(SCRIPTS[k % SCRIPTS.len()]).map_err(|e| BenchError::InvalidConfig {
        field: "camera script",
        rule: e.to_string(),
    })?;
    Ok(SessionRequest {
        seed: 1000 + k as u64,
        actions: vec![key; latent],
        ..SessionRequest::new(cfg.width, cfg.height, cfg.frames)
    })
}

/// Frames, denoise + commit and decode time of a chunk; its bytes go into `hash`.
fn account(chunk: &Chunk, hash: &mut Sha256, totals: &mut (usize, Duration, Duration)) {
    if let Some(bytes) = chunk.frames.host_bytes() {
        hash.update(bytes);
    }
    totals.0 += chunk.frames.shape()[0];
    totals.1 += chunk.timings.denoise + chunk.timings.commit;
    totals.2 += chunk.timings.decode;
}

struct Run {
    seconds: f64,
    frames: usize,
    denoise: Duration,
    decode: Duration,
    hashes: Vec<Vec<u8>>,
    peaks: (u64, u64),
}

fn peaks(engine: &Engine) -> (u64, u64) {
    let s = engine.platform().memory_stats();
    (
        s.allocated_bytes.all().peak.max(0) as u64,
        s.reserved_bytes.all().peak.max(0) as u64,
    )
}

fn sequential(engine: &Engine, cfg: &BatchBenchConfig, n: usize) -> Result<Run, BenchError> {
    engine.platform().reset_peak_stats();
    let mut totals = (0, Duration::ZERO, Duration::ZERO);
    let mut hashes = Vec::new();
    let start = Instant::now();
    for k in 0..n {
        let mut session = engine.open_session(request(cfg, k)?)?;
        let mut hash = Sha256::new();
        for _ in 0..crate::finite_chunks(&session)? {
            account(&session.next_chunk()?, &mut hash, &mut totals);
        }
        hashes.push(hash.finalize().to_vec());
    }
    Ok(Run {
        seconds: start.elapsed().as_secs_f64(),
        frames: totals.0,
        denoise: totals.1,
        decode: totals.2,
        hashes,
        peaks: peaks(engine),
    })
}

fn batched(engine: &Engine, cfg: &BatchBenchConfig, n: usize) -> Result<Run, BenchError> {
    // As a server with several slots opens them: no arena of a session's own is kept
    // idle beside its batched rounds' (under `planned`).
    engine.set_batched_steps(n > 1);
    let run = batched_run(engine, cfg, n);
    engine.set_batched_steps(false);
    run
}

/// [`batched`] once the engine is set.
fn batched_run(engine: &Engine, cfg: &BatchBenchConfig, n: usize) -> Result<Run, BenchError> {
    engine.platform().reset_peak_stats();
    let mut totals = (0, Duration::ZERO, Duration::ZERO);
    let start = Instant::now();
    let mut sessions: Vec<Session> = (0..n)
        .map(|k| Ok(engine.open_session(request(cfg, k)?)?))
        .collect::<Result<_, BenchError>>()?;
    let mut hashes: Vec<Sha256> = (0..n).map(|_| Sha256::new()).collect();
    let mut denoise_wall = Duration::ZERO;
    let mut decode_wall = Duration::ZERO;
    loop {
        let (ids, mut live): (Vec<usize>, Vec<&mut Session>) = sessions
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| s.chunks_total().is_some_and(|t| s.chunks_done() < t))
            .unzip();
        if live.is_empty() {
            break;
        }
        let mut round = (0, Duration::ZERO, Duration::ZERO);
        for (k, chunk) in ids.into_iter().zip(scheduler::next_chunks(&mut live)) {
            let mut step = (0, Duration::ZERO, Duration::ZERO);
            account(&chunk?, &mut hashes[k], &mut step);
            round.0 += step.0;
            // Batched denoises and decodes are shared: each session reports the span
            // of the batch it was in.
            round.1 = round.1.max(step.1);
            round.2 = round.2.max(step.2);
        }
        totals.0 += round.0;
        denoise_wall += round.1;
        decode_wall += round.2;
    }
    drop(sessions);
    Ok(Run {
        seconds: start.elapsed().as_secs_f64(),
        frames: totals.0,
        denoise: denoise_wall,
        decode: decode_wall,
        hashes: hashes.into_iter().map(|h| h.finalize().to_vec()).collect(),
        peaks: peaks(engine),
    })
}

/// Runs the benchmark: per concurrency, the sessions one after another, then stepped
/// together, on one engine.
pub fn run_batch_bench(cfg: &BatchBenchConfig) -> Result<Vec<BatchRow>, BenchError> {
    let most = cfg.concurrency.iter().copied().max().unwrap_or(1);
    if cfg.concurrency.contains(&0) {
        return Err(BenchError::InvalidConfig {
            field: "concurrency",
            rule: "every value must be at least 1".into(),
        });
    }
    let engine = Engine::new(EngineConfig {
        max_sessions: most,
        ..cfg.engine.clone()
    })?;
    // One warm-up session: page faults and caches out of the first measurement.
    sequential(&engine, cfg, 1)?;
    let one = sequential(&engine, cfg, 1)?;
    let one_fps = one.frames as f64 / one.seconds;
    let mut rows = Vec::new();
    for &n in &cfg.concurrency {
        let seq = sequential(&engine, cfg, n)?;
        let bat = batched(&engine, cfg, n)?;
        let batched_fps = bat.frames as f64 / bat.seconds;
        rows.push(BatchRow {
            sessions: n,
            sequential_fps: seq.frames as f64 / seq.seconds,
            batched_fps,
            batched_vs_one: batched_fps / one_fps,
            denoise_s: [seq.denoise.as_secs_f64(), bat.denoise.as_secs_f64()],
            decode_s: [seq.decode.as_secs_f64(), bat.decode.as_secs_f64()],
            allocated_peak_bytes: [seq.peaks.0, bat.peaks.0],
            reserved_peak_bytes: [seq.peaks.1, bat.peaks.1],
            identical: seq.hashes == bat.hashes,
        });
    }
    Ok(rows)
}

/// The heading of a run of `config`: `model` and `allocator` as the command line named
/// them, the size, frames, threads and CPU.
pub fn heading(model: &str, allocator: &str, config: &BatchBenchConfig) -> String {
    format!(
        "# bench batch: {model} ({} decoder) at {}x{}, {} frames per session, {allocator} allocator, {} threads, {}\n\n",
        config.engine.decoder,
        config.width,
        config.height,
        config.frames,
        headroom_tensor::parallel::num_threads(),
        headroom_tensor::kernels::cpu::model_name(),
    )
}

/// The rows as a Markdown table.
pub fn markdown(rows: &[BatchRow]) -> String {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let mut out = String::from(
        "| sessions | fps one at a time | fps batched | batched / one session | denoise s (seq / batched) | decode s (seq / batched) | allocated peak MiB (seq / batched) | reserved peak MiB (seq / batched) | identical |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2}× | {:.2} / {:.2} | {:.2} / {:.2} | {:.1} / {:.1} | {:.1} / {:.1} | {} |\n",
            r.sessions,
            r.sequential_fps,
            r.batched_fps,
            r.batched_vs_one,
            r.denoise_s[0],
            r.denoise_s[1],
            r.decode_s[0],
            r.decode_s[1],
            mib(r.allocated_peak_bytes[0]),
            mib(r.allocated_peak_bytes[1]),
            mib(r.reserved_peak_bytes[0]),
            mib(r.reserved_peak_bytes[1]),
            if r.identical { "yes" } else { "NO" },
        ));
    }
    out
}
