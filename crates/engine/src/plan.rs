//! Planning a deployment (`headroom plan`): predicts per-rank device memory of a deployment (model, resolution,
//! TP × SP layout, capacity, allocator, reclaim policy) by running a whole session as
//! meta execution: every rank's engine on a `sim` platform makes the allocator's real
//! decisions for every chunk's denoise, commit and decode without computing anything.
//! Run on `cpu` platforms instead, the same code measures what it predicted.

use std::sync::Arc;

use headroom_mem::{
    AllocatorConfig, AllocatorPolicy, CachingPlatform, MemoryStats, PlanBook, Platform,
    ReclaimPolicy, TraceEvent,
};
use headroom_tensor::DType;
use serde::Serialize;

use crate::config::EngineConfig;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::mesh::Mesh;
use crate::request::SessionRequest;
use crate::session::Session;

/// Where the plan runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanPlatform {
    /// Meta execution on a modelled device (the prediction).
    Sim,
    /// Real execution in host memory limited to the capacity (the measurement).
    Cpu,
}

/// What to plan.
#[derive(Debug, Clone)]
pub struct PlanConfig {
    /// Built-in model name or a diffusers pipeline folder.
    pub model: String,
    /// A transformer checkpoint over `model` (any supported layout).
    pub transformer: Option<String>,
    /// Video height.
    pub height: usize,
    /// Video width.
    pub width: usize,
    /// Frames of the session (12·K − 3).
    pub frames: usize,
    /// Parallel layout.
    pub mesh: Mesh,
    /// Device capacity per rank.
    pub capacity: u64,
    /// Allocator of every rank.
    pub allocator: AllocatorConfig,
    /// Policies planned, one full run each.
    pub policies: Vec<ReclaimPolicy>,
    /// KV pool as a fraction of the memory free after the weights (`None`: one
    /// session's window exactly).
    pub kv_fraction: Option<f64>,
    /// Chunks to run (`None`: the whole session).
    pub chunks: Option<usize>,
    /// Weight dtype.
    pub weight_dtype: DType,
    /// How the DiT blocks' linear weights are held (`--weights`).
    pub weights: headroom_model::WeightFormat,
    /// Allocator events kept per rank for plots and snapshots (0: none).
    pub history: usize,
    /// Sim (predict) or cpu (measure).
    pub platform: PlanPlatform,
    /// The session's decoder.
    pub decoder: headroom_model::DecoderKind,
    /// A tiny decoder file (`None`: the model folder's, or the released shapes).
    pub tiny_decoder: Option<std::path::PathBuf>,
}

/// One rank's memory under one policy.
#[derive(Debug, Clone, Serialize)]
pub struct RankPlan {
    /// World rank (`sp_rank · tp + tp_rank`).
    pub rank: usize,
    /// Reclaim policy.
    pub policy: String,
    /// Bytes allocated by the loaded weights (transformer share + VAE).
    pub weights_bytes: u64,
    /// Bytes of the KV page pool.
    pub kv_bytes: u64,
    /// Bytes the streaming decoder's caches declare for the resolution.
    pub decoder_state_bytes: u64,
    /// Bytes of the session's text keys/values and image condition.
    pub conditioning_bytes: u64,
    /// The allocator's allocated peak over load, session and close.
    pub peak_allocated_bytes: u64,
    /// The allocator's reserved peak (what the device must hold).
    pub peak_reserved_bytes: u64,
    /// Reserved bytes once the session has closed.
    pub post_session_reserved_bytes: u64,
    /// Capacity minus the reserved peak (negative: does not fit).
    pub headroom_bytes: i64,
    /// Where the reserved peak happened: `load`, `open`, `denoise N` or `decode N`.
    pub peak_phase: String,
    /// This rank's shard of a session snapshot in steady state (what a parked session
    /// holds in host memory), by part.
    pub snapshot: crate::snapshot::SnapshotEstimate,
    /// Allocated bytes while a snapshot is written at the last chunk boundary: what is
    /// live there plus the snapshot's staging buffer (one layer's KV history, gathered
    /// for one device-to-host copy).
    pub snapshot_write_allocated_bytes: u64,
    /// What this rank's TP and SP collectives move over the session, by kind (calls and
    /// input bytes; the seconds of a meta execution are not a prediction).
    pub collectives: std::collections::BTreeMap<String, headroom_tensor::comm::OpTotals>,
    /// The allocator's last events (for plots and snapshots).
    #[serde(skip)]
    pub trace: Vec<TraceEvent>,
    /// (allocated, reserved) bytes at the end, where the trace ends.
    #[serde(skip)]
    pub final_bytes: (u64, u64),
    /// A PyTorch-format snapshot pickle of the allocator after the session (memory_viz),
    /// when history was kept.
    #[serde(skip)]
    pub snapshot_pickle: Option<Vec<u8>>,
}

/// The peaks of one stretch of the run, and where the highest reserved one happened.
#[derive(Debug, Default)]
struct PeakTracker {
    allocated: u64,
    reserved: u64,
    phase: String,
}

impl PeakTracker {
    /// Folds in the peaks since the last reset, naming the stretch `phase`, and resets.
    fn stretch(&mut self, platform: &dyn Platform, stats: &MemoryStats, phase: &str) {
        let peak = |s: &headroom_mem::StatArray| s.all().peak.max(0) as u64;
        self.allocated = self.allocated.max(peak(&stats.allocated_bytes));
        if peak(&stats.reserved_bytes) > self.reserved || self.phase.is_empty() {
            self.reserved = peak(&stats.reserved_bytes);
            self.phase = phase.to_string();
        }
        platform.reset_peak_stats();
    }
}

/// Runs the plan: every policy on every rank. Rows come policy by policy, rank by rank.
pub fn run_plan(config: &PlanConfig) -> Result<Vec<RankPlan>> {
    if config.policies.is_empty() {
        return Err(EngineError::request("policies", "need at least one policy"));
    }
    let mut rows = Vec::new();
    for policy in &config.policies {
        rows.extend(plan_policy(config, *policy)?);
    }
    Ok(rows)
}

fn plan_policy(config: &PlanConfig, policy: ReclaimPolicy) -> Result<Vec<RankPlan>> {
    let engine_config = EngineConfig {
        model: config.model.clone(),
        transformer: config.transformer.clone(),
        allocator: config.allocator.clone(),
        reclaim: policy,
        kv_fraction: config.kv_fraction,
        weight_dtype: config.weight_dtype,
        weights: config.weights,
        capacity: Some(config.capacity),
        decoder: config.decoder,
        tiny_decoder: config.tiny_decoder.clone(),
        ..EngineConfig::default()
    };
    let platform = |_rank: usize| -> Result<Arc<dyn Platform>> {
        let p = match config.platform {
            PlanPlatform::Sim => {
                CachingPlatform::sim(config.capacity, config.allocator.clone(), policy)?
            }
            PlanPlatform::Cpu => {
                CachingPlatform::cpu(Some(config.capacity), config.allocator.clone(), policy)?
            }
        };
        // History from the first byte, so the timeline starts at zero.
        p.allocator().set_history(config.history);
        Ok(Arc::new(p))
    };
    let label = policy.to_string();
    // Sharded ranks cannot meta-execute alone (their collectives need each other), so the
    // planned allocator's plans come from a meta execution of the whole mesh first.
    let books = if config.allocator.policy == AllocatorPolicy::Planned && config.mesh.ranks() > 1 {
        Some(meta_plans(config, &engine_config)?)
    } else {
        None
    };
    let platform = |rank: usize| -> Result<Arc<dyn Platform>> {
        let p = platform(rank)?;
        if let Some(book) = books.as_ref().and_then(|b| b.get(rank)) {
            p.allocator().install_plans(book);
        }
        Ok(p)
    };
    Engine::on_each_rank(config.mesh, &engine_config, platform, |rank, engine| {
        let platform = engine.platform().as_ref();
        let mut peaks = PeakTracker::default();
        let loaded = platform.memory_stats();
        peaks.stretch(platform, &loaded, "load");
        let weights_bytes = loaded.allocated_bytes.all().current as u64;
        let request = SessionRequest::new(config.width, config.height, config.frames);
        let meter = engine
            .transformer()
            .sharding()
            .map(|s| Arc::clone(&s.meter));
        if let Some(m) = &meter {
            m.reset();
        }
        let mut session = engine.open_session(request)?;
        peaks.stretch(platform, &platform.memory_stats(), "open");
        let kv_bytes = engine.kv_pool().map_or(0, |p| p.bytes());
        let decoder_state_bytes = engine
            .decoder_for(None)?
            .state_bytes(config.height, config.width);
        let conditioning_bytes = session.conditioning_bytes();
        let chunks = chunks_to_run(config, engine, &session);
        let mut boundary = 0;
        for k in 0..chunks {
            let chunk = session.next_chunk()?;
            peaks.stretch(platform, &chunk.stats_denoise_end, &format!("denoise {k}"));
            peaks.stretch(platform, &chunk.stats_decoded, &format!("decode {k}"));
            boundary = chunk.stats_decoded.allocated_bytes.all().current.max(0) as u64;
        }
        let snapshot = engine.snapshot_estimate(config.width, config.height, None, false)?;
        drop(session);
        peaks.stretch(platform, &platform.memory_stats(), "close");
        let end = platform.memory_stats();
        let post = end.reserved_bytes.all().current.max(0) as u64;
        let final_bytes = (end.allocated_bytes.all().current.max(0) as u64, post);
        let allocator = platform.allocator();
        Ok(RankPlan {
            rank,
            policy: label.clone(),
            weights_bytes,
            kv_bytes,
            decoder_state_bytes,
            conditioning_bytes,
            peak_allocated_bytes: peaks.allocated,
            peak_reserved_bytes: peaks.reserved,
            post_session_reserved_bytes: post,
            headroom_bytes: config.capacity as i64 - peaks.reserved as i64,
            peak_phase: peaks.phase,
            snapshot,
            snapshot_write_allocated_bytes: boundary + snapshot.staging_bytes,
            collectives: meter.map(|m| m.totals()).unwrap_or_default(),
            trace: allocator.trace(),
            final_bytes,
            snapshot_pickle: (config.history > 0).then(|| allocator.snapshot().to_pickle()),
        })
    })
}

/// Chunks a plan runs: `--chunks`, else the whole session; a session streamed until
/// stopped runs to its steady state ([`Engine::steady_blocks`]), whose chunks every
/// later chunk repeats.
fn chunks_to_run(config: &PlanConfig, engine: &Engine, session: &Session) -> usize {
    let total = session
        .chunks_total()
        .unwrap_or_else(|| engine.steady_blocks());
    config.chunks.unwrap_or(usize::MAX).min(total)
}

/// Runs the session once as meta execution on every rank under the planned allocator
/// (recording) and returns each rank's plans.
fn meta_plans(config: &PlanConfig, engine_config: &EngineConfig) -> Result<Vec<PlanBook>> {
    let platform = |_rank: usize| -> Result<Arc<dyn Platform>> {
        Ok(Arc::new(CachingPlatform::sim(
            config.capacity,
            AllocatorConfig::with_policy(AllocatorPolicy::Planned),
            ReclaimPolicy::Never,
        )?))
    };
    Engine::on_each_rank(config.mesh, engine_config, platform, |_rank, engine| {
        let request = SessionRequest::new(config.width, config.height, config.frames);
        let mut session = engine.open_session(request)?;
        let chunks = chunks_to_run(config, engine, &session);
        for _ in 0..chunks {
            session.next_chunk()?;
        }
        drop(session);
        Ok(engine.platform().allocator().plans())
    })
}

/// The capacity a session that does not fit is planned on, to say what it needs (1 PiB).
pub const UNBOUNDED: u64 = 1 << 50;

/// The weight dtype `plan --dtype` names for `model`: `bf16`, `f32`, or `auto` (the real
/// model shapes are deployed in bf16; everything `generate` runs here, the small
/// built-ins and pipeline folders, runs in f32).
pub fn plan_dtype(model: &str, dtype: &str) -> Result<DType> {
    match dtype {
        "bf16" => Ok(DType::BF16),
        "f32" => Ok(DType::F32),
        "auto" if matches!(model, "wan2.1-t2v-1.3b" | "lingbot-world-v2-14b") => Ok(DType::BF16),
        "auto" => Ok(DType::F32),
        other => Err(EngineError::request(
            "dtype",
            format!("must be auto, bf16 or f32, got {other:?}"),
        )),
    }
}

/// [`run_plan`], and when the session does not fit `config.capacity` (out of memory, or
/// refused for want of room) on a predicted plan without a KV fraction, the same plan on
/// an [`UNBOUNDED`] card to say what it needs, each row's headroom against the real
/// capacity. The flag says whether that happened.
pub fn run_plan_sized(config: &PlanConfig) -> Result<(Vec<RankPlan>, bool)> {
    match run_plan(config) {
        Ok(rows) => Ok((rows, false)),
        Err(e)
            if (e.is_out_of_memory() || e.is_admission())
                && config.platform == PlanPlatform::Sim
                && config.kv_fraction.is_none() =>
        {
            let unbounded = PlanConfig {
                capacity: UNBOUNDED,
                ..config.clone()
            };
            let mut rows = run_plan(&unbounded)?;
            for r in &mut rows {
                r.headroom_bytes = config.capacity as i64 - r.peak_reserved_bytes as i64;
            }
            Ok((rows, true))
        }
        Err(e) => Err(e),
    }
}

/// The plan of every rank under every policy: what `plan --json` prints (and
/// `headroom.plan()` returns).
#[derive(Debug, Serialize)]
pub struct PlanReport<'a> {
    /// Whether every rank fits the card under every policy.
    pub fits: bool,
    /// One row per rank and policy.
    pub ranks: &'a [RankPlan],
}

impl<'a> PlanReport<'a> {
    /// The report of `rows`.
    pub fn new(rows: &'a [RankPlan]) -> Self {
        Self {
            fits: rows.iter().all(|r| r.headroom_bytes >= 0),
            ranks: rows,
        }
    }

    /// The JSON `plan --json` prints: through a `Value`, whose maps keep their keys
    /// sorted, the order it has always printed.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_value(self)
            .and_then(|v| serde_json::to_string_pretty(&v))
            .map_err(|e| EngineError::Internal(format!("the plan's JSON: {e}")))
    }
}
