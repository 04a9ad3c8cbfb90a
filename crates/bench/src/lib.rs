//! headroom's benchmarks: each prints ratios measured side by side in one run, because
//! absolute times drift on shared machines.
#![warn(missing_docs, missing_debug_implementations)]

pub mod alloc;

pub use alloc::{run_alloc_bench, AllocBenchConfig, AllocBenchRow};

/// Errors of the benchmarks.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The memory core refused a setting or an allocation.
    #[error(transparent)]
    Mem(#[from] headroom_mem::MemError),
    /// A benchmark setting breaks a rule.
    #[error("invalid {field}: {rule}")]
    InvalidConfig {
        /// The setting.
        field: &'static str,
        /// The rule it breaks.
        rule: String,
    },
}

/// Result alias of the benchmarks.
pub type Result<T> = std::result::Result<T, BenchError>;
