//! The one error type of the server, and the wire `code` each variant is sent with.

use headroom_engine::EngineError;

/// Errors of the server; each maps to the `code` of a wire `error` message.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A message is not a JSON object; the client should send one JSON object per text message.
    #[error("{0}")]
    InvalidJson(String),
    /// A message's `type` is not one the server knows; the client should use
    /// `session.start`, `session.interaction`, `session.ping` or `session.stop`.
    #[error("unknown message type {0:?}; expected session.start, session.interaction, session.ping or session.stop")]
    UnknownType(String),
    /// A field breaks a rule; the message names the field and the rule, and the client
    /// should fix that field.
    #[error("{field}: {rule}")]
    InvalidRequest {
        /// The field, in the wire message's own spelling.
        field: String,
        /// The rule it breaks.
        rule: String,
    },
    /// A message arrived that the session's state does not allow (e.g. an interaction
    /// before `session.start`); the client should follow the protocol's order.
    #[error("{0}")]
    InvalidState(String),
    /// A message is larger than its limit; the client should send less.
    #[error("{kind} message of {bytes} B exceeds the {limit} B limit")]
    MessageTooLarge {
        /// `session.start` or `control`.
        kind: &'static str,
        /// Bytes received.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// An interaction reused an `event_id` of this session; the client should use a new id.
    #[error("event_id {0:?} was already used in this session")]
    EventIdConflict(String),
    /// The server cannot admit the session now (session slots, KV pages or memory); the
    /// client may retry later.
    #[error("capacity: {0}")]
    Capacity(String),
    /// No `session.start` arrived in time; the client should send it right after connecting.
    #[error("no session.start within {0:.1} s")]
    StartTimeout(f64),
    /// Neither a chunk nor a ping moved the session forward in time.
    #[error("stall timeout: no progress for {0:.1} s")]
    StallTimeout(f64),
    /// Too many interactions are waiting for the next chunk boundary; the client should
    /// send fewer.
    #[error("{0}")]
    Busy(String),
    /// The generation failed mid-session (including out of memory); the session has ended
    /// and released everything it held; the client may start a new one.
    #[error("generation failed: {0}")]
    Generation(String),
    /// The server is shutting down and takes no new session.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The server's own setup failed (binding, the runtime).
    #[error("server: {0}")]
    Setup(String),
}

impl ServerError {
    /// A request error for `field`.
    pub fn request(field: impl Into<String>, rule: impl Into<String>) -> Self {
        ServerError::InvalidRequest {
            field: field.into(),
            rule: rule.into(),
        }
    }

    /// The wire `code` of this error.
    pub fn code(&self) -> &'static str {
        match self {
            ServerError::InvalidJson(_) => "invalid_json",
            ServerError::UnknownType(_) => "unknown_type",
            ServerError::InvalidRequest { .. } => "invalid_request",
            ServerError::InvalidState(_) => "invalid_state",
            ServerError::MessageTooLarge { .. } => "message_too_large",
            ServerError::EventIdConflict(_) => "event_id_conflict",
            ServerError::Capacity(_) => "capacity",
            ServerError::StartTimeout(_) => "start_timeout",
            ServerError::StallTimeout(_) => "stall_timeout",
            ServerError::Busy(_) => "busy",
            ServerError::Generation(_) => "generation_failed",
            ServerError::ShuttingDown => "shutting_down",
            ServerError::Setup(_) => "internal",
        }
    }

    /// Classifies an engine error met while opening a session: admission refusals and
    /// running out of memory while taking the session's state are `capacity` (the session
    /// never started), rule breaks `invalid_request` with the field in the wire spelling,
    /// anything else a failed generation.
    pub fn from_open(error: EngineError) -> Self {
        match error {
            EngineError::Admission(reason) => ServerError::Capacity(reason),
            EngineError::Request { field, rule } => ServerError::request(wire_field(field), rule),
            other if other.is_out_of_memory() => ServerError::Capacity(other.to_string()),
            other => ServerError::Generation(other.to_string()),
        }
    }
}

/// The `session.start` spelling of an engine request field.
fn wire_field(engine_field: &str) -> &str {
    match engine_field {
        "steps" => "num_inference_steps",
        "image" => "image_reference",
        "actions" => "extra_params.camera_action_script",
        "decoder" => "extra_params.decoder",
        "width/height" => "width/height",
        other => other,
    }
}

/// Result alias of the server.
pub type Result<T> = std::result::Result<T, ServerError>;

#[cfg(test)]
mod tests {
    use super::ServerError;
    use headroom_engine::EngineError;

    #[test]
    fn opening_errors_map_by_kind_not_by_text() {
        // A real one: a sim device of 1 MiB asked for 1 GiB.
        let device = headroom_mem::CachingPlatform::sim(
            1 << 20,
            headroom_mem::AllocatorConfig::with_policy(headroom_mem::AllocatorPolicy::Pytorch),
            headroom_mem::ReclaimPolicy::Never,
        )
        .unwrap();
        let oom = headroom_mem::Platform::allocator(&device)
            .allocate(1 << 30, 0)
            .unwrap_err();
        assert!(matches!(
            ServerError::from_open(EngineError::Tensor(oom.into())),
            ServerError::Capacity(_)
        ));
        assert!(matches!(
            ServerError::from_open(EngineError::Admission("no pages".into())),
            ServerError::Capacity(_)
        ));
        // A failure that merely mentions memory is a failed generation.
        assert!(matches!(
            ServerError::from_open(EngineError::Batch("out of memory".into())),
            ServerError::Generation(_)
        ));
    }
}
