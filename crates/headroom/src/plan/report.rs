//! What `headroom plan` prints as text: [`table`], one row per rank and policy, then the
//! worst rank of each policy. The `--json` schema is the engine's
//! [`headroom_engine::plan::PlanReport`] (the Python `headroom.plan()` returns it too).

use headroom_bench::plan::{PlanConfig, RankPlan};
use headroom_mem::format_bytes;

/// The words of the table's heading that `config` does not hold as given.
#[derive(Debug)]
pub struct Heading<'a> {
    /// `--model` as given (`config` holds the resolved folder).
    pub model: &'a str,
    /// `--allocator` as given.
    pub allocator: &'a str,
    /// Bytes of each card (`config` may hold an unbounded one, for a session that does
    /// not fit).
    pub capacity: u64,
}

/// The per-rank table of `rows` planned by `config`, then the worst rank of each policy.
pub fn table(heading: &Heading<'_>, config: &PlanConfig, rows: &[RankPlan]) -> String {
    let capacity = heading.capacity;
    let gb = |b: u64| format!("{:.2}", b as f64 / 1e9);
    let mut out = format!(
        "# plan: {} ({} decoder) at {}x{}, {}, TP{} x SP{}, {} per card ({} allocator)\n\n",
        heading.model,
        config.decoder,
        config.width,
        config.height,
        match config.frames {
            0 => "until stopped (its steady state)".to_string(),
            n => format!("{n} frames"),
        },
        config.mesh.tp,
        config.mesh.sp,
        format_bytes(capacity),
        heading.allocator
    );
    out.push_str("| rank | policy | weights GB | KV GB | decoder state GB | conditioning GB | peak allocated GB | peak reserved GB | post-session reserved GB | headroom GB | peak phase |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} |\n",
            r.rank,
            r.policy,
            gb(r.weights_bytes),
            gb(r.kv_bytes),
            gb(r.decoder_state_bytes),
            gb(r.conditioning_bytes),
            gb(r.peak_allocated_bytes),
            gb(r.peak_reserved_bytes),
            gb(r.post_session_reserved_bytes),
            r.headroom_bytes as f64 / 1e9,
            r.peak_phase
        ));
    }
    out.push('\n');
    if let Some(r) = rows.iter().max_by_key(|r| r.snapshot_write_allocated_bytes) {
        let s = &r.snapshot;
        let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
        out.push_str(&format!(
            "snapshot per session (rank {}'s shard, steady state): {} — KV {}, text {}, condition {}, decoder {}; writing one adds a {} staging buffer: {} allocated at the chunk boundary (peak {})\n\n",
            r.rank,
            mb(s.total_bytes),
            mb(s.kv_bytes),
            mb(s.text_bytes),
            mb(s.condition_bytes),
            mb(s.decoder_bytes),
            mb(s.staging_bytes),
            mb(r.snapshot_write_allocated_bytes),
            mb(r.peak_allocated_bytes),
        ));
    }
    let mut policies: Vec<&str> = rows.iter().map(|r| r.policy.as_str()).collect();
    policies.dedup();
    for policy in policies {
        let worst = rows
            .iter()
            .filter(|r| r.policy == policy)
            .max_by_key(|r| r.peak_reserved_bytes);
        if let Some(w) = worst {
            out.push_str(&format!(
                "- {policy}: per-card peak {} MB reserved ({} MB allocated) of {} MB, post-session {} MB — {}\n",
                w.peak_reserved_bytes / 1_000_000,
                w.peak_allocated_bytes / 1_000_000,
                capacity / 1_000_000,
                w.post_session_reserved_bytes / 1_000_000,
                if w.headroom_bytes >= 0 { "fits" } else { "DOES NOT FIT" }
            ));
        }
    }
    out
}
