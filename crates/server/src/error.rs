//! The one error type of the server, and the wire `code` each variant is sent with.

use headroom_engine::{AdmissionKind, EngineError};

use crate::refusal::Refusal;

/// Errors of the server; each maps to the `code` of a wire `error` message.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A message is not a JSON object; the client should send one JSON object per text message.
    #[error("{0}")]
    InvalidJson(String),
    /// A `resume_token` names no session this client may resume (unknown, used, expired,
    /// or opened with another API key); the client should start a new session.
    #[error("resume refused: {0}")]
    ResumeRefused(String),
    /// A message's `type` is not one the server knows; the client should use
    /// `session.start`, `session.interaction`, `session.ping` or `session.stop`.
    #[error("unknown message type {0:?}; expected session.start, session.interaction, session.ping, session.pause, session.resume or session.stop")]
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
    #[error("capacity: {reason}")]
    Capacity {
        /// What was short (the `reason` label of `headroom_sessions_refused_total`).
        refusal: Refusal,
        /// The figures, for people.
        reason: String,
    },
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
    /// The server is draining: its running sessions finish, it takes no new one (try
    /// another replica).
    #[error("the server is draining: it takes no new session; connect again (a load balancer sends you to another replica)")]
    Draining,
    /// The server's own setup failed (binding, the runtime).
    #[error("server: {0}")]
    Setup(String),
    /// The server failed, not the request (a thread panicked, an invariant broke); the
    /// session has ended and released everything it held.
    #[error("internal error: {0}")]
    Internal(String),
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
            ServerError::ResumeRefused(_) => "resume_refused",
            ServerError::UnknownType(_) => "unknown_type",
            ServerError::InvalidRequest { .. } => "invalid_request",
            ServerError::InvalidState(_) => "invalid_state",
            ServerError::MessageTooLarge { .. } => "message_too_large",
            ServerError::EventIdConflict(_) => "event_id_conflict",
            ServerError::Capacity { .. } => "capacity",
            ServerError::StartTimeout(_) => "start_timeout",
            ServerError::StallTimeout(_) => "stall_timeout",
            ServerError::Busy(_) => "busy",
            ServerError::Generation(_) => "generation_failed",
            ServerError::ShuttingDown => "shutting_down",
            ServerError::Draining => "draining",
            ServerError::Setup(_) | ServerError::Internal(_) => "internal_error",
        }
    }

    /// A refusal for want of `refusal`.
    pub fn capacity(refusal: Refusal, reason: impl Into<String>) -> Self {
        ServerError::Capacity {
            refusal,
            reason: reason.into(),
        }
    }

    /// What a refusal of a session was for (`None` for an error that refuses nothing).
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            ServerError::Capacity { refusal, .. } => Some(*refusal),
            ServerError::ShuttingDown => Some(Refusal::ShuttingDown),
            ServerError::Draining => Some(Refusal::Draining),
            _ => None,
        }
    }

    /// Classifies an engine error met while opening a session, by kind: admission
    /// refusals and running out of memory while taking the session's state are
    /// `capacity` (the session never started; KV pages apart from memory), rule breaks
    /// `invalid_request` with the field in the wire spelling, the engine's own faults
    /// `internal_error`, anything else a failed generation.
    pub fn from_open(error: EngineError) -> Self {
        if let Some(kind) = error.admission_kind() {
            let refusal = match kind {
                AdmissionKind::KvPages => Refusal::KvPages,
                AdmissionKind::Memory | AdmissionKind::PlannedPeak => Refusal::Memory,
            };
            return ServerError::capacity(refusal, admission_reason(error));
        }
        match error {
            EngineError::Request { field, rule } => ServerError::request(wire_field(field), rule),
            other if other.is_out_of_memory() => {
                ServerError::capacity(Refusal::Memory, other.to_string())
            }
            other if other.is_internal() => ServerError::Internal(other.to_string()),
            other => ServerError::Generation(other.to_string()),
        }
    }
}

/// The figures of an admission refusal, without the engine's `admission: ` prefix.
fn admission_reason(error: EngineError) -> String {
    match error {
        EngineError::Admission { reason, .. } => reason,
        other => other.to_string(),
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
    use crate::refusal::Refusal;
    use headroom_engine::{AdmissionKind, EngineError};

    /// The wire code and refusal of an engine error met while opening a session.
    fn mapped(e: EngineError) -> (&'static str, Option<Refusal>) {
        let server = ServerError::from_open(e);
        (server.code(), server.refusal())
    }

    #[test]
    fn a_real_out_of_memory_is_capacity_for_want_of_memory() {
        // A sim device of 1 MiB asked for 1 GiB.
        let device = headroom_mem::CachingPlatform::sim(
            1 << 20,
            headroom_mem::AllocatorConfig::with_policy(headroom_mem::AllocatorPolicy::Pytorch),
            headroom_mem::ReclaimPolicy::Never,
        )
        .unwrap();
        let oom = headroom_mem::Platform::allocator(&device)
            .allocate(1 << 30, 0)
            .unwrap_err();
        assert_eq!(
            mapped(EngineError::Tensor(oom.into())),
            ("capacity", Some(Refusal::Memory))
        );
    }

    #[test]
    fn kv_pages_refusals_are_capacity_for_want_of_pages() {
        let e = EngineError::admission(AdmissionKind::KvPages, "the pool holds 4 pages");
        assert_eq!(mapped(e), ("capacity", Some(Refusal::KvPages)));
    }

    #[test]
    fn memory_and_planned_peak_refusals_are_capacity_for_want_of_memory() {
        for kind in [AdmissionKind::Memory, AdmissionKind::PlannedPeak] {
            let e = EngineError::admission(kind, "does not fit");
            assert_eq!(mapped(e), ("capacity", Some(Refusal::Memory)));
        }
        // The message is the engine's figures, without its own prefix.
        let e = ServerError::from_open(EngineError::admission(AdmissionKind::Memory, "12 B free"));
        assert_eq!(e.to_string(), "capacity: 12 B free");
    }

    #[test]
    fn a_refusal_on_another_rank_keeps_its_kind() {
        let e = EngineError::Rank {
            rank: 1,
            reason: "admission: pages".into(),
            cause: Some(Box::new(EngineError::admission(
                AdmissionKind::KvPages,
                "pages",
            ))),
        };
        assert_eq!(mapped(e), ("capacity", Some(Refusal::KvPages)));
    }

    #[test]
    fn a_rule_break_is_invalid_request_naming_the_wire_field() {
        let e = ServerError::from_open(EngineError::request("steps", "must be 1 to 8"));
        assert_eq!(e.code(), "invalid_request");
        assert!(
            matches!(&e, ServerError::InvalidRequest { field, .. } if field == "num_inference_steps"),
            "{e:?}"
        );
    }

    #[test]
    fn an_engine_fault_is_internal_error_not_the_request() {
        assert_eq!(
            mapped(EngineError::Internal("the decode thread panicked".into())),
            ("internal_error", None)
        );
        let on_rank = EngineError::Rank {
            rank: 2,
            reason: "internal".into(),
            cause: Some(Box::new(EngineError::Internal(
                "a rank's thread panicked".into(),
            ))),
        };
        assert_eq!(mapped(on_rank), ("internal_error", None));
    }

    #[test]
    fn other_failures_are_failed_generations_whatever_their_text() {
        // A failure that merely mentions memory or a field is a failed generation.
        assert_eq!(
            mapped(EngineError::Batch("out of memory in request: steps".into())),
            ("generation_failed", None)
        );
    }
}
