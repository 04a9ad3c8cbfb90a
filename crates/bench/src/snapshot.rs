//! `headroom bench snapshot`: what a session snapshot costs, measured in one run.
//!
//! For each model a session runs to its steady state (the KV window full); then, at
//! each of `reps` chunk boundaries, its snapshot is written to a file (timed: copy off
//! the device, encode, checksum, atomic write), the session makes its next chunk (the
//! uninterrupted chunk, timed), the file is read and resumed on the same engine (timed:
//! read, checks, admission, state back on the device) and the resumed session makes
//! that chunk again (the first chunk after a resume, timed and compared byte for byte).
//! Models too large to run here are reported from the plan's bytes
//! ([`headroom_engine::snapshot::SnapshotEstimate`]) without times.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use headroom_engine::snapshot::SnapshotEstimate;
use headroom_engine::{Engine, EngineConfig, SessionRequest};
use serde::Serialize;

use crate::stats::median;
use crate::{BenchError, Result};

/// One model to measure: run (`run: true`) or from the plan's bytes only.
#[derive(Debug, Clone)]
pub struct SnapshotModel {
    /// The engine.
    pub engine: EngineConfig,
    /// The name to print.
    pub label: String,
    /// Video width.
    pub width: usize,
    /// Video height.
    pub height: usize,
    /// Run sessions (else only the estimate, on a modelled device).
    pub run: bool,
}

/// What `bench snapshot` runs.
#[derive(Debug, Clone)]
pub struct SnapshotBenchConfig {
    /// The models.
    pub models: Vec<SnapshotModel>,
    /// Chunks before the first snapshot (the steady state).
    pub warmup_chunks: usize,
    /// Snapshots (and resumes) per model.
    pub reps: usize,
    /// Where the snapshot files go (removed after).
    pub dir: PathBuf,
}

/// One model's figures.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotRow {
    /// The model.
    pub model: String,
    /// `WxH`.
    pub size: String,
    /// The snapshot by part, from the configs.
    pub estimate: SnapshotEstimate,
    /// Bytes of the snapshot's tensors, measured (`None`: not run).
    pub state_bytes: Option<u64>,
    /// Measured bytes of its KV, text, condition (with the encoder cache until the
    /// condition settles) and decoder parts.
    pub parts_bytes: Option<[u64; 4]>,
    /// Bytes of the file.
    pub file_bytes: Option<u64>,
    /// Median ms to write a snapshot file.
    pub write_ms: Option<f64>,
    /// Median ms to read a file and resume its session.
    pub resume_ms: Option<f64>,
    /// Median ms of a chunk of the uninterrupted session.
    pub chunk_ms: Option<f64>,
    /// Median ms of the first chunk after a resume.
    pub resumed_chunk_ms: Option<f64>,
    /// The first chunk after a resume over the uninterrupted chunk (median of pairs).
    pub resumed_chunk_ratio: Option<f64>,
    /// Bytes the allocated peak rose by while a snapshot was taken (staging).
    pub staging_bytes: Option<u64>,
    /// Whether every resumed chunk was the uninterrupted chunk's bytes.
    pub identical: Option<bool>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn measure(model: &SnapshotModel, cfg: &SnapshotBenchConfig) -> Result<SnapshotRow> {
    let engine = if model.run {
        Engine::new(model.engine.clone())?
    } else {
        // A modelled device: the weights are shapes only, nothing is computed.
        let sim = headroom_mem::CachingPlatform::sim(
            1 << 40,
            model.engine.allocator.clone(),
            model.engine.reclaim,
        )?;
        Engine::load(
            model.engine.clone(),
            headroom_engine::Placement::host(std::sync::Arc::new(sim)),
        )?
    };
    let estimate = engine.snapshot_estimate(model.width, model.height, None, false)?;
    let mut row = SnapshotRow {
        model: model.label.clone(),
        size: format!("{}x{}", model.width, model.height),
        estimate,
        state_bytes: None,
        parts_bytes: None,
        file_bytes: None,
        write_ms: None,
        resume_ms: None,
        chunk_ms: None,
        resumed_chunk_ms: None,
        resumed_chunk_ratio: None,
        staging_bytes: None,
        identical: None,
    };
    if !model.run {
        return Ok(row);
    }
    let mut session = engine.open_session(SessionRequest::new(model.width, model.height, 0))?;
    for _ in 0..cfg.warmup_chunks {
        session.next_chunk()?;
    }
    std::fs::create_dir_all(&cfg.dir).map_err(|e| BenchError::Io {
        path: cfg.dir.clone(),
        message: e.to_string(),
    })?;
    let path = cfg.dir.join(format!(
        "bench-{}-{}.hrsnap",
        std::process::id(),
        model.label.replace(['/', ' '], "_")
    ));
    let platform = engine.platform().clone();
    let (mut write, mut resume, mut chunk, mut resumed, mut ratio) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut identical = true;
    let mut staging = 0u64;
    for _ in 0..cfg.reps {
        let before = platform.memory_stats().allocated_now();
        platform.reset_peak_stats();
        let t = Instant::now();
        let snapshot = session.snapshot()?;
        let file_bytes = snapshot.write(&path)?;
        write.push(ms(t.elapsed()));
        let peak = platform.memory_stats().allocated_bytes.all().peak.max(0) as u64;
        staging = staging.max(peak.saturating_sub(before));
        row.state_bytes = Some(snapshot.state_bytes());
        let part = |name: &str| {
            snapshot
                .parts()
                .iter()
                .find(|p| p.0 == name)
                .map_or(0, |p| p.2)
        };
        row.parts_bytes = Some([part("kv"), part("text"), part("condition"), part("decoder")]);
        row.file_bytes = Some(file_bytes);
        drop(snapshot);
        let t = Instant::now();
        let next = session.next_chunk()?;
        let uninterrupted = t.elapsed();
        chunk.push(ms(uninterrupted));
        let want = next.frames.to_vec::<u8>()?;
        drop(next);
        let t = Instant::now();
        let mut again = engine.resume(path.as_path())?;
        resume.push(ms(t.elapsed()));
        let t = Instant::now();
        let first = again.next_chunk()?;
        let after = t.elapsed();
        resumed.push(ms(after));
        ratio.push(after.as_secs_f64() / uninterrupted.as_secs_f64());
        identical &= first.frames.to_vec::<u8>()? == want;
    }
    let _ = std::fs::remove_file(&path);
    row.write_ms = median(&write);
    row.resume_ms = median(&resume);
    row.chunk_ms = median(&chunk);
    row.resumed_chunk_ms = median(&resumed);
    row.resumed_chunk_ratio = median(&ratio);
    row.staging_bytes = Some(staging);
    row.identical = Some(identical);
    Ok(row)
}

/// Runs `bench snapshot` over every model, in order.
pub fn run_snapshot_bench(cfg: &SnapshotBenchConfig) -> Result<Vec<SnapshotRow>> {
    if cfg.reps == 0 {
        return Err(BenchError::InvalidConfig {
            field: "reps",
            rule: "must be at least 1".into(),
        });
    }
    cfg.models.iter().map(|m| measure(m, cfg)).collect()
}

/// The rows as a markdown table.
pub fn markdown(rows: &[SnapshotRow]) -> String {
    let mb = |b: u64| format!("{:.2}", b as f64 / 1e6);
    let opt =
        |v: Option<f64>, digits: usize| v.map_or("–".to_string(), |v| format!("{v:.digits$}"));
    let mut out = String::from(
        "| model | size | snapshot MB (KV / text / cond / decoder) | file MB | write ms | resume ms | chunk ms | first chunk after resume ms | ratio | staging MB | identical |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let e = &r.estimate;
        let measured = r.state_bytes.unwrap_or(e.total_bytes);
        let [kv, text, cond, decoder] =
            r.parts_bytes
                .unwrap_or([e.kv_bytes, e.text_bytes, e.condition_bytes, e.decoder_bytes]);
        out.push_str(&format!(
            "| {} | {} | {} ({} / {} / {} / {}){} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.model,
            r.size,
            mb(measured),
            mb(kv),
            mb(text),
            mb(cond),
            mb(decoder),
            if r.state_bytes.is_none() {
                " planned"
            } else {
                ""
            },
            r.file_bytes.map_or("–".into(), mb),
            opt(r.write_ms, 1),
            opt(r.resume_ms, 1),
            opt(r.chunk_ms, 1),
            opt(r.resumed_chunk_ms, 1),
            opt(r.resumed_chunk_ratio, 3),
            r.staging_bytes.map_or(mb(e.staging_bytes) + " planned", mb),
            r.identical.map_or("–".into(), |b| b.to_string()),
        ));
    }
    out
}
