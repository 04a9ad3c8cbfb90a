//! What a session's snapshot holds, from the configs alone (no weights, no session):
//! what `headroom plan` reports per session, and `bench snapshot` for models too large
//! to run here. It describes a session in steady state at a chunk boundary — its KV
//! window full, a prompt's 512 tokens of text keys/values, its image condition settled
//! (before that, the condition's encoder cache adds to it) — and a test holds it to the
//! bytes of real snapshots. The engine computes it (`Engine::snapshot_estimate`).

use serde::Serialize;

/// A session's snapshot by part, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct SnapshotEstimate {
    /// Committed KV pages: the window less one block (the sink included), every layer.
    pub kv_bytes: u64,
    /// The prompt's text keys/values (512 tokens, every layer).
    pub text_bytes: u64,
    /// The image condition's current block (image-conditioned models).
    pub condition_bytes: u64,
    /// The decoder's streaming state.
    pub decoder_bytes: u64,
    /// A block denoised ahead (`overlap`).
    pub pending_bytes: u64,
    /// The sum: bytes a parked session holds in host memory, and a snapshot file's
    /// tensor data.
    pub total_bytes: u64,
    /// The largest device allocation a snapshot adds while it is written: one layer's
    /// keys (or values) of the whole history, gathered into one tensor for a single
    /// device-to-host copy.
    pub staging_bytes: u64,
}
