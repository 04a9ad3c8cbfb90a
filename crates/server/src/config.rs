//! What a server is set up with: its model's name, session slots, protocol limits and
//! the defaults of a `session.start` that leaves fields out.

use std::time::Duration;

use crate::error::{Result, ServerError};

/// Protocol limits (vLLM-Omni's values by default, REFERENCE.md §6).
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Largest `session.start` message in bytes (it may carry a `data:` image).
    pub start_message_bytes: usize,
    /// Largest message after `session.start` in bytes.
    pub control_message_bytes: usize,
    /// How long a new socket may wait before sending `session.start`.
    pub start_timeout: Duration,
    /// How long a session may go without progress (a chunk sent or a ping received).
    pub stall_timeout: Duration,
    /// Interactions that may wait for the next chunk boundary at once.
    pub pending_interactions: usize,
    /// Distinct `event_id`s one session may use (ids are kept to detect conflicts).
    pub events_per_session: usize,
    /// Longest `event_id` in bytes.
    pub event_id_bytes: usize,
    /// Most frames one session may stream (`None`: unlimited): a session streamed until
    /// stopped ends after the last chunk within it; a longer `num_frames` is refused.
    pub max_session_frames: Option<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            start_message_bytes: 4 << 20,
            control_message_bytes: 128 << 10,
            start_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(60),
            pending_interactions: 64,
            events_per_session: 65_536,
            event_id_bytes: 256,
            max_session_frames: None,
        }
    }
}

/// Values a `session.start` gets for the fields it leaves out.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// Frames (12·K − 3), or 0: stream until the client stops.
    pub num_frames: usize,
    /// Frames per second of the stream.
    pub fps: u32,
    /// Noise seed.
    pub seed: u64,
    /// DMD steps per block.
    pub num_inference_steps: usize,
    /// Timestep shift (`None`: the model's).
    pub flow_shift: Option<f64>,
    /// Media-time pacing of sessions that do not say (`serve --pace`).
    pub pacing: crate::pacer::Pacing,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            width: 416,
            height: 240,
            num_frames: 0,
            fps: 16,
            seed: 42,
            num_inference_steps: 4,
            flow_shift: None,
            pacing: crate::pacer::Pacing::default(),
        }
    }
}

/// How a server is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// The model's name: a `session.start` naming another model is refused.
    pub model_name: String,
    /// Sessions generating at once, at most (the engine's KV pool and memory may allow fewer).
    pub max_sessions: usize,
    /// Clients that may wait for a slot at once (first come, first served); one more is
    /// refused with `capacity`.
    pub max_queue: usize,
    /// How long a client may wait in the queue before it is refused with `capacity`.
    pub queue_timeout: Duration,
    /// Chunks a session's worker may have encoded ahead of its socket (back-pressure).
    pub chunks_ahead: usize,
    /// Step the sessions generating at once together (`headroom_engine::StepQueue`:
    /// one batched forward per DMD step, batched VAE work; the same bytes) instead of
    /// each on its own.
    pub batch_steps: bool,
    /// Most sessions in one batched step (`None`: every session ready); beyond it the
    /// chunks due soonest on their playback clocks go first.
    pub max_batch: Option<usize>,
    /// How stepped sessions are ordered and admitted (`serve --scheduler`).
    pub scheduler: Scheduler,
    /// Protocol limits.
    pub limits: Limits,
    /// Defaults of `session.start`.
    pub defaults: Defaults,
    /// Who may come in: API keys, allowed origins, the socket cap ([`crate::door`]).
    pub door: DoorConfig,
    /// Whether `/ready` counts a server that would queue a new client (every slot held,
    /// the queue not full) as ready. `false`, the default: 503 as soon as a new session
    /// could not start at once, so a load balancer sends it to another replica.
    pub ready_when_queueing: bool,
    /// How long a drain (SIGTERM, `POST /drain`) lets running sessions finish before the
    /// rest are stopped at their next chunk boundary; `ZERO` stops them at once.
    pub drain_timeout: Duration,
    /// How long a session whose client hung up stays parked for its resume token.
    pub resume_window: Duration,
    /// A folder the replicas share for parked sessions: a drain parks every running
    /// session there, and `snapshot_every` writes there.
    pub session_store: Option<std::path::PathBuf>,
    /// Write each running session's snapshot to the store every this many chunks, so a
    /// crashed replica's sessions resume elsewhere.
    pub snapshot_every: Option<usize>,
    /// Most bytes parked sessions hold in host memory (`None`: a quarter of the
    /// machine's memory); past it a session parks in the store, or is not parked.
    pub max_parked_bytes: Option<u64>,
}

/// How a server's stepped sessions are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduler {
    /// Rounds by playback deadline: a paced chunk's round is called up so that it is
    /// ready when due, sessions whose deadlines are near join one round, and on a
    /// server that paces by default (`serve --pace`) a new session is admitted only
    /// while a round of every session fits in a chunk's playing time (real-time
    /// capacity).
    Deadline,
    /// Each paced session waits on its own clock and steps with whoever arrives at the
    /// same time; admission by slots and memory only.
    Arrival,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            model_name: "small".to_string(),
            max_sessions: 1,
            max_queue: 16,
            queue_timeout: Duration::from_secs(120),
            chunks_ahead: 1,
            batch_steps: true,
            max_batch: None,
            scheduler: Scheduler::Deadline,
            limits: Limits::default(),
            defaults: Defaults::default(),
            door: DoorConfig::default(),
            ready_when_queueing: false,
            drain_timeout: Duration::ZERO,
            resume_window: Duration::from_secs(60),
            session_store: None,
            snapshot_every: None,
            max_parked_bytes: None,
        }
    }
}

/// Who the door lets in: the keys, the allowed origins and the socket cap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DoorConfig {
    /// API keys, any of which opens the door (empty: no key needed, as before keys).
    pub api_keys: Vec<String>,
    /// Origins allowed to open WebSockets besides the server's own (`*`: any).
    pub allowed_origins: Vec<String>,
    /// WebSockets open at once, at most (`None`: four times the sessions and the queue).
    pub max_connections: Option<usize>,
}

impl DoorConfig {
    /// Checks the keys: each one non-empty and made of HTTP token characters, so it can
    /// travel as a subprotocol; the error names the field and the rule.
    pub fn validate(&self) -> Result<()> {
        for key in &self.api_keys {
            if key.is_empty() || !key.bytes().all(is_token_byte) {
                return Err(ServerError::request(
                    "api_key",
                    "must be non-empty and made of letters, digits and !#$%&'*+-.^_`|~ (it travels as an HTTP token)",
                ));
            }
        }
        if self.max_connections == Some(0) {
            return Err(ServerError::request(
                "max_connections",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// The socket cap for a server of `max_sessions` slots and a queue of `max_queue`.
    pub fn connection_cap(&self, max_sessions: usize, max_queue: usize) -> usize {
        self.max_connections
            .unwrap_or_else(|| 4 * (max_sessions + max_queue).max(1))
    }
}

/// An HTTP token character (RFC 9110 `tchar`).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
