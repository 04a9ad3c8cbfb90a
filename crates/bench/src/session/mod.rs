//! `headroom bench session`: matched A/B runs of reclaim policies over sequential
//! sessions, with a background memory sampler, exact allocator peaks, residency after
//! every session, latency, reclaim cost, and a hash of every session's frames.
//!
//! Runs are interleaved (policy A rep 1, policy B rep 1, …, after the same warm-ups) so
//! machine drift affects every policy alike; every repetition is a fresh engine serving
//! `sessions` sessions one after another, a long-lived server's life in miniature.

pub mod ranks;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use headroom_engine::{Engine, EngineConfig, Placement, SessionRequest};
use headroom_mem::{
    process_minor_faults, process_rss_bytes, AllocatorConfig, AllocatorPolicy, Platform,
    ReclaimPolicy,
};
use headroom_tensor::Device;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::stats::{percentile, Spread};
use crate::{BenchError, Result};

/// What to run.
#[derive(Debug, Clone)]
pub struct SessionBenchConfig {
    /// Built-in model.
    pub model: String,
    /// Policies compared.
    pub policies: Vec<ReclaimPolicy>,
    /// Allocator policies compared (each with every reclaim policy).
    pub allocators: Vec<AllocatorPolicy>,
    /// PyTorch's `max_split_size` for every run (`None`: unlimited).
    pub max_split_size: Option<u64>,
    /// Sequential sessions per run.
    pub sessions: usize,
    /// Unrecorded runs per policy first.
    pub warmup: usize,
    /// Recorded runs per policy.
    pub reps: usize,
    /// Sampling period.
    pub sample_ms: u64,
    /// Output folder.
    pub out: PathBuf,
    /// Frames per session.
    pub frames: usize,
    /// Width.
    pub width: usize,
    /// Height.
    pub height: usize,
    /// Seed of every session.
    pub seed: u64,
    /// Device capacity in bytes (physical memory when `None`).
    pub capacity: Option<u64>,
    /// Weight (and compute) dtype of the model.
    pub dtype: headroom_tensor::DType,
    /// How the DiT blocks' linear weights are held (`--weights`).
    pub weights: headroom_model::WeightFormat,
    /// The sessions' decoder.
    pub decoder: headroom_model::DecoderKind,
    /// A tiny decoder file (`None`: the model folder's, or the released shapes).
    pub tiny_decoder: Option<PathBuf>,
    /// This rank's groups when the benchmark runs on a TP × SP mesh (every rank runs it;
    /// rank 0 writes the files).
    pub groups: Option<headroom_engine::RankGroups>,
}

/// Where a run is, for the sampler's tags.
#[derive(Debug, Clone, Default)]
struct Tags {
    session: usize,
    chunk: usize,
    phase: &'static str,
}

/// One reading of the background sampler.
#[derive(Debug, Clone)]
struct Sample {
    t_ms: f64,
    rep: usize,
    tags: Tags,
    last_phase: String,
    allocated: u64,
    reserved: u64,
    device_used: u64,
    rss: u64,
}

/// What one run's sampler saw: readings and the phase boundaries crossed.
#[derive(Debug, Clone, Default)]
struct Recording {
    samples: Vec<Sample>,
    /// (milliseconds, phase name).
    marks: Vec<(f64, String)>,
}

/// The columns of `samples.csv`.
pub const SAMPLES_CSV_HEADER: &str = "t_ms,policy,rep,session,chunk,phase,allocated_bytes,reserved_bytes,device_used_bytes,rss_bytes,last_phase";

impl Recording {
    fn csv_rows(&self, label: &str, out: &mut String) {
        for s in &self.samples {
            let _ = writeln!(
                out,
                "{:.1},{label},{},{},{},{},{},{},{},{},{}",
                s.t_ms,
                s.rep,
                s.tags.session,
                s.tags.chunk,
                s.tags.phase,
                s.allocated,
                s.reserved,
                s.device_used,
                s.rss,
                s.last_phase
            );
        }
    }

    fn panel(&self, label: &str) -> crate::plot::Panel {
        crate::plot::Panel {
            label: label.to_string(),
            points: self
                .samples
                .iter()
                .map(|s| (s.t_ms / 1e3, s.allocated, s.reserved))
                .collect(),
            marks: self
                .marks
                .iter()
                .map(|(t, p)| (t / 1e3, p.clone()))
                .collect(),
        }
    }
}

/// One recorded run.
#[derive(Debug, Clone, Serialize)]
struct Run {
    allocated_peak: u64,
    reserved_peak: u64,
    sampled_peak: u64,
    reserved_after_session: Vec<u64>,
    allocated_after_session: Vec<u64>,
    session_s: Vec<f64>,
    ttfc_s: Vec<f64>,
    chunk_s: Vec<f64>,
    /// The index within its session of each chunk of `chunk_s`.
    chunk_index: Vec<usize>,
    /// Minor page faults of the whole process during each session.
    faults: Vec<u64>,
    reclaims: u64,
    reclaim_s: f64,
    sha256: Vec<String>,
    #[serde(skip)]
    recording: Recording,
    #[serde(skip)]
    collectives: std::collections::BTreeMap<String, headroom_tensor::comm::OpTotals>,
}

/// One (allocator, policy) pair's medians across repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyRow {
    /// Allocator policy.
    pub allocator: String,
    /// Reclaim policy.
    pub policy: String,
    /// Allocator's exact allocated peak (median over reps).
    pub allocated_peak_bytes: f64,
    /// Allocator's exact reserved peak.
    pub reserved_peak_bytes: f64,
    /// Highest sampled reserved bytes.
    pub sampled_peak_bytes: f64,
    /// Reserved bytes after each session closed.
    pub reserved_after_session_bytes: Vec<f64>,
    /// Allocated (live) bytes after each session closed: the bound for the row above.
    pub allocated_after_session_bytes: Vec<f64>,
    /// Median session time.
    pub e2e_s: f64,
    /// Median minor page faults of the process per session (fresh pages first touched:
    /// an arena mapped anew each session shows here).
    pub page_faults_per_session: f64,
    /// Median time to first chunk.
    pub ttfc_s: f64,
    /// Chunk time percentiles over every chunk of every rep.
    pub chunk_p50_s: f64,
    /// 95th percentile chunk time.
    pub chunk_p95_s: f64,
    /// Median time of each chunk index (the first chunk of a session makes 9 frames,
    /// the rest 12, so a p50 over all of them can fall between two groups): what
    /// allocators are best compared by.
    pub chunk_p50_by_index_s: Vec<f64>,
    /// Reclaims per run.
    pub reclaims: f64,
    /// Reclaim seconds per run.
    pub reclaim_s: f64,
    /// Reclaim time over chunk time.
    pub reclaim_share: f64,
    /// Ranges across reps of the peaks.
    pub reserved_peak_range: Spread,
    /// Frame hashes of each session (first rep).
    pub output_sha256: Vec<String>,
    /// Reserved peak over allocated peak − 1 (the goal: ≤ 5 %).
    pub reserved_over_allocated: f64,
    /// Every rank's figures, on a mesh (empty when unsharded).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<ranks::RankRow>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct SessionBenchSummary {
    /// Model.
    pub model: String,
    /// Allocator policies, comma-separated.
    pub allocator: String,
    /// Sessions per run.
    pub sessions: usize,
    /// Warm-up runs per policy.
    pub warmup: usize,
    /// Recorded runs per policy.
    pub reps: usize,
    /// Whether every session's frames hash the same under every policy and rep.
    pub hashes_match: bool,
    /// One row per policy.
    pub policies: Vec<PolicyRow>,
}

fn io_err(path: &std::path::Path, e: impl std::fmt::Display) -> BenchError {
    BenchError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Runs one engine through `sessions` sessions, sampling memory in the background.
fn run_once(
    config: &SessionBenchConfig,
    (allocator, policy): (AllocatorPolicy, ReclaimPolicy),
    rep: usize,
) -> Result<Run> {
    let engine_config = EngineConfig {
        model: config.model.clone(),
        allocator: AllocatorConfig {
            max_split_size: config.max_split_size,
            ..AllocatorConfig::with_policy(allocator)
        },
        reclaim: policy,
        capacity: config.capacity,
        weight_dtype: config.dtype,
        weights: config.weights,
        decoder: config.decoder,
        tiny_decoder: config.tiny_decoder.clone(),
        ..EngineConfig::default()
    };
    let engine = match &config.groups {
        Some(groups) => engine_config
            .cpu_platform()
            .and_then(|p| Engine::load(engine_config, Placement::rank(Device::new(p), groups))),
        None => Engine::new(engine_config),
    }
    .map_err(|e| BenchError::InvalidConfig {
        field: "engine",
        rule: e.to_string(),
    })?;
    let meter = engine
        .transformer()
        .sharding()
        .map(|s| Arc::clone(&s.meter));
    let platform: Arc<dyn Platform> = engine.platform().clone();
    platform.reset_peak_stats();
    let tags = Mutex::new(Tags {
        phase: "start",
        ..Tags::default()
    });
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let mut run = Run {
        allocated_peak: 0,
        reserved_peak: 0,
        sampled_peak: 0,
        reserved_after_session: Vec::new(),
        allocated_after_session: Vec::new(),
        session_s: Vec::new(),
        ttfc_s: Vec::new(),
        chunk_s: Vec::new(),
        chunk_index: Vec::new(),
        faults: Vec::new(),
        reclaims: 0,
        reclaim_s: 0.0,
        sha256: Vec::new(),
        recording: Recording::default(),
        collectives: Default::default(),
    };
    let recording = Mutex::new(Recording::default());
    let result = std::thread::scope(|scope| -> Result<()> {
        scope.spawn(|| {
            let allocator = platform.allocator();
            let mut seen = 0u64;
            let mut last_phase = String::from("none");
            while !stop.load(Ordering::Relaxed) {
                let s = platform.memory_stats();
                let (free, total) = platform.mem_info();
                let t_ms = start.elapsed().as_secs_f64() * 1e3;
                let tags = tags.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let reserved = s.reserved_bytes.all().current.max(0) as u64;
                let (count, name) = allocator.phase_mark();
                let mut rec = recording.lock().unwrap_or_else(|p| p.into_inner());
                if count != seen {
                    // Boundaries crossed since the last reading (only the last is named).
                    seen = count;
                    last_phase = name.unwrap_or_default();
                    rec.marks.push((t_ms, last_phase.clone()));
                }
                rec.samples.push(Sample {
                    t_ms,
                    rep,
                    tags,
                    last_phase: last_phase.clone(),
                    allocated: s.allocated_bytes.all().current.max(0) as u64,
                    reserved,
                    device_used: total - free,
                    rss: process_rss_bytes().unwrap_or(0),
                });
                drop(rec);
                std::thread::sleep(Duration::from_millis(config.sample_ms.max(1)));
            }
        });
        let outcome = (|| -> Result<()> {
            for session_index in 0..config.sessions {
                let request = SessionRequest {
                    seed: config.seed,
                    ..SessionRequest::new(config.width, config.height, config.frames)
                };
                let session_start = Instant::now();
                let faults_before = process_minor_faults().unwrap_or(0);
                let mut session =
                    engine
                        .open_session(request)
                        .map_err(|e| BenchError::InvalidConfig {
                            field: "session",
                            rule: e.to_string(),
                        })?;
                let mut hasher = Sha256::new();
                for chunk_index in 0..crate::finite_chunks(&session)? {
                    *tags.lock().unwrap_or_else(|p| p.into_inner()) = Tags {
                        session: session_index,
                        chunk: chunk_index,
                        phase: "chunk",
                    };
                    let t = Instant::now();
                    let chunk = session
                        .next_chunk()
                        .map_err(|e| BenchError::InvalidConfig {
                            field: "session",
                            rule: e.to_string(),
                        })?;
                    let secs = t.elapsed().as_secs_f64();
                    if chunk_index == 0 {
                        run.ttfc_s.push(session_start.elapsed().as_secs_f64());
                    }
                    run.chunk_s.push(secs);
                    run.chunk_index.push(chunk_index);
                    hasher.update(chunk.frames.to_vec::<u8>()?);
                }
                *tags.lock().unwrap_or_else(|p| p.into_inner()) = Tags {
                    session: session_index,
                    chunk: 0,
                    phase: "closed",
                };
                drop(session);
                run.session_s.push(session_start.elapsed().as_secs_f64());
                run.faults.push(
                    process_minor_faults()
                        .unwrap_or(0)
                        .saturating_sub(faults_before),
                );
                let after = platform.memory_stats();
                run.reserved_after_session
                    .push(after.reserved_bytes.all().current.max(0) as u64);
                run.allocated_after_session
                    .push(after.allocated_bytes.all().current.max(0) as u64);
                run.sha256.push(
                    hasher
                        .finalize()
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect(),
                );
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        outcome
    });
    result?;
    let s = platform.memory_stats();
    run.allocated_peak = s.allocated_bytes.all().peak as u64;
    run.reserved_peak = s.reserved_bytes.all().peak as u64;
    run.recording = recording.into_inner().unwrap_or_else(|p| p.into_inner());
    run.sampled_peak = run
        .recording
        .samples
        .iter()
        .map(|s| s.reserved)
        .max()
        .unwrap_or(0);
    run.reclaims = s.num_reclaims;
    run.reclaim_s = s.reclaim_ns as f64 / 1e9;
    run.collectives = meter.map(|m| m.totals()).unwrap_or_default();
    Ok(run)
}

fn row((allocator, label): (&str, &str), runs: &[Run]) -> PolicyRow {
    let med = |f: &dyn Fn(&Run) -> f64| {
        crate::stats::median(&runs.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0)
    };
    let sessions = runs.first().map_or(0, |r| r.reserved_after_session.len());
    let chunks: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.chunk_s.iter().copied())
        .collect();
    let chunk_total = med(&|r| r.chunk_s.iter().sum());
    let allocated = med(&|r| r.allocated_peak as f64);
    let reserved = med(&|r| r.reserved_peak as f64);
    let reclaim_s = med(&|r| r.reclaim_s);
    PolicyRow {
        allocator: allocator.to_string(),
        policy: label.to_string(),
        allocated_peak_bytes: allocated,
        reserved_peak_bytes: reserved,
        sampled_peak_bytes: med(&|r| r.sampled_peak as f64),
        reserved_after_session_bytes: (0..sessions)
            .map(|i| med(&|r| r.reserved_after_session[i] as f64))
            .collect(),
        allocated_after_session_bytes: (0..sessions)
            .map(|i| med(&|r| r.allocated_after_session[i] as f64))
            .collect(),
        e2e_s: crate::stats::median(
            &runs
                .iter()
                .flat_map(|r| r.session_s.iter().copied())
                .collect::<Vec<_>>(),
        )
        .unwrap_or(0.0),
        page_faults_per_session: crate::stats::median(
            &runs
                .iter()
                .flat_map(|r| r.faults.iter().map(|&f| f as f64))
                .collect::<Vec<_>>(),
        )
        .unwrap_or(0.0),
        ttfc_s: crate::stats::median(
            &runs
                .iter()
                .flat_map(|r| r.ttfc_s.iter().copied())
                .collect::<Vec<_>>(),
        )
        .unwrap_or(0.0),
        chunk_p50_s: percentile(&chunks, 50.0).unwrap_or(0.0),
        chunk_p95_s: percentile(&chunks, 95.0).unwrap_or(0.0),
        chunk_p50_by_index_s: (0..runs
            .iter()
            .flat_map(|r| r.chunk_index.iter().map(|&i| i + 1))
            .max()
            .unwrap_or(0))
            .map(|index| {
                let times: Vec<f64> = runs
                    .iter()
                    .flat_map(|r| r.chunk_index.iter().zip(&r.chunk_s))
                    .filter(|(&i, _)| i == index)
                    .map(|(_, &t)| t)
                    .collect();
                crate::stats::median(&times).unwrap_or(0.0)
            })
            .collect(),
        reclaims: med(&|r| r.reclaims as f64),
        reclaim_s,
        reclaim_share: if chunk_total > 0.0 {
            reclaim_s / chunk_total
        } else {
            0.0
        },
        reserved_peak_range: Spread::of(
            &runs
                .iter()
                .map(|r| r.reserved_peak as f64)
                .collect::<Vec<_>>(),
        )
        .unwrap_or(Spread {
            median: 0.0,
            min: 0.0,
            max: 0.0,
        }),
        output_sha256: runs.first().map(|r| r.sha256.clone()).unwrap_or_default(),
        reserved_over_allocated: if allocated > 0.0 {
            reserved / allocated - 1.0
        } else {
            0.0
        },
        ranks: Vec::new(),
    }
}

/// Runs the benchmark and writes `samples.csv`, `summary.json`, `summary.md` and
/// `memory.png` to `out`.
pub fn run_session_bench(config: &SessionBenchConfig) -> Result<SessionBenchSummary> {
    if config.policies.is_empty()
        || config.allocators.is_empty()
        || config.sessions == 0
        || config.reps == 0
    {
        return Err(BenchError::InvalidConfig {
            field: "allocators / policies / sessions / reps",
            rule: "need at least one allocator, one policy, one session and one rep".to_string(),
        });
    }
    std::fs::create_dir_all(&config.out).map_err(|e| io_err(&config.out, e))?;
    let pairs: Vec<(AllocatorPolicy, ReclaimPolicy)> = config
        .allocators
        .iter()
        .flat_map(|&a| config.policies.iter().map(move |&p| (a, p)))
        .collect();
    let names: Vec<(String, String)> = pairs
        .iter()
        .map(|(a, p)| (a.to_string(), p.to_string()))
        .collect();
    // One label per pair for the samples and the plot: the policy alone when there is
    // one allocator, as before.
    let labels: Vec<String> = names
        .iter()
        .map(|(a, p)| {
            if config.allocators.len() > 1 {
                format!("{a} {p}")
            } else {
                p.clone()
            }
        })
        .collect();
    for _ in 0..config.warmup {
        for &pair in &pairs {
            run_once(config, pair, 0)?;
        }
    }
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); pairs.len()];
    for rep in 1..=config.reps {
        for (&pair, pair_runs) in pairs.iter().zip(runs.iter_mut()) {
            pair_runs.push(run_once(config, pair, rep)?);
        }
    }
    let reference = &runs[0][0].sha256;
    let hashes_match = runs.iter().flatten().all(|r| &r.sha256 == reference);
    let mut summary = SessionBenchSummary {
        model: config.model.clone(),
        allocator: config
            .allocators
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        sessions: config.sessions,
        warmup: config.warmup,
        reps: config.reps,
        hashes_match,
        policies: names
            .iter()
            .zip(&runs)
            .map(|((a, p), r)| row((a, p), r))
            .collect(),
    };
    if let Some(groups) = &config.groups {
        let mine: Vec<ranks::Measured> = runs
            .iter()
            .map(|r| ranks::Measured {
                allocated_peak: r[0].allocated_peak,
                reserved_peak: r[0].reserved_peak,
                chunks: r[0].chunk_s.len(),
                collectives: r[0].collectives.clone(),
            })
            .collect();
        let rows = ranks::gather(config, groups, &pairs, &mine)?;
        for (row, ranks) in summary.policies.iter_mut().zip(rows) {
            row.ranks = ranks;
        }
        if groups.rank() != 0 {
            return Ok(summary);
        }
    }
    let write = |name: &str, text: String| {
        let path = config.out.join(name);
        std::fs::write(&path, text).map_err(|e| io_err(&path, e))
    };
    let mut csv = format!("{SAMPLES_CSV_HEADER}\n");
    for rep in 0..config.reps {
        for (label, policy_runs) in labels.iter().zip(&runs) {
            policy_runs[rep].recording.csv_rows(label, &mut csv);
        }
    }
    write("samples.csv", csv)?;
    let panels: Vec<_> = labels
        .iter()
        .zip(&runs)
        .map(|(label, r)| r[0].recording.panel(label))
        .collect();
    crate::plot::write_memory_png(
        &config.out.join("memory.png"),
        &panels,
        crate::plot::XAxis::Seconds,
        "first recorded repetition of each policy; time from the engine's start",
    )?;
    write(
        "summary.json",
        serde_json::to_string_pretty(&summary).unwrap_or_default(),
    )?;
    write("summary.md", markdown(&summary))?;
    Ok(summary)
}

/// The summary as a Markdown table, with the goal stated per policy.
pub fn markdown(s: &SessionBenchSummary) -> String {
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let mut out = format!(
        "# bench session: {} ({} allocator), {} sessions × {} reps after {} warm-up\n\n",
        s.model, s.allocator, s.sessions, s.reps, s.warmup
    );
    out.push_str("| allocator | policy | allocated peak MiB | reserved peak MiB | sampled peak MiB | reserved after session 1 / N MiB | allocated after session N MiB | session s | page faults / session | TTFC s | chunk p50 / p95 s | reclaims | reclaim share | reserved over allocated |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for p in &s.policies {
        let first = p
            .reserved_after_session_bytes
            .first()
            .copied()
            .unwrap_or(0.0);
        let last = p
            .reserved_after_session_bytes
            .last()
            .copied()
            .unwrap_or(0.0);
        let live = p
            .allocated_after_session_bytes
            .last()
            .copied()
            .unwrap_or(0.0);
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} / {:.1} | {:.1} | {:.2} | {:.0} | {:.2} | {:.2} / {:.2} | {:.0} | {:.3} % | {:+.1} % |",
            p.allocator,
            p.policy,
            mib(p.allocated_peak_bytes),
            mib(p.reserved_peak_bytes),
            mib(p.sampled_peak_bytes),
            mib(first),
            mib(last),
            mib(live),
            p.e2e_s,
            p.page_faults_per_session,
            p.ttfc_s,
            p.chunk_p50_s,
            p.chunk_p95_s,
            p.reclaims,
            100.0 * p.reclaim_share,
            100.0 * p.reserved_over_allocated
        );
    }
    out.push('\n');
    for p in &s.policies {
        let by_index: Vec<String> = p
            .chunk_p50_by_index_s
            .iter()
            .map(|t| format!("{t:.2}"))
            .collect();
        let _ = writeln!(
            out,
            "- {} {}: chunk p50 by chunk index {} s",
            p.allocator,
            p.policy,
            by_index.join(" / ")
        );
    }
    let _ = writeln!(
        out,
        "\nOutput hashes {} across policies and reps.\n",
        if s.hashes_match { "match" } else { "DIFFER" }
    );
    out.push_str("Goal: reserved peak within 5 % of the allocated peak with reclaim time under 1 % of chunk time.\n\n");
    for p in &s.policies {
        let meets = p.reserved_over_allocated <= 0.05 && p.reclaim_share < 0.01;
        let _ = writeln!(
            out,
            "- {} {}: reserved {:+.1} % over allocated, reclaim {:.3} % of chunk time → {}",
            p.allocator,
            p.policy,
            100.0 * p.reserved_over_allocated,
            100.0 * p.reclaim_share,
            if meets {
                "meets the goal"
            } else {
                "does not meet the goal"
            }
        );
    }
    for p in s.policies.iter().filter(|p| !p.ranks.is_empty()) {
        out.push_str(&ranks::markdown(
            &p.ranks,
            &format!("{} {}", p.allocator, p.policy),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_ms: f64, allocated: u64, reserved: u64) -> Sample {
        Sample {
            t_ms,
            rep: 1,
            tags: Tags {
                session: 0,
                chunk: 1,
                phase: "chunk",
            },
            last_phase: "decode_start".to_string(),
            allocated,
            reserved,
            device_used: reserved,
            rss: 7,
        }
    }

    #[test]
    fn csv_rows_have_the_header_columns() {
        let rec = Recording {
            samples: vec![sample(1.0, 10, 20), sample(2.5, 5, 20)],
            marks: vec![(2.0, "decode_start".to_string())],
        };
        let mut out = String::new();
        rec.csv_rows("fit:slack=0.04", &mut out);
        let columns = SAMPLES_CSV_HEADER.split(',').count();
        assert_eq!(out.lines().count(), 2);
        for line in out.lines() {
            assert_eq!(line.split(',').count(), columns, "{line}");
        }
        assert!(out.starts_with("1.0,fit:slack=0.04,1,0,1,chunk,10,20,20,7,decode_start"));
        let panel = rec.panel("fit");
        assert_eq!(panel.points, vec![(0.001, 10, 20), (0.0025, 5, 20)]);
        assert_eq!(panel.marks, vec![(0.002, "decode_start".to_string())]);
    }

    #[test]
    fn rows_take_medians_across_reps_and_state_the_goal() {
        let run = |alloc: u64, reserved: u64, reclaim_s: f64| Run {
            allocated_peak: alloc,
            reserved_peak: reserved,
            sampled_peak: reserved,
            reserved_after_session: vec![reserved / 2, reserved / 2],
            allocated_after_session: vec![alloc / 2, alloc / 2],
            session_s: vec![2.0, 2.0],
            ttfc_s: vec![1.0, 1.0],
            chunk_s: vec![1.0, 3.0, 1.0, 3.0],
            chunk_index: vec![0, 1, 0, 1],
            faults: vec![10, 30],
            reclaims: 1,
            reclaim_s,
            sha256: vec!["a".into(), "b".into()],
            recording: Recording::default(),
            collectives: Default::default(),
        };
        let r = row(
            ("pytorch", "fit"),
            &[
                run(100, 104, 0.01),
                run(100, 110, 0.02),
                run(100, 102, 0.03),
            ],
        );
        assert_eq!(r.reserved_peak_bytes, 104.0);
        assert!((r.reserved_over_allocated - 0.04).abs() < 1e-12);
        assert!((r.reclaim_share - 0.02 / 8.0).abs() < 1e-12);
        // The p50 over every chunk falls between the two chunk lengths; by index it
        // does not.
        assert_eq!(r.chunk_p50_s, 2.0);
        assert_eq!(r.chunk_p50_by_index_s, vec![1.0, 3.0]);
        assert_eq!(r.page_faults_per_session, 20.0);
        assert_eq!(r.reserved_after_session_bytes, vec![52.0, 52.0]);
        assert_eq!(r.allocated_after_session_bytes, vec![50.0, 50.0]);
        let row_json = serde_json::to_value(&r).unwrap();
        assert_eq!(row_json["allocator"], "pytorch");
        let summary = SessionBenchSummary {
            model: "tiny".into(),
            allocator: "pytorch".into(),
            sessions: 2,
            warmup: 0,
            reps: 3,
            hashes_match: true,
            policies: vec![r],
        };
        let md = markdown(&summary);
        assert!(md.contains("- pytorch fit: reserved +4.0 % over allocated, reclaim 0.250 % of chunk time → meets the goal"), "{md}");
        assert!(
            md.contains("- pytorch fit: chunk p50 by chunk index 1.00 / 3.00 s"),
            "{md}"
        );
        let json: serde_json::Value = serde_json::to_value(&summary).unwrap();
        for key in [
            "model",
            "allocator",
            "sessions",
            "warmup",
            "reps",
            "hashes_match",
            "policies",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
    }
}
