//! The one error type of the engine.

/// What a session was refused for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionKind {
    /// The KV page pool cannot hold its pages.
    KvPages,
    /// Its decoder state, conditioning or the KV pool do not fit in free memory.
    Memory,
    /// Its planned peak does not fit beside what the live sessions committed.
    PlannedPeak,
}

/// Why a snapshot could not be written or is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotFault {
    /// The file could not be read or written (a full disk, a missing folder).
    Io,
    /// The file ends before its header says it does.
    Truncated,
    /// The bytes are not a snapshot, or do not match their checksum.
    Corrupt,
    /// Written by another version of the snapshot format.
    Version,
    /// Made on another model, size, dtype, decoder, KV window or mesh than this engine
    /// has: the message says what differs.
    Mismatch,
    /// The session holds something a snapshot cannot carry.
    Unsupported,
}

impl SnapshotFault {
    /// A short name for reports and protocol errors.
    pub fn name(self) -> &'static str {
        match self {
            SnapshotFault::Io => "io",
            SnapshotFault::Truncated => "truncated",
            SnapshotFault::Corrupt => "corrupt",
            SnapshotFault::Version => "version",
            SnapshotFault::Mismatch => "mismatch",
            SnapshotFault::Unsupported => "unsupported",
        }
    }
}

/// Errors of the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A request field breaks a rule; the message names the field and the rule.
    #[error("request: {field}: {rule}")]
    Request {
        /// The field.
        field: &'static str,
        /// The rule it breaks.
        rule: String,
    },
    /// The session does not fit in what the engine has left, for the reason `kind`.
    #[error("admission: {reason}")]
    Admission {
        /// What is short.
        kind: AdmissionKind,
        /// The figures, for people.
        reason: String,
        /// `(needed_bytes, free_bytes)` where the refusal weighed bytes: what the session
        /// needed and what was free for it (its planned peak against the capacity left
        /// uncommitted, or its pages and state against free memory).
        bytes: Option<(u64, u64)>,
    },
    /// The engine itself failed (a thread panicked, an invariant broke): not the
    /// request's fault; the session is over.
    #[error("internal: {0}")]
    Internal(String),
    /// The session has produced every chunk it was asked for.
    #[error("session {0} is finished")]
    Finished(String),
    /// The session's [`CancelToken`](crate::CancelToken) stopped a chunk at `at`; the
    /// session has released its KV pages, decoder state and conditioning and is over.
    #[error("session {session} stopped at {at}: {reason}")]
    Cancelled {
        /// The session.
        session: String,
        /// Where the chunk stopped.
        at: crate::cancel::Checkpoint,
        /// Why.
        reason: crate::cancel::CancelReason,
    },
    /// A rank of a mesh failed; the others ended with it.
    #[error("rank {rank} failed: {reason}")]
    Rank {
        /// The world rank that failed first.
        rank: usize,
        /// What it reported.
        reason: String,
        /// Its error, where it was met in this process (a rank thread), so its kind
        /// survives; `None` for a report from another process.
        #[source]
        cause: Option<Box<EngineError>>,
    },
    /// A batched step this session shared with others failed (the first session of the
    /// batch carries the cause itself); the session is over.
    #[error("the batched step this session shared failed: {0}")]
    Batch(String),
    /// A session snapshot could not be written, or is refused for resuming here
    /// (nothing was allocated for it).
    #[error("snapshot ({}): {reason}", kind.name())]
    Snapshot {
        /// What is wrong.
        kind: SnapshotFault,
        /// What differs or failed, for people.
        reason: String,
    },
    /// A model failed (shapes, weights, out of memory).
    #[error(transparent)]
    Model(#[from] headroom_model::ModelError),
    /// The text encoder failed (tokenizer, weights, a prompt).
    #[error(transparent)]
    Text(#[from] headroom_text::TextError),
    /// A tensor op failed.
    #[error(transparent)]
    Tensor(#[from] headroom_tensor::TensorError),
    /// The memory core refused something.
    #[error(transparent)]
    Mem(#[from] headroom_mem::MemError),
}

impl EngineError {
    /// Whether the device ran out of memory, in whichever layer it surfaced.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            EngineError::Rank { cause: Some(e), .. } => e.is_out_of_memory(),
            EngineError::Model(e) => e.is_out_of_memory(),
            EngineError::Text(e) => e.is_out_of_memory(),
            EngineError::Tensor(e) => e.is_out_of_memory(),
            EngineError::Mem(e) => e.is_out_of_memory(),
            _ => false,
        }
    }

    /// Whether a collective failed because another rank aborted the group (this rank is
    /// not the cause).
    pub fn is_aborted(&self) -> bool {
        match self {
            EngineError::Rank { cause: Some(e), .. } => e.is_aborted(),
            EngineError::Model(e) => e.is_aborted(),
            EngineError::Tensor(e) => e.is_aborted(),
            _ => false,
        }
    }

    /// Whether the session was refused for want of room (memory, pages, planned peak).
    pub fn is_admission(&self) -> bool {
        self.admission_kind().is_some()
    }

    /// What the session was refused for, if it was refused for want of room.
    pub fn admission_kind(&self) -> Option<AdmissionKind> {
        match self {
            EngineError::Rank { cause: Some(e), .. } => e.admission_kind(),
            EngineError::Admission { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// Whether the engine itself failed (not the request, not the memory).
    pub fn is_internal(&self) -> bool {
        match self {
            EngineError::Rank { cause: Some(e), .. } => e.is_internal(),
            e => matches!(e, EngineError::Internal(_)),
        }
    }

    /// A refusal for want of `kind`.
    pub fn admission(kind: AdmissionKind, reason: impl Into<String>) -> Self {
        EngineError::Admission {
            kind,
            reason: reason.into(),
            bytes: None,
        }
    }

    /// A refusal for want of `kind` where the session needed `needed_bytes` and
    /// `free_bytes` were free for it.
    pub fn admission_bytes(
        kind: AdmissionKind,
        needed_bytes: u64,
        free_bytes: u64,
        reason: impl Into<String>,
    ) -> Self {
        EngineError::Admission {
            kind,
            reason: reason.into(),
            bytes: Some((needed_bytes, free_bytes)),
        }
    }

    /// `(needed_bytes, free_bytes)` of a refusal that weighed bytes.
    pub fn admission_bytes_of(&self) -> Option<(u64, u64)> {
        match self {
            EngineError::Rank { cause: Some(e), .. } => e.admission_bytes_of(),
            EngineError::Admission { bytes, .. } => *bytes,
            _ => None,
        }
    }

    /// A snapshot refused or failed for `kind`.
    pub fn snapshot(kind: SnapshotFault, reason: impl Into<String>) -> Self {
        EngineError::Snapshot {
            kind,
            reason: reason.into(),
        }
    }

    /// What is wrong with the snapshot, when this is a snapshot error.
    pub fn snapshot_fault(&self) -> Option<SnapshotFault> {
        match self {
            EngineError::Rank { cause: Some(e), .. } => e.snapshot_fault(),
            EngineError::Snapshot { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// A request error for `field`.
    pub fn request(field: &'static str, rule: impl Into<String>) -> Self {
        EngineError::Request {
            field,
            rule: rule.into(),
        }
    }
}

/// Result alias of the engine.
pub type Result<T> = std::result::Result<T, EngineError>;

#[cfg(test)]
mod tests {
    use super::EngineError;
    use headroom_mem::MemError;
    use headroom_model::ModelError;
    use headroom_tensor::TensorError;

    fn oom() -> MemError {
        MemError::OutOfMemory {
            requested: 1 << 20,
            free: 0,
            reserved: 1 << 30,
            allocated: 1 << 29,
            capacity: 1 << 30,
            platform: "sim",
        }
    }

    #[test]
    fn out_of_memory_and_aborts_are_known_by_kind_in_every_layer_whatever_the_text() {
        let layers = [
            EngineError::Mem(oom()),
            EngineError::Tensor(TensorError::Mem(oom())),
            EngineError::Model(ModelError::Tensor(TensorError::Mem(oom()))),
        ];
        for e in layers {
            assert!(
                e.is_out_of_memory() && !e.is_aborted() && !e.is_admission(),
                "{e}"
            );
        }
        let aborted = EngineError::Model(ModelError::Tensor(TensorError::Aborted {
            op: "all_reduce",
        }));
        assert!(aborted.is_aborted() && !aborted.is_out_of_memory());
        // A message that only says so is not the kind.
        let worded = EngineError::request("prompt", "out of memory; the rank group was aborted");
        assert!(!worded.is_out_of_memory() && !worded.is_aborted());
        let refused = EngineError::admission(super::AdmissionKind::KvPages, "pages");
        assert_eq!(
            refused.admission_kind(),
            Some(super::AdmissionKind::KvPages)
        );
        assert!(!refused.is_internal() && EngineError::Internal("x".into()).is_internal());
        // A rank's failure met in this process keeps its cause's kind.
        let rank = EngineError::Rank {
            rank: 3,
            reason: "out of memory".into(),
            cause: Some(Box::new(EngineError::Mem(oom()))),
        };
        assert!(rank.is_out_of_memory());
    }
}
