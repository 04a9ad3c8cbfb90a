//! A session's own part of its snapshot: where its noise, blocks and camera stand, its
//! text keys/values and a pending prompt's, a block denoised ahead; the KV pages, the
//! decoder's state and the image condition save themselves beside it.

use std::sync::Arc;
use std::time::Duration;

use headroom_model::camera::{Controller, InteractionHandler, Keys, Pose};
use headroom_model::dit::{KeyValues, TextKeyValues};
use headroom_model::{SavedState, StateReader, StateWriter, StreamingDecodeState};

use super::step::Denoised;
use super::Session;
use crate::error::{EngineError, Result, SnapshotFault};
use crate::loop_io::NoiseSource;
use crate::snapshot::identity::EngineIdentity;
use crate::snapshot::{Progress, SessionSnapshot};

/// Per latent frame: a file trajectory's framewise deltas and intrinsics.
type Trajectory = (Vec<Pose>, Vec<[f64; 4]>);

fn save_text(w: &mut StateWriter<'_>, text: &TextKeyValues) -> Result<()> {
    w.field("layers", &text.0.len())?;
    for (l, kv) in text.0.iter().enumerate() {
        w.tensor(&format!("k.{l}"), &kv.k)?;
        w.tensor(&format!("v.{l}"), &kv.v)?;
    }
    Ok(())
}

fn load_text(r: &StateReader<'_>) -> Result<TextKeyValues> {
    let layers: usize = r.field("layers")?;
    (0..layers)
        .map(|l| {
            Ok(KeyValues {
                k: r.tensor(&format!("k.{l}"))?,
                v: r.tensor(&format!("v.{l}"))?,
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(TextKeyValues)
}

/// The text keys/values a snapshot's session conditions on (what opening it needs
/// before the session exists).
pub(crate) fn saved_text(r: &StateReader<'_>) -> Result<TextKeyValues> {
    load_text(&r.scope("text"))
}

impl Session {
    /// Lets [`Session::snapshot`] say what the session runs on.
    pub(crate) fn with_identity(mut self, identity: Arc<EngineIdentity>) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Everything the session's future chunks depend on, copied off the device, with
    /// what it runs on: taken between chunks, the session goes on unchanged. A session
    /// that ended, or one in the middle of a batched block, is refused by name.
    pub fn snapshot(&self) -> Result<SessionSnapshot> {
        let refuse = |why: &str| {
            EngineError::snapshot(
                SnapshotFault::Unsupported,
                format!("session {}: {why}", self.id),
            )
        };
        let Some(kv) = self.kv.as_ref() else {
            return Err(refuse("it has ended and holds nothing to save"));
        };
        if self.mid_block {
            return Err(refuse(
                "it is in the middle of a block; snapshot it at a chunk boundary",
            ));
        }
        let Some(identity) = &self.identity else {
            return Err(refuse("it was not opened by an engine"));
        };
        let [h, w] = self.video_hw;
        let identity = identity.of_session(w, h, self.decoder.kind().as_str())?;
        let mut state = SavedState::default();
        let mut top = state.writer();
        kv.save(&mut top.scope("kv"))?;
        save_text(&mut top.scope("text"), &self.text)?;
        self.save_prompt(&mut top.scope("text"))?;
        if let Some(text) = &self.pending_text {
            save_text(&mut top.scope("pending_text"), text)?;
        }
        if let Some(cond) = &self.cond {
            cond.save(&mut top.scope("condition"))?;
        }
        self.decode_state.save(&mut top.scope("decoder"))?;
        if let Some(p) = &self.pending {
            let mut w = top.scope("pending");
            w.tensor("x0", &p.x0)?;
            w.field("denoise_ns", &(p.denoise.as_nanos() as u64))?;
            w.field("commit_ns", &(p.commit.as_nanos() as u64))?;
        }
        if let NoiseSource::Supplied(noise) = &self.noise_source {
            top.scope("noise").tensor("supplied", noise)?;
        }
        let mut s = top.scope("session");
        s.field("next_block", &self.next_block)?;
        s.field("blocks", &self.blocks)?;
        s.field("seed", &self.seed)?;
        s.field("noise_counter", &self.noise_counter)?;
        s.field("draws", &self.draws)?;
        s.field("steps", &self.schedule.len())?;
        s.field("flow_shift", &self.flow_shift)?;
        s.field("actions", &self.actions)?;
        s.field("controller", &self.controller)?;
        s.field("interaction", &self.interaction)?;
        s.field("trajectory", &self.trajectory)?;
        s.field("overlap", &self.overlap)?;
        s.field("reuse_last_step_kv", &self.reuse_last_step_kv)?;
        s.field("camera_guidance", &self.camera_guidance)?;
        Ok(SessionSnapshot {
            identity,
            progress: Progress {
                chunks_done: self.next_block,
                horizon: self.blocks,
                frames_done: self.decode_state.frames_decoded,
                session_id: self.id.clone(),
            },
            state,
        })
    }

    /// Puts a snapshot's state into this session, freshly opened from the snapshot's
    /// request with its text and condition: its KV history, decoder state, noise
    /// position, camera and a pending prompt or block.
    pub(crate) fn restore_state(&mut self, r: &StateReader<'_>) -> Result<()> {
        if let Some(kv) = self.kv.as_mut() {
            kv.restore(&r.scope("kv"))?;
        }
        self.decode_state =
            StreamingDecodeState::restore(&self.id, self.decoder.id(), &r.scope("decoder"))?;
        self.restore_prompt(&r.scope("text"))?;
        let pending_text = r.scope("pending_text");
        if pending_text.has_tensor("k.0") {
            self.pending_text = Some(load_text(&pending_text)?);
        }
        let pending = r.scope("pending");
        if pending.has_tensor("x0") {
            self.pending = Some(Denoised {
                x0: pending.tensor("x0")?,
                denoise: Duration::from_nanos(pending.field("denoise_ns")?),
                commit: Duration::from_nanos(pending.field("commit_ns")?),
            });
        }
        let s = r.scope("session");
        self.next_block = s.field("next_block")?;
        self.noise_counter = s.field("noise_counter")?;
        self.draws = s.field("draws")?;
        self.controller = s.field::<Controller>("controller")?;
        self.interaction = s.field::<Option<InteractionHandler>>("interaction")?;
        self.trajectory = s.field::<Option<Trajectory>>("trajectory")?;
        Ok(())
    }
}

/// The parts of a session request a snapshot fixes, read back.
#[derive(Debug)]
pub(crate) struct SavedRequest {
    pub(crate) blocks: Option<usize>,
    pub(crate) seed: u64,
    pub(crate) steps: usize,
    pub(crate) flow_shift: f64,
    pub(crate) actions: Vec<Keys>,
    pub(crate) overlap: bool,
    pub(crate) reuse_last_step_kv: bool,
    pub(crate) camera_guidance: f64,
}

impl SavedRequest {
    /// What the snapshot's `session` fields say.
    pub(crate) fn read(r: &StateReader<'_>) -> Result<Self> {
        let s = r.scope("session");
        Ok(Self {
            blocks: s.field("blocks")?,
            seed: s.field("seed")?,
            steps: s.field("steps")?,
            flow_shift: s.field("flow_shift")?,
            actions: s.field("actions")?,
            overlap: s.field("overlap")?,
            reuse_last_step_kv: s.field("reuse_last_step_kv")?,
            camera_guidance: s.field("camera_guidance")?,
        })
    }
}
