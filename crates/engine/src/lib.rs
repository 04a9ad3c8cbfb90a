//! headroom's engine: sessions that generate video block by block (4-step DMD over a
//! paged KV cache, a commit forward, a session-owned VAE decode), admitted only when
//! they fit, releasing everything on close, with reclaim at named phase boundaries.
//!
//! ```
//! use headroom_engine::{Engine, EngineConfig, SessionRequest};
//! use std::io::Write;
//!
//! // The built-in `tiny` model (seeded weights, no download).
//! let engine = Engine::new(EngineConfig {
//!     model: "tiny".into(),
//!     ..EngineConfig::default()
//! })?;
//! // 21 frames at 48×32: two chunks (9 frames, then 12).
//! let session = engine.open_session(SessionRequest::new(48, 32, 21))?;
//! let mut video = Vec::new();
//! for chunk in session {
//!     let chunk = chunk?;
//!     // Frames as u8 [T, H, W, 3], ready for an encoder.
//!     video.write_all(&chunk.frames.to_vec::<u8>()?)?;
//! }
//! assert_eq!(video.len(), 21 * 32 * 48 * 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What it owns: the session (its KV pages, decoder state and conditioning), admission
//! against the memory it will need, the step scheduler that batches sessions, and the
//! plans the `planned` allocator replays. The trade-off: a session's memory is decided
//! before its first chunk (admitted or refused whole), so it never runs out mid-stream,
//! at the price of planning it first.
#![warn(missing_docs, missing_debug_implementations)]

pub mod blocks;
pub mod builtin_world;
pub mod cancel;
mod condition;
pub mod config;
pub mod driver;
pub mod engine;
pub mod error;
pub mod first_frame;
pub mod loop_io;
pub mod mesh;
pub mod model_source;
pub mod phases;
pub mod plan;
pub mod plan_cache;
pub mod preset;
pub mod replicated;
mod request;
mod round;
pub mod scheduler;
pub mod session;
pub mod snapshot;
pub mod step_queue;
mod text;
pub mod validate;

pub use cancel::{CancelReason, CancelToken, Checkpoint};
pub use driver::{Drive, SessionDriver};
pub use engine::{
    Admitted, Engine, EngineConfig, Placement, Resident, SnapshotSource, TINY_DECODER_FILE,
};
pub use error::{AdmissionKind, EngineError, Result, SnapshotFault};
pub use loop_io::{LatentRecorder, LatentSink, NoiseSource};
pub use mesh::{Mesh, RankGroups};
pub use model_source::ModelSource;
pub use preset::{ModelPreset, PRESETS};
pub use session::{Chunk, ChunkTimings, Chunks, Session, SessionRequest, BLOCK_FRAMES};
pub use snapshot::SessionSnapshot;
pub use step_queue::{Member, Pace, StepQueue, Turn, ROUND_MARGIN};
