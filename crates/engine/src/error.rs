//! The one error type of the engine.

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
    /// The session does not fit in the memory the engine has left.
    #[error("admission: {0}")]
    Admission(String),
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
    },
    /// A batched step this session shared with others failed (the first session of the
    /// batch carries the cause itself); the session is over.
    #[error("the batched step this session shared failed: {0}")]
    Batch(String),
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
