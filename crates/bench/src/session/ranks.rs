//! `bench session --tp T --sp S`: every rank runs the same benchmark (the same sessions
//! in the same order, so no commands need to cross), and at the end each rank's peaks
//! and collectives are gathered to rank 0, beside what `plan` predicts the collectives
//! move for that rank.

use std::collections::BTreeMap;

use headroom_engine::RankGroups;
use headroom_mem::{AllocatorConfig, AllocatorPolicy, ReclaimPolicy};
use headroom_tensor::comm::OpTotals;
use serde::{Deserialize, Serialize};

use super::SessionBenchConfig;
use crate::plan::{run_plan, PlanConfig, PlanPlatform};
use crate::{BenchError, Result};

/// One rank's figures for one (allocator, policy) pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankRow {
    /// World rank.
    pub rank: usize,
    /// Rank in its TP group.
    pub tp_rank: usize,
    /// Rank in its SP group.
    pub sp_rank: usize,
    /// Allocator's allocated peak (first recorded repetition).
    pub allocated_peak_bytes: u64,
    /// Allocator's reserved peak (first recorded repetition).
    pub reserved_peak_bytes: u64,
    /// Bytes handed to the TP and SP collectives per chunk.
    pub collective_bytes_per_chunk: f64,
    /// Seconds inside collectives per chunk (waiting for the other ranks included).
    pub collective_s_per_chunk: f64,
    /// The collectives' bytes per chunk that `plan` predicts for this rank.
    pub planned_collective_bytes_per_chunk: f64,
    /// Per kind: calls, bytes and seconds over the first recorded repetition.
    pub collectives: BTreeMap<String, OpTotals>,
}

/// What a rank measured in its first recorded run of one pair.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    pub allocated_peak: u64,
    pub reserved_peak: u64,
    pub chunks: usize,
    pub collectives: BTreeMap<String, OpTotals>,
}

fn comm_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::InvalidConfig {
        field: "tp/sp",
        rule: e.to_string(),
    }
}

/// Gathers every rank's rows (one per pair, in pair order) to every rank; rank 0 adds
/// the plan's prediction. Returns `rows[pair][rank]`.
pub(crate) fn gather(
    config: &SessionBenchConfig,
    groups: &RankGroups,
    pairs: &[(AllocatorPolicy, ReclaimPolicy)],
    mine: &[Measured],
) -> Result<Vec<Vec<RankRow>>> {
    let (tp_rank, sp_rank) = (groups.sharding.tp.rank(), groups.sharding.sp.rank());
    let rows: Vec<RankRow> = mine
        .iter()
        .map(|m| {
            let chunks = m.chunks.max(1) as f64;
            let (bytes, secs) = m
                .collectives
                .values()
                .fold((0u64, 0f64), |(b, s), t| (b + t.bytes, s + t.seconds));
            RankRow {
                rank: groups.rank(),
                tp_rank,
                sp_rank,
                allocated_peak_bytes: m.allocated_peak,
                reserved_peak_bytes: m.reserved_peak,
                collective_bytes_per_chunk: bytes as f64 / chunks,
                collective_s_per_chunk: secs / chunks,
                planned_collective_bytes_per_chunk: 0.0,
                collectives: m.collectives.clone(),
            }
        })
        .collect();
    let bytes = serde_json::to_vec(&rows).map_err(comm_err)?;
    let all = groups.world.all_gather_bytes(&bytes).map_err(comm_err)?;
    let mut by_rank: Vec<Vec<RankRow>> = all
        .iter()
        .map(|b| serde_json::from_slice(b).map_err(comm_err))
        .collect::<Result<_>>()?;
    let mut out: Vec<Vec<RankRow>> = (0..pairs.len())
        .map(|p| by_rank.iter_mut().map(|r| r[p].clone()).collect())
        .collect();
    if groups.rank() == 0 {
        for (pair, rows) in pairs.iter().zip(out.iter_mut()) {
            let planned = planned_bytes_per_chunk(config, groups, *pair)?;
            for (row, p) in rows.iter_mut().zip(planned) {
                row.planned_collective_bytes_per_chunk = p;
            }
        }
    }
    Ok(out)
}

/// Each rank's collective bytes per chunk from a meta execution of one session.
fn planned_bytes_per_chunk(
    config: &SessionBenchConfig,
    groups: &RankGroups,
    (allocator, policy): (AllocatorPolicy, ReclaimPolicy),
) -> Result<Vec<f64>> {
    let plan = run_plan(&PlanConfig {
        model: config.model.clone(),
        transformer: None,
        height: config.height,
        width: config.width,
        frames: config.frames,
        mesh: groups.mesh(),
        capacity: config
            .capacity
            .unwrap_or_else(headroom_mem::HostMemory::physical_memory),
        allocator: AllocatorConfig {
            max_split_size: config.max_split_size,
            ..AllocatorConfig::with_policy(allocator)
        },
        policies: vec![policy],
        kv_fraction: None,
        chunks: None,
        weight_dtype: config.dtype,
        weights: config.weights,
        history: 0,
        platform: PlanPlatform::Sim,
        decoder: config.decoder,
        tiny_decoder: config.tiny_decoder.clone(),
    })?;
    let chunks = (config.frames + 3) / 12;
    Ok(plan
        .iter()
        .map(|r| r.collectives.values().map(|t| t.bytes).sum::<u64>() as f64 / chunks.max(1) as f64)
        .collect())
}

/// The per-rank table of a sharded run, in Markdown.
pub fn markdown(rows: &[RankRow], label: &str) -> String {
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let mut s = format!(
        "\n{label}, per rank:\n\n| rank | tp | sp | allocated peak MiB | reserved peak MiB | collectives MiB/chunk | planned MiB/chunk | s/chunk in collectives |\n|---|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.3} |\n",
            r.rank,
            r.tp_rank,
            r.sp_rank,
            mib(r.allocated_peak_bytes as f64),
            mib(r.reserved_peak_bytes as f64),
            mib(r.collective_bytes_per_chunk),
            mib(r.planned_collective_bytes_per_chunk),
            r.collective_s_per_chunk
        ));
    }
    s
}
