//! Session snapshots: every byte a session's future chunks depend on, taken at a chunk
//! boundary, so that [`Engine::resume`](crate::Engine::resume) gives a session whose
//! remaining chunks are the bytes the uninterrupted session would have made.
//!
//! Each stateful part saves itself where it lives (the KV pages in `model::kv`, a
//! decoder's streaming state in `model::vae::stream`, the image condition in
//! `condition`, the rest of the session in `session::state`) through one writer of
//! named tensors and JSON fields ([`headroom_model::SavedState`]); this module only
//! knows the file ([`format`](mod@format)) and the identity of what the session ran on
//! ([`identity`]). A parked session is the same [`SessionSnapshot`] held in host
//! memory: its bytes are outside every allocator, so park, snapshot and migrate are
//! one mechanism.

pub mod estimate;
pub mod format;
pub mod identity;

use std::collections::BTreeMap;
use std::path::Path;

use headroom_model::SavedState;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result, SnapshotFault};
pub use estimate::SnapshotEstimate;
pub use format::{EXTENSION, FORMAT_VERSION};
pub use identity::{Identity, MeshPlace};

/// Where a snapshotted session stands (the `meta` of its file, beside the identity).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Chunks made before the snapshot: the resumed session's next chunk has this index.
    pub chunks_done: usize,
    /// Chunks the session makes in all; `None` for a session without an end.
    pub horizon: Option<usize>,
    /// Video frames made before the snapshot.
    pub frames_done: usize,
    /// The id of the session that was snapshotted.
    pub session_id: String,
}

/// A session's state at a chunk boundary, with what it ran on: in memory (a parked
/// session), or as the bytes of a file.
#[derive(Debug, Clone)]
pub struct SessionSnapshot {
    /// What the session ran on.
    pub identity: Identity,
    /// Where it stands.
    pub progress: Progress,
    pub(crate) state: SavedState,
}

#[derive(Serialize, Deserialize)]
struct Meta {
    identity: Identity,
    progress: Progress,
}

/// The parts a snapshot's bytes are reported under: a tensor's first name segment.
const PARTS: [(&str, &str); 8] = [
    ("kv", "committed KV pages (sink and window)"),
    ("text", "the prompt's text keys/values"),
    ("pending_text", "a pending prompt's text keys/values"),
    ("condition", "the image condition and its encoder cache"),
    ("decoder", "the decoder's streaming state"),
    ("pending", "a block denoised ahead (overlap)"),
    ("noise", "supplied noise"),
    ("session", "counters, camera and interactions"),
];

impl SessionSnapshot {
    /// The snapshot as the bytes of a `.hrsnap` file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let meta = serde_json::to_value(Meta {
            identity: self.identity.clone(),
            progress: self.progress.clone(),
        })
        .map_err(|e| EngineError::snapshot(SnapshotFault::Corrupt, e.to_string()))?;
        format::encode(&meta, &self.state)
    }

    /// A snapshot from a file's bytes: its length, format version and checksum are
    /// checked, and nothing is allocated on any device.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let (meta, state) = format::decode(bytes)?;
        let meta: Meta = serde_json::from_value(meta).map_err(|e| {
            EngineError::snapshot(
                SnapshotFault::Corrupt,
                format!("the meta is not a snapshot's: {e}"),
            )
        })?;
        Ok(Self {
            identity: meta.identity,
            progress: meta.progress,
            state,
        })
    }

    /// Writes the snapshot to `path` atomically ([`format::write_atomic`]); returns the
    /// bytes written.
    pub fn write(&self, path: &Path) -> Result<u64> {
        let bytes = self.to_bytes()?;
        format::write_atomic(path, &bytes)?;
        Ok(bytes.len() as u64)
    }

    /// Reads and checks the snapshot file at `path`.
    pub fn read(path: &Path) -> Result<Self> {
        Self::from_bytes(&format::read_file(path)?)
    }

    /// Bytes of the saved tensors: what the session holds, off the device.
    pub fn state_bytes(&self) -> u64 {
        self.state.tensor_bytes()
    }

    /// Bytes per part (KV, text, condition, decoder, …), with what each part is; parts
    /// the session does not have are left out.
    pub fn parts(&self) -> Vec<(&'static str, &'static str, u64)> {
        PARTS
            .iter()
            .filter_map(|&(name, what)| {
                let bytes = self.state.bytes_under(name);
                let present = bytes > 0
                    || self
                        .state
                        .fields
                        .keys()
                        .any(|k| k.starts_with(&format!("{name}.")));
                present.then_some((name, what, bytes))
            })
            .collect()
    }

    /// Tensors and fields by name, for inspection.
    pub fn contents(&self) -> (BTreeMap<String, (String, Vec<usize>)>, usize) {
        let tensors = self
            .state
            .tensors
            .iter()
            .map(|(k, t)| (k.clone(), (t.dtype.to_string(), t.shape.clone())))
            .collect();
        (tensors, self.state.fields.len())
    }
}
