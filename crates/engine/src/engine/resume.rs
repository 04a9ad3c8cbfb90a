//! Resuming a session from its snapshot: the snapshot is checked against this engine
//! (format, checksum, identity) before anything is allocated, then admitted like any
//! session (KV pages, free memory, its planned peak) and opened with the saved text,
//! condition, KV history, decoder state, noise position and camera in place of new ones.

use std::sync::Arc;

use headroom_mem::SpanId;
use headroom_model::kv::SessionKv;
use headroom_model::DecoderKind;

use super::admission::{Admitted, Opening};
use super::Engine;
use crate::blocks::frames_for_blocks;
use crate::condition::ImageCondition;
use crate::error::{EngineError, Result, SnapshotFault};
use crate::loop_io::NoiseSource;
use crate::session::{saved_text, SavedRequest, Session, SessionRequest};
use crate::snapshot::SessionSnapshot;

/// Where a snapshot to resume comes from.
#[derive(Debug, Clone)]
pub enum SnapshotSource<'a> {
    /// A `.hrsnap` file.
    Path(&'a std::path::Path),
    /// A file's bytes.
    Bytes(&'a [u8]),
    /// A snapshot in memory (a parked session).
    Snapshot(Arc<SessionSnapshot>),
}

impl<'a> From<&'a std::path::Path> for SnapshotSource<'a> {
    fn from(p: &'a std::path::Path) -> Self {
        SnapshotSource::Path(p)
    }
}

impl<'a> From<&'a [u8]> for SnapshotSource<'a> {
    fn from(b: &'a [u8]) -> Self {
        SnapshotSource::Bytes(b)
    }
}

impl From<SessionSnapshot> for SnapshotSource<'_> {
    fn from(s: SessionSnapshot) -> Self {
        SnapshotSource::Snapshot(Arc::new(s))
    }
}

impl From<Arc<SessionSnapshot>> for SnapshotSource<'_> {
    fn from(s: Arc<SessionSnapshot>) -> Self {
        SnapshotSource::Snapshot(s)
    }
}

impl SnapshotSource<'_> {
    /// The snapshot, read and checked (nothing allocated on a device).
    pub fn load(self) -> Result<Arc<SessionSnapshot>> {
        Ok(match self {
            SnapshotSource::Path(p) => Arc::new(SessionSnapshot::read(p)?),
            SnapshotSource::Bytes(b) => Arc::new(SessionSnapshot::from_bytes(b)?),
            SnapshotSource::Snapshot(s) => s,
        })
    }
}

impl Engine {
    /// A session that goes on from `snapshot`: its remaining chunks are the bytes the
    /// uninterrupted session would have made. A snapshot of another format version,
    /// model, weights, dtype, weight format, decoder, KV window or mesh, or one that is
    /// truncated or corrupt, is refused before anything is allocated, naming what
    /// differs; then the session is admitted like a new one.
    pub fn resume<'a>(&self, snapshot: impl Into<SnapshotSource<'a>>) -> Result<Session> {
        self.admit_resume(snapshot)?.open()
    }

    /// The first half of [`Engine::resume`] (checks and admission, no collective), as
    /// [`Engine::admit_session`] is of [`Engine::open_session`].
    pub fn admit_resume<'a>(
        &self,
        snapshot: impl Into<SnapshotSource<'a>>,
    ) -> Result<Admitted<'_>> {
        let snapshot = snapshot.into().load()?;
        let id = &snapshot.identity;
        let decoder: DecoderKind = id
            .decoder
            .parse()
            .map_err(|e| EngineError::snapshot(SnapshotFault::Corrupt, format!("decoder: {e}")))?;
        let here = self
            .identity
            .of_session(id.width, id.height, decoder.as_str())?;
        id.check(&here)?;
        let request = self.resumed_request(&snapshot, decoder)?;
        let (kv, blocks) = self.admit_room(&request)?;
        let span = self.planner.begin_span(self, &request, blocks, true)?;
        Ok(Admitted {
            engine: self,
            parts: Some((request, kv, Opening::Resumed(snapshot), blocks)),
            span,
        })
    }

    /// The request a snapshot's session was opened with, as far as admission needs it
    /// (its text, image and trajectory come from the snapshot itself).
    fn resumed_request(
        &self,
        snapshot: &SessionSnapshot,
        decoder: DecoderKind,
    ) -> Result<SessionRequest> {
        // Fields only: nothing is loaded onto the device here.
        let saved = SavedRequest::read(&snapshot.state.reader(&self.device))
            .map_err(|e| EngineError::snapshot(SnapshotFault::Corrupt, e.to_string()))?;
        let id = &snapshot.identity;
        let mut request = SessionRequest::new(
            id.width,
            id.height,
            saved.blocks.map_or(0, frames_for_blocks),
        );
        request.seed = saved.seed;
        request.steps = saved.steps;
        request.flow_shift = Some(saved.flow_shift);
        request.actions = saved.actions;
        request.overlap = saved.overlap;
        request.reuse_last_step_kv = saved.reuse_last_step_kv;
        request.camera_guidance = Some(saved.camera_guidance);
        request.decoder = Some(decoder);
        if snapshot.state.tensors.contains_key("noise.supplied") {
            let noise = snapshot
                .state
                .reader(&self.device)
                .tensor("noise.supplied")?;
            request.noise = NoiseSource::Supplied(noise);
        }
        Ok(request)
    }

    /// Opens an admitted resumed session inside its span: the saved text and image
    /// condition, then the rest of its state.
    pub(super) fn open_resumed(
        &self,
        snapshot: &SessionSnapshot,
        request: SessionRequest,
        kv: SessionKv,
        blocks: Option<usize>,
        span: Option<SpanId>,
    ) -> Result<Session> {
        let r = snapshot.state.reader(&self.device);
        let text = saved_text(&r)?;
        let cond_reader = r.scope("condition");
        let cond = if self.dit.config().takes_image_condition() {
            Some(ImageCondition::restore(&cond_reader)?)
        } else {
            None
        };
        let mut session = self.new_session(kv, text, cond, &request, blocks)?;
        session.restore_state(&r)?;
        Ok(session.with_span(span))
    }
}
