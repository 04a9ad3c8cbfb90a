//! headroom's benchmarks: each prints ratios measured side by side in one run, because
//! absolute times drift on shared machines.
#![warn(missing_docs, missing_debug_implementations)]

pub mod actions;
pub mod alloc;
pub mod batch;
pub mod decoders;
pub mod kernels;
pub mod models;
pub mod plan;
pub mod plot;
pub mod realtime;
pub mod serve;
pub mod session;
pub mod snapshot;
pub mod stats;
pub mod vae;

pub use alloc::{run_alloc_bench, AllocBenchConfig, AllocBenchRow};
pub use batch::{run_batch_bench, BatchBenchConfig, BatchRow};
pub use decoders::{run_decoder_bench, DecoderBenchConfig, DecoderBenchReport, DecoderRow};
pub use kernels::{run_kernel_bench, KernelBenchConfig, KernelRow};
pub use models::{run_model_bench, ModelBenchConfig, ModelRow};
pub use session::{run_session_bench, SessionBenchConfig, SessionBenchSummary};
pub use snapshot::{run_snapshot_bench, SnapshotBenchConfig, SnapshotModel, SnapshotRow};
pub use vae::{run_vae_bench, VaeBenchConfig, VaeBenchReport};

/// Errors of the benchmarks.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The memory core refused a setting or an allocation.
    #[error(transparent)]
    Mem(#[from] headroom_mem::MemError),
    /// A tensor op failed.
    #[error(transparent)]
    Tensor(#[from] headroom_tensor::TensorError),
    /// The engine refused or failed a session.
    #[error(transparent)]
    Engine(#[from] headroom_engine::EngineError),
    /// A benchmark setting breaks a rule.
    #[error("invalid {field}: {rule}")]
    InvalidConfig {
        /// The setting.
        field: &'static str,
        /// The rule it breaks.
        rule: String,
    },
    /// Writing an output file failed.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// What went wrong.
        message: String,
    },
}

impl BenchError {
    /// Whether the workload does not fit the device: it ran out of memory, or the
    /// engine refused a session for want of room.
    pub fn does_not_fit(&self) -> bool {
        match self {
            BenchError::Mem(e) => e.is_out_of_memory(),
            BenchError::Tensor(e) => e.is_out_of_memory(),
            BenchError::Engine(e) => e.is_out_of_memory() || e.is_admission(),
            _ => false,
        }
    }
}

/// Result alias of the benchmarks.
pub type Result<T> = std::result::Result<T, BenchError>;

/// Runs a peer's timing command (`cmd`, split on whitespace, then `args`) and returns
/// the last JSON line it printed: how `bench models` and `bench vae` time PyTorch in the
/// same run.
pub(crate) fn reference_json(cmd: &str, args: &[String]) -> Result<serde_json::Value> {
    let invalid = |rule: String| BenchError::InvalidConfig {
        field: "reference",
        rule,
    };
    let mut parts = cmd.split_whitespace();
    let program = parts
        .next()
        .ok_or_else(|| invalid("empty command".into()))?;
    let output = std::process::Command::new(program)
        .args(parts)
        .args(args)
        .output()
        .map_err(|e| invalid(format!("cannot run {cmd:?}: {e}")))?;
    if !output.status.success() {
        return Err(invalid(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .filter(serde_json::Value::is_object)
        .ok_or_else(|| invalid(format!("no JSON line in its output: {text}")))
}

/// The chunks of a benchmarked session, which must have an end (`frames` is 12·K − 3,
/// not 0: a session streamed until stopped is timed by `bench serve`).
pub(crate) fn finite_chunks(session: &headroom_engine::Session) -> Result<usize> {
    session
        .chunks_total()
        .ok_or_else(|| BenchError::InvalidConfig {
            field: "frames",
            rule: "a benchmarked session needs an end: give 12·K − 3 frames, not 0".to_string(),
        })
}
