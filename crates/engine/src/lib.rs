//! headroom's engine: sessions that generate video block by block (4-step DMD over a
//! paged KV cache, a commit forward, a session-owned VAE decode), admitted only when
//! they fit, releasing everything on close, with reclaim at named phase boundaries.
#![warn(missing_docs, missing_debug_implementations)]

pub mod cancel;
mod condition;
pub mod engine;
pub mod error;
pub mod first_frame;
pub mod loop_io;
pub mod mesh;
pub mod model_source;
pub mod plan_cache;
mod planned;
pub mod preset;
pub mod replicated;
mod request;
mod round_plan;
pub mod scheduler;
pub mod session;
pub mod step_queue;
mod text;

pub use cancel::{CancelReason, CancelToken, Checkpoint};
pub use engine::{Admitted, Engine, EngineConfig, Resident, TINY_DECODER_FILE};
pub use error::{EngineError, Result};
pub use loop_io::{LatentRecorder, LatentSink, NoiseSource};
pub use mesh::{Mesh, RankGroups};
pub use model_source::ModelSource;
pub use preset::{ModelPreset, PRESETS};
pub use session::{Chunk, ChunkTimings, Session, SessionRequest, BLOCK_FRAMES};
pub use step_queue::{Member, StepQueue};
