//! `headroom plan`'s tables and plots: the plan itself (meta execution of a session on
//! every rank of a modelled device) is the engine's ([`headroom_engine::plan`]); this
//! module names its errors for the bench and draws its timelines.

pub use headroom_engine::plan::{PlanConfig, PlanPlatform, RankPlan};
use headroom_mem::{TraceAction, TraceEvent};

use crate::{BenchError, Result};

/// Runs the plan ([`headroom_engine::plan::run_plan`]). Running out of room keeps its
/// kind (the caller reports what the session needs instead); anything else is a plan
/// that cannot be made.
pub fn run_plan(config: &PlanConfig) -> Result<Vec<RankPlan>> {
    headroom_engine::plan::run_plan(config).map_err(|e| {
        if e.is_out_of_memory() || e.is_admission() {
            return BenchError::Engine(e);
        }
        BenchError::InvalidConfig {
            field: "plan",
            rule: e.to_string(),
        }
    })
}

/// A plot panel `label` of the allocated and reserved bytes after each event of
/// `trace`, which ends with the allocator holding `final_allocated` / `final_reserved`
/// (so a trace whose start was evicted from the ring still lands on the right values),
/// with its phase marks; x counts events.
pub fn timeline(
    label: &str,
    trace: &[TraceEvent],
    final_allocated: u64,
    final_reserved: u64,
) -> crate::plot::Panel {
    let delta = |e: &TraceEvent| -> (i64, i64) {
        let s = e.size as i64;
        match e.action {
            TraceAction::Alloc => (s, 0),
            TraceAction::Free => (-s, 0),
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => (0, s),
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => (0, -s),
            _ => (0, 0),
        }
    };
    let (da, dr) = trace
        .iter()
        .map(delta)
        .fold((0i64, 0i64), |acc, d| (acc.0 + d.0, acc.1 + d.1));
    let mut allocated = final_allocated as i64 - da;
    let mut reserved = final_reserved as i64 - dr;
    let mut points = Vec::with_capacity(trace.len());
    let mut marks = Vec::new();
    for (i, e) in trace.iter().enumerate() {
        let (a, r) = delta(e);
        allocated += a;
        reserved += r;
        points.push((i as f64, allocated.max(0) as u64, reserved.max(0) as u64));
        if e.action == TraceAction::Phase {
            marks.push((i as f64, e.name.clone().unwrap_or_default()));
        }
    }
    crate::plot::Panel {
        label: label.to_string(),
        points,
        marks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(action: TraceAction, size: u64) -> TraceEvent {
        TraceEvent {
            seq: 0,
            action,
            addr: 0,
            size,
            stream: 0,
            name: (action == TraceAction::Phase).then(|| "decode_start".to_string()),
            device_free: None,
        }
    }

    #[test]
    fn the_timeline_replays_events_onto_the_final_values() {
        // The ring lost the first 100 allocated / 200 reserved bytes.
        let trace = vec![
            event(TraceAction::SegmentAlloc, 50),
            event(TraceAction::Alloc, 30),
            event(TraceAction::Phase, 0),
            event(TraceAction::Free, 30),
            event(TraceAction::SegmentFree, 50),
        ];
        let panel = timeline("rank 0", &trace, 100, 200);
        assert_eq!(
            panel.points,
            vec![
                (0.0, 100, 250),
                (1.0, 130, 250),
                (2.0, 130, 250),
                (3.0, 100, 250),
                (4.0, 100, 200)
            ]
        );
        assert_eq!(panel.marks, vec![(2.0, "decode_start".to_string())]);
    }
}
