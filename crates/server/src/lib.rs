//! headroom's realtime server: `WS /v1/realtime/video` wire-compatible with vLLM-Omni's
//! realtime video API, a web viewer, health, readiness and Prometheus metrics.
//!
//! Every session runs on its own worker thread (never on the async runtime) and reaches
//! its socket through a bounded channel; every way a session ends releases its KV pages,
//! decoder state and conditioning before the client hears of the end.
//!
//! The trade-off: a session gets a whole slot at admission or waits in the queue; the
//! server never shares memory it has not planned, so a client may wait, but a session
//! never runs out mid-stream.
#![warn(missing_docs, missing_debug_implementations)]

pub mod admission;
pub mod config;
pub mod door;
pub mod error;
pub mod events;
pub mod image_ref;
pub mod metrics;
pub mod pacer;
pub mod prompt;
pub mod protocol;
pub mod realtime;
pub mod refusal;
pub mod resume;
pub mod server;
pub mod sockets;
pub mod state;
pub mod wire;
pub mod worker;

pub use admission::{Admission, Refusal, Slot, Ticket};
pub use config::{Defaults, Limits, Scheduler, ServerConfig};
pub use door::DoorConfig;
pub use error::{Result, ServerError};
pub use image_ref::decode_image_url;
pub use metrics::{Histogram, Metrics, QueueGauges};
pub use prompt::prompt_of;
pub use protocol::{ClientMessage, Interaction, StartRequest};
pub use server::Server;
pub use state::AppState;
