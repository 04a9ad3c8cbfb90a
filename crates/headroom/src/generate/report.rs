//! What `generate` reports. [`GenerateReport`] is the `--json` schema, one field per key;
//! the text form renders the same figures as lines and, on a mesh, a table of the ranks.

use anyhow::Result;
use headroom_engine::plan_cache::PlanCacheCounts;
use headroom_engine::replicated::RankMemory;
use headroom_mem::{format_bytes, ReclaimPolicy};
use headroom_tensor::cuda::launch::CheckReport;
use headroom_text::TextEncoderReport;
use serde::Serialize;

/// One chunk's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkReport {
    /// Frames the chunk held.
    pub frames: usize,
    /// Seconds from asking for the chunk to holding it.
    pub total_s: f64,
    /// Seconds of its denoise steps.
    pub denoise_s: f64,
    /// Seconds of its KV commit.
    pub commit_s: f64,
    /// Seconds of its decode.
    pub decode_s: f64,
    /// Bytes allocated after its decode.
    pub allocated_bytes: i64,
    /// Bytes reserved after its decode.
    pub reserved_bytes: i64,
}

/// The report of one run: `generate --json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct GenerateReport {
    /// The GPU's description, else `cpu`.
    pub device: String,
    /// What the checked launcher saw (`--device cuda-check`).
    pub checked_launches: Option<CheckReport>,
    /// The text encoder's weights and cache, when the model has one.
    pub text_encoder: Option<TextEncoderReport>,
    /// What `--plan-cache` did.
    pub plan_cache: Option<PlanCacheCounts>,
    /// Frames written.
    pub frames: usize,
    /// Video width.
    pub width: usize,
    /// Video height.
    pub height: usize,
    /// `full` or `tiny`.
    pub decoder: &'static str,
    /// Bytes of the model's weights.
    pub weights_bytes: u64,
    /// Seconds from opening the session to its first chunk.
    pub ttfc_s: f64,
    /// Mean seconds per chunk.
    pub chunk_mean_s: f64,
    /// Every chunk, in order.
    pub chunks: Vec<ChunkReport>,
    /// The allocator's peak of allocated bytes over the session.
    pub allocated_peak_bytes: i64,
    /// The allocator's peak of reserved bytes over the session.
    pub reserved_peak_bytes: i64,
    /// Bytes still reserved after the session.
    pub post_session_reserved_bytes: i64,
    /// Reclaims the policy ran.
    pub reclaims: u64,
    /// Seconds those reclaims took.
    pub reclaim_s: f64,
    /// `--out`.
    pub output: String,
    /// The collective backend, on a mesh.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<&'static str>,
    /// Every rank's memory, on a mesh.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<Vec<RankMemory>>,
}

/// A finished run: its report and what only the text form says.
#[derive(Debug, Clone)]
pub struct Run {
    /// The report.
    pub report: GenerateReport,
    /// Whether the run had a GPU (or the checked launcher), which `device` names.
    pub on_gpu: bool,
    /// The reclaim policy it ran under.
    pub policy: ReclaimPolicy,
}

impl Run {
    /// Prints the report: as one line of JSON when `json`, else as text; `tp` and `sp`
    /// head the rank table of a mesh.
    pub fn print(&self, json: bool, tp: usize, sp: usize) -> Result<()> {
        if json {
            // Through a `Value`, whose maps keep their keys sorted: the order `--json`
            // has always printed.
            println!("{}", serde_json::to_value(&self.report)?);
            return Ok(());
        }
        for line in self.lines() {
            println!("{line}");
        }
        if let (Some(ranks), Some(comm)) = (&self.report.ranks, self.report.comm) {
            print!(
                "{}",
                rank_table(ranks, self.report.chunks.len(), tp, sp, comm)
            );
        }
        Ok(())
    }

    /// The text form's lines, before any rank table.
    fn lines(&self) -> Vec<String> {
        let r = &self.report;
        let mut lines = vec![format!(
            "{} frames {}x{} → {}",
            r.frames, r.width, r.height, r.output
        )];
        if self.on_gpu {
            lines.push(format!("device: {}", r.device));
        }
        if let Some(c) = &r.checked_launches {
            lines.push(format!(
                "checked: {} launches of {} kernels and {} GEMMs ({:.2} GFLOP), {} uploaded, {} downloaded; no values computed (frames are black)",
                c.launches.values().sum::<u64>(),
                c.launches.len(),
                c.gemms,
                c.gemm_flops / 1e9,
                format_bytes(c.uploaded_bytes),
                format_bytes(c.downloaded_bytes)
            ));
        }
        lines.push(format!(
            "time to first chunk {:.2} s, mean chunk {:.2} s",
            r.ttfc_s, r.chunk_mean_s
        ));
        lines.push(format!(
            "allocator peak: {} allocated, {} reserved; after the session: {} reserved",
            format_bytes(r.allocated_peak_bytes as u64),
            format_bytes(r.reserved_peak_bytes as u64),
            format_bytes(r.post_session_reserved_bytes as u64)
        ));
        lines.push(format!(
            "reclaims: {} in {:.3} s (policy {})",
            r.reclaims, r.reclaim_s, self.policy
        ));
        if let Some(t) = &r.text_encoder {
            lines.push(format!(
                "text encoder ({}): {} weights resident ({} while loaded, {} loads); cache {} of {}, {} hits / {} misses",
                t.mode,
                format_bytes(t.resident_weight_bytes),
                format_bytes(t.weight_bytes),
                t.loads,
                format_bytes(t.cache_bytes),
                format_bytes(t.cache_budget_bytes),
                t.cache_hits,
                t.cache_misses
            ));
        }
        lines
    }
}

/// Each rank's peaks and collectives per chunk (of `chunks`), headed by the mesh.
fn rank_table(ranks: &[RankMemory], chunks: usize, tp: usize, sp: usize, comm: &str) -> String {
    let mut out = format!(
        "per rank ({} × tp {tp} × sp {sp} on {comm}):\n",
        ranks.len()
    );
    out.push_str(&format!(
        "{:>5} {:>8} {:>8} {:>18} {:>18} {:>18} {:>22}\n",
        "rank",
        "tp_rank",
        "sp_rank",
        "allocated peak",
        "reserved peak",
        "after session",
        "collectives per chunk"
    ));
    let chunks = chunks.max(1) as f64;
    for r in ranks {
        let (bytes, secs) = r
            .collectives
            .values()
            .fold((0u64, 0f64), |(b, s), t| (b + t.bytes, s + t.seconds));
        out.push_str(&format!(
            "{:>5} {:>8} {:>8} {:>18} {:>18} {:>18} {:>22}\n",
            r.rank,
            r.tp_rank,
            r.sp_rank,
            r.allocated_peak_bytes,
            r.reserved_peak_bytes,
            r.post_session_reserved_bytes,
            format!(
                "{} in {:.3} s",
                format_bytes((bytes as f64 / chunks) as u64),
                secs / chunks
            )
        ));
    }
    out
}
