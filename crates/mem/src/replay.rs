//! Replaying allocation traces through a platform: our JSON-lines format or the
//! `device_traces` of a PyTorch snapshot pickle, so a user can run their own PyTorch
//! trace through our policies.
//!
//! JSON lines, one object per line:
//! `{"op":"alloc","id":7,"size":1048576,"stream":0}` (stream optional),
//! `{"op":"free","id":7}`, `{"op":"empty_cache"}`, `{"op":"phase","name":"decode_start"}`.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Deserialize;

use crate::allocator::Allocation;
use crate::error::{MemError, Result};
use crate::pickle::{from_pickle, PickleValue};
use crate::platform::Platform;
use crate::reclaim::Phase;
use crate::stats::MemoryStats;

/// One step of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceOp {
    /// Allocate `size` bytes on `stream` under the name `id`.
    Alloc {
        /// Name of the allocation, used by its free.
        id: u64,
        /// Bytes requested.
        size: u64,
        /// Stream of the request.
        stream: u32,
    },
    /// Free the allocation named `id`.
    Free {
        /// Name given at allocation.
        id: u64,
    },
    /// Call `empty_cache`.
    EmptyCache,
    /// Cross a phase boundary (the reclaim policy may act).
    Phase(Phase),
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Line {
    Alloc {
        id: u64,
        size: u64,
        #[serde(default)]
        stream: u32,
    },
    Free {
        id: u64,
    },
    EmptyCache,
    Phase {
        name: String,
    },
}

/// Parses a JSON-lines trace; a malformed line is an error naming its number and why.
pub fn parse_jsonl(text: &str) -> Result<Vec<TraceOp>> {
    let mut ops = Vec::new();
    let mut live = HashSet::new();
    let mut seen = HashSet::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let err = |reason: String| MemError::TraceLine { line, reason };
        let parsed: Line = serde_json::from_str(raw).map_err(|e| err(e.to_string()))?;
        let op = match parsed {
            Line::Alloc { id, size, stream } => {
                if !live.insert(id) {
                    return Err(err(format!("alloc id {id} is already live")));
                }
                seen.insert(id);
                TraceOp::Alloc { id, size, stream }
            }
            Line::Free { id } => {
                if !live.remove(&id) {
                    let why = if seen.contains(&id) {
                        "was already freed"
                    } else {
                        "was never allocated"
                    };
                    return Err(err(format!("free of id {id}, which {why}")));
                }
                TraceOp::Free { id }
            }
            Line::EmptyCache => TraceOp::EmptyCache,
            Line::Phase { name } => {
                TraceOp::Phase(name.parse().map_err(|e: MemError| err(e.to_string()))?)
            }
        };
        ops.push(op);
    }
    Ok(ops)
}

/// Reads the `alloc` / `free_completed` events of device 0 from a PyTorch snapshot
/// pickle. Frees of blocks allocated before recording started are skipped; streams are
/// renumbered in order of appearance (0 stays 0).
pub fn parse_pytorch_snapshot(bytes: &[u8]) -> Result<Vec<TraceOp>> {
    let bad = |what: &str| MemError::Snapshot(what.to_string());
    let root = from_pickle(bytes)?;
    let traces = root
        .get("device_traces")
        .and_then(PickleValue::as_list)
        .ok_or_else(|| {
            bad("no device_traces list: is this a torch.cuda.memory._snapshot() pickle?")
        })?;
    let Some(device0) = traces.first() else {
        return Ok(Vec::new());
    };
    let events = device0
        .as_list()
        .ok_or_else(|| bad("device_traces[0] is not a list"))?;
    let mut ops = Vec::new();
    let mut live_by_addr: HashMap<i64, u64> = HashMap::new();
    let mut streams: HashMap<i64, u32> = HashMap::from([(0, 0)]);
    let mut next_id = 0u64;
    for (index, event) in events.iter().enumerate() {
        let field = |name: &str| {
            event
                .get(name)
                .and_then(PickleValue::as_int)
                .ok_or_else(|| {
                    MemError::Snapshot(format!("device_traces[0][{index}] has no integer {name:?}"))
                })
        };
        let action = event
            .get("action")
            .and_then(PickleValue::as_str)
            .ok_or_else(|| {
                MemError::Snapshot(format!("device_traces[0][{index}] has no action"))
            })?;
        match action {
            "alloc" => {
                let addr = field("addr")?;
                let size = u64::try_from(field("size")?).map_err(|_| {
                    MemError::Snapshot(format!("device_traces[0][{index}] has a negative size"))
                })?;
                let raw_stream = event
                    .get("stream")
                    .and_then(PickleValue::as_int)
                    .unwrap_or(0);
                let next_stream = streams.len() as u32;
                let stream = *streams.entry(raw_stream).or_insert(next_stream);
                let id = next_id;
                next_id += 1;
                if let Some(previous) = live_by_addr.insert(addr, id) {
                    // PyTorch never hands out a live address twice; treat the old one as
                    // freed so the replay stays balanced.
                    ops.push(TraceOp::Free { id: previous });
                }
                ops.push(TraceOp::Alloc { id, size, stream });
            }
            "free_completed" => {
                if let Some(id) = live_by_addr.remove(&field("addr")?) {
                    ops.push(TraceOp::Free { id });
                }
            }
            _ => {}
        }
    }
    Ok(ops)
}

/// Parses a trace file's bytes: a pickle (starts with the PROTO opcode) or JSON lines.
pub fn parse_trace(bytes: &[u8]) -> Result<Vec<TraceOp>> {
    if bytes.first() == Some(&0x80) {
        return parse_pytorch_snapshot(bytes);
    }
    let text = std::str::from_utf8(bytes).map_err(|e| MemError::TraceLine {
        line: 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count(),
        reason: "not UTF-8 text (and not a pickle)".to_string(),
    })?;
    parse_jsonl(text)
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    /// Operations replayed.
    pub ops: usize,
    /// Allocations that failed with out of memory.
    pub failed_allocs: u64,
    /// Frees skipped because their allocation had failed.
    pub ignored_frees: u64,
    /// Reclaims the policy performed at phase lines.
    pub reclaims: u64,
    /// Allocator statistics at the end (allocations still live are not freed).
    pub stats: MemoryStats,
}

/// Runs `ops` on `platform`. Allocations that fail are counted and the replay goes on;
/// a later free of such an allocation is ignored. Allocations still live at the end are
/// released after the statistics are taken.
///
/// Under the `planned` allocator each stretch between `session_end` / `error` lines is a
/// span (`replay:0`, `replay:1`, …): recorded when the allocator has no plan for it,
/// replayed when it has (see [`replay_planned`]).
pub fn replay(platform: &dyn Platform, ops: &[TraceOp]) -> ReplayReport {
    let allocator = platform.allocator();
    let mut spans = 0usize;
    let mut begin_span = || {
        // A span whose arenas do not fit is served by the caching path instead.
        let _ = allocator.begin_span(&format!("replay:{spans}"));
        spans += 1;
    };
    begin_span();
    // Ordered, so that what is still live at the end is released in a fixed order.
    let mut live: BTreeMap<u64, Allocation> = BTreeMap::new();
    let mut failed = HashSet::new();
    let mut report = ReplayReport {
        ops: ops.len(),
        failed_allocs: 0,
        ignored_frees: 0,
        reclaims: 0,
        stats: MemoryStats::default(),
    };
    for op in ops {
        match *op {
            TraceOp::Alloc { id, size, stream } => match allocator.allocate(size, stream) {
                Ok(allocation) => {
                    failed.remove(&id);
                    live.insert(id, allocation);
                }
                Err(_) => {
                    report.failed_allocs += 1;
                    failed.insert(id);
                }
            },
            TraceOp::Free { id } => {
                if live.remove(&id).is_none() && failed.remove(&id) {
                    report.ignored_frees += 1;
                }
            }
            TraceOp::EmptyCache => platform.empty_cache(),
            TraceOp::Phase(phase) => {
                if platform.phase(phase).is_some() {
                    report.reclaims += 1;
                }
                if matches!(phase, Phase::SessionEnd | Phase::Error) {
                    begin_span();
                }
            }
        }
    }
    report.stats = platform.memory_stats();
    // What is live at the end is freed inside the span, so a recording plans it too.
    drop(live);
    allocator.end_span();
    report
}

/// Replays `ops` under the `planned` allocator as it is meant to run: a first pass on
/// `recorder` records every span and plans it, then the plans are installed in
/// `platform` and the trace is replayed there; the report is the second pass's.
pub fn replay_planned(
    recorder: &dyn Platform,
    platform: &dyn Platform,
    ops: &[TraceOp],
) -> ReplayReport {
    replay(recorder, ops);
    platform
        .allocator()
        .install_plans(&recorder.allocator().plans());
    replay(platform, ops)
}

/// How `headroom mem replay` replays a trace: the allocator, the modelled device and the
/// reclaim policy at phase lines.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Allocator policy (`planned`: each stretch recorded once, planned, then replayed).
    pub allocator: crate::allocator::AllocatorPolicy,
    /// Bytes of the modelled device.
    pub capacity: u64,
    /// PyTorch's `max_split_size`; unlimited when `None`.
    pub max_split_size: Option<u64>,
    /// Reclaim policy at phase lines.
    pub policy: crate::reclaim::ReclaimPolicy,
    /// Allocator events kept for the final snapshot (0: none).
    pub history: usize,
}

/// Replays `ops` as `headroom mem replay` does, on a `sim` device of
/// `options.capacity`: under `planned`, first recorded on a twin and planned
/// ([`replay_planned`]). Returns the report and the platform, whose allocator holds the
/// final snapshot.
pub fn replay_on_sim(
    ops: &[TraceOp],
    options: &ReplayOptions,
) -> Result<(ReplayReport, crate::platform::CachingPlatform)> {
    use crate::allocator::{AllocatorConfig, AllocatorPolicy};
    use crate::platform::CachingPlatform;
    let config = AllocatorConfig {
        policy: options.allocator,
        max_split_size: options.max_split_size,
        history: options.history,
    };
    let platform = CachingPlatform::sim(options.capacity, config.clone(), options.policy)?;
    let report = if options.allocator == AllocatorPolicy::Planned {
        let recorder = CachingPlatform::sim(
            options.capacity,
            AllocatorConfig {
                history: 0,
                ..config
            },
            options.policy,
        )?;
        replay_planned(&recorder, &platform, ops)
    } else {
        replay(&platform, ops)
    };
    Ok((report, platform))
}

impl ReplayReport {
    /// The reserved peak over the allocated peak (1 when nothing was allocated).
    pub fn reserved_over_allocated_peak(&self) -> f64 {
        let allocated = self.stats.allocated_bytes.all().peak.max(0) as u64;
        let reserved = self.stats.reserved_bytes.all().peak.max(0) as u64;
        if allocated > 0 {
            reserved as f64 / allocated as f64
        } else {
            1.0
        }
    }

    /// The object `headroom mem replay --json` prints for a replay of `trace` under
    /// `options`: the statistics under PyTorch's keys, then what was replayed and how.
    pub fn to_json(&self, trace: &str, options: &ReplayOptions) -> serde_json::Value {
        let mut object = serde_json::Map::new();
        for (key, value) in self.stats.to_map() {
            object.insert(key, value.into());
        }
        object.insert("trace".into(), trace.into());
        object.insert("ops".into(), self.ops.into());
        object.insert("failed_allocs".into(), self.failed_allocs.into());
        object.insert("ignored_frees".into(), self.ignored_frees.into());
        object.insert("allocator".into(), options.allocator.name().into());
        object.insert("policy".into(), options.policy.to_string().into());
        object.insert(
            "reserved_over_allocated_peak".into(),
            self.reserved_over_allocated_peak().into(),
        );
        object.insert("capacity".into(), options.capacity.into());
        serde_json::Value::Object(object)
    }
}
