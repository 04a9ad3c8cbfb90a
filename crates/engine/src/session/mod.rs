//! A streaming session: the per-block DMD loop against the session's KV pages, the
//! commit forward, and the session-owned VAE decode, with reclaim consulted at every
//! named phase boundary. Dropping a session releases its pages, decoder state and
//! conditioning on every path.
//!
//! This module is the session's API (open, prompt, cancel, chunks, close); the block
//! step machine a scheduler drives is `step`, the decode with its overlap thread is
//! `decode`, and the camera integration is `camera`.

mod camera;
mod decode;
mod prompt;
mod state;
mod step;

pub(crate) use decode::frames_of;
pub(crate) use state::{saved_text, SavedRequest};
pub(crate) use step::{BlockRun, Denoised};

use std::sync::Arc;
use std::time::Duration;

use headroom_mem::{MemoryStats, SpanGuard, SpanId};
use headroom_model::camera::{framewise_deltas, Controller, InteractionHandler, Keys, Pose};
use headroom_model::dit::TextKeyValues;
use headroom_model::dmd::DmdSchedule;
use headroom_model::kv::SessionKv;
use headroom_model::{StreamingDecodeState, VideoDecoder, WanTransformer, WanVae};
use headroom_tensor::{Device, Tensor};

use crate::cancel::{CancelToken, Checkpoint};
use crate::condition::ImageCondition;
use crate::error::{EngineError, Result};
use crate::loop_io::{LatentSink, NoiseSource};
use crate::phases;
pub use crate::request::SessionRequest;
use crate::text::Prompts;

pub use crate::blocks::BLOCK_FRAMES;

/// Time spent in each phase of a chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ChunkTimings {
    /// The denoise steps.
    pub denoise: Duration,
    /// The KV commit forward.
    pub commit: Duration,
    /// The VAE decode (including its reclaim).
    pub decode: Duration,
}

/// One chunk of video.
#[derive(Debug)]
pub struct Chunk {
    /// Chunk index from 0.
    pub index: usize,
    /// Frames, u8 `[T, H, W, 3]`.
    pub frames: Tensor,
    /// Phase timings.
    pub timings: ChunkTimings,
    /// Allocator statistics at the end of the denoise phase.
    pub stats_denoise_end: MemoryStats,
    /// Allocator statistics after the decode.
    pub stats_decoded: MemoryStats,
}

/// The error that ends a chunk at `at` when `cancel` says stop.
fn cancelled(cancel: &CancelToken, id: &str, at: Checkpoint) -> Option<EngineError> {
    cancel.stop_reason().map(|reason| EngineError::Cancelled {
        session: id.to_string(),
        at,
        reason,
    })
}

/// A running session.
pub struct Session {
    id: String,
    dit: Arc<WanTransformer>,
    vae: Arc<WanVae>,
    /// The decoder the session's blocks go through (the VAE's own or a tiny one).
    decoder: Arc<dyn VideoDecoder>,
    device: Device,
    kv: Option<SessionKv>,
    text: TextKeyValues,
    /// The image condition, streamed block by block (image-conditioned models); its
    /// current block is the one being denoised.
    cond: Option<ImageCondition>,
    decode_state: StreamingDecodeState,
    schedule: DmdSchedule,
    /// The schedule's timestep shift (kept for snapshots).
    flow_shift: f64,
    seed: u64,
    noise_counter: u64,
    noise_source: NoiseSource,
    /// Noise tensors drawn so far (indexes supplied noise).
    draws: usize,
    latent_sink: Option<Arc<dyn LatentSink>>,
    next_block: usize,
    /// Blocks the session makes; `None` until it is stopped.
    blocks: Option<usize>,
    latent_hw: [usize; 2],
    video_hw: [usize; 2],
    actions: Vec<Keys>,
    controller: Controller,
    interaction: Option<InteractionHandler>,
    /// Per latent frame: framewise deltas of a file trajectory and its intrinsics.
    trajectory: Option<(Vec<Pose>, Vec<[f64; 4]>)>,
    overlap: bool,
    reuse_last_step_kv: bool,
    /// Camera guidance scale (1 = off).
    camera_guidance: f64,
    /// The next block, denoised ahead while the previous one decoded (overlap).
    pending: Option<Denoised>,
    /// The engine's text encoder, for prompt changes.
    prompts: Option<Arc<Prompts>>,
    /// Text keys/values of a new prompt, used from the next block denoised on.
    pending_text: Option<TextKeyValues>,
    /// The embeddings in effect, a change's, a blend in progress.
    prompt: prompt::PromptState,
    /// Checked at every safe point of a chunk.
    cancel: CancelToken,
    /// The planned span the session's allocations go to, if admission opened one.
    span: Option<SpanId>,
    /// The shared span of the batched round the session is in, while it is in one.
    round: Option<SpanId>,
    /// What the session brings to the plans of batched rounds (under `planned`).
    round_member: Option<Arc<crate::round::RoundMember>>,
    /// A block has begun and its chunk is not delivered yet (no snapshot then).
    mid_block: bool,
    /// Detached from its own plan (stepped with others once).
    detached: bool,
    /// What the session runs on, for its snapshots.
    identity: Option<Arc<crate::snapshot::identity::EngineIdentity>>,
}

impl Session {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: String,
        dit: Arc<WanTransformer>,
        vae: Arc<WanVae>,
        decoder: Arc<dyn VideoDecoder>,
        kv: SessionKv,
        text: TextKeyValues,
        cond: Option<ImageCondition>,
        request: &SessionRequest,
        blocks: Option<usize>,
    ) -> Result<Self> {
        let s = vae.config().spatial_factor();
        if blocks.is_none() {
            // What has an end of its own cannot drive a session that streams until stopped.
            let rule = "covers a fixed number of frames, so the session needs num_frames (it cannot stream until stopped)";
            if request.trajectory.is_some() {
                return Err(EngineError::request("trajectory", rule));
            }
            if matches!(request.noise, NoiseSource::Supplied(_)) {
                return Err(EngineError::request("noise", rule));
            }
        }
        // Checked with the rest of the request by the engine's validation.
        let camera_guidance = request
            .camera_guidance
            .unwrap_or(dit.config().camera_guidance);
        let flow_shift = request.flow_shift.unwrap_or(dit.config().flow_shift);
        let horizon = blocks.unwrap_or(0);
        request.noise.check([
            horizon,
            request.steps,
            dit.config().out_channels(),
            BLOCK_FRAMES,
            request.height / s,
            request.width / s,
        ])?;
        Ok(Self {
            decode_state: StreamingDecodeState::new(&id)?,
            id,
            device: dit.device().clone(),
            dit,
            vae,
            decoder,
            kv: Some(kv),
            text,
            cond,
            schedule: DmdSchedule::shifted(request.steps, flow_shift)?,
            flow_shift,
            seed: request.seed,
            noise_counter: 0,
            noise_source: request.noise.clone(),
            draws: 0,
            latent_sink: request.latent_sink.clone(),
            next_block: 0,
            blocks,
            latent_hw: [request.height / s, request.width / s],
            video_hw: [request.height, request.width],
            actions: request.actions.clone(),
            controller: Controller::default(),
            interaction: None,
            trajectory: match &request.trajectory {
                Some(t) => {
                    let latent = horizon * BLOCK_FRAMES;
                    let (poses, ks) =
                        t.sample(latent, request.num_frames, request.width, request.height)?;
                    Some((framewise_deltas(&poses, None), ks))
                }
                None => None,
            },
            overlap: request.overlap,
            reuse_last_step_kv: request.reuse_last_step_kv,
            camera_guidance,
            pending: None,
            prompts: None,
            pending_text: None,
            prompt: prompt::PromptState::default(),
            cancel: CancelToken::new(),
            span: None,
            round: None,
            round_member: None,
            mid_block: false,
            detached: false,
            identity: None,
        })
    }

    /// Sends the session's allocations to planned span `span`, which ends with it.
    pub(crate) fn with_span(mut self, span: Option<SpanId>) -> Self {
        self.span = span;
        self
    }

    /// Marks a session whose span was detached at admission (it will be stepped with
    /// others): a round it runs alone is planned as a round of one.
    pub(crate) fn with_detached(mut self, detached: bool) -> Self {
        self.detached = detached;
        self
    }

    /// Lets batched rounds the session joins be planned ([`crate::round_plan`]).
    pub(crate) fn with_round_member(
        mut self,
        member: Option<Arc<crate::round::RoundMember>>,
    ) -> Self {
        self.round_member = member;
        self
    }

    /// What the session brings to a batched round's plan, if rounds are planned.
    pub(crate) fn round_member(&self) -> Option<&Arc<crate::round::RoundMember>> {
        self.round_member.as_ref()
    }

    /// Puts the session's allocations in the shared span of batched round `round` until
    /// it is taken out (`None`).
    pub(crate) fn set_round(&mut self, round: Option<SpanId>) {
        self.round = round;
    }

    /// While the guard lives, this thread's allocations go to the session's planned
    /// span, or to its round's while it is in one (to none, the cache, for a session
    /// without one: never another session's).
    pub(crate) fn enter_span(&self) -> SpanGuard {
        self.device
            .platform()
            .allocator()
            .enter_span(self.round.or(self.span))
    }

    /// Detaches the session from its plan for the rest of its life: it is stepped in a
    /// batch with others, which the plan of the session alone does not describe (see
    /// [`headroom_mem::CachingAllocator::detach_span`]).
    pub(crate) fn detach_span(&mut self) {
        if let Some(id) = self.span {
            self.device.platform().allocator().detach_span(id);
        }
        self.detached = true;
    }

    /// Whether the session was detached from its own plan (it has been stepped with
    /// others): a round it runs alone is then planned as a round of one.
    pub(crate) fn detached(&self) -> bool {
        self.detached
    }

    /// While the guard lives, this thread's allocations go to no planned span (work
    /// this session shares with others).
    pub(crate) fn no_span(&self) -> SpanGuard {
        self.device.platform().allocator().enter_span(None)
    }

    /// Lets the session change its prompt with the engine's text encoder.
    pub(crate) fn with_prompts(mut self, prompts: Arc<Prompts>) -> Self {
        self.prompts = Some(prompts);
        self
    }

    /// Makes `token` end this session's chunks at their next safe point (between DMD
    /// steps, before the commit, before the decode, between decoded latent frames): the
    /// chunk then returns [`EngineError::Cancelled`] and the session releases its KV
    /// pages, decoder state and conditioning.
    pub fn set_cancel(&mut self, token: CancelToken) {
        self.cancel = token;
    }

    /// Fails with [`EngineError::Cancelled`] when the token says stop at `at`.
    fn checkpoint(&self, at: Checkpoint) -> Result<()> {
        match cancelled(&self.cancel, &self.id, at) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The session id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Chunks produced so far.
    pub fn chunks_done(&self) -> usize {
        self.next_block
    }

    /// Chunks the session will produce; `None` for a session that streams until it is
    /// stopped.
    pub fn chunks_total(&self) -> Option<usize> {
        self.blocks
    }

    /// Bytes of the session's conditioning: the text's cross-attention keys/values and
    /// the image condition.
    pub fn conditioning_bytes(&self) -> u64 {
        let text: usize = self
            .text
            .0
            .iter()
            .map(|kv| kv.k.storage_bytes() + kv.v.storage_bytes())
            .sum();
        text as u64 + self.cond.as_ref().map_or(0, ImageCondition::bytes)
    }

    /// Generates, commits and decodes the next block: 9 frames first, then 12.
    pub fn next_chunk(&mut self) -> Result<Chunk> {
        let _inside = self.enter_span();
        let result = self.try_next_chunk();
        self.settle(&result);
        result
    }

    /// Ends the session when its chunk failed or was cancelled: what it held is given
    /// back now, and the platform hears the phase.
    pub(crate) fn settle<T>(&mut self, result: &Result<T>) {
        let end: fn(&dyn headroom_mem::Platform) = match result {
            Ok(_) | Err(EngineError::Finished(_)) => return,
            // A cancelled chunk ends the session as a close does.
            Err(EngineError::Cancelled { .. }) => phases::session_end,
            // A failed chunk ends the session: give back what it held now.
            Err(_) => phases::error,
        };
        // The session leaves its round: its end ends its own span.
        self.round = None;
        let _own = self.enter_span();
        self.release();
        end(self.device.platform().as_ref());
    }

    /// The next block's index, checking that the session can run it.
    pub(crate) fn chunk_start(&self) -> Result<usize> {
        let n = self.next_block;
        if self.blocks.is_some_and(|b| n >= b) || self.kv.is_none() {
            return Err(EngineError::Finished(self.id.clone()));
        }
        self.checkpoint(Checkpoint::ChunkStart)?;
        Ok(n)
    }

    /// Whether the session's next chunk can join a batched step: one that decodes on a
    /// second thread while it denoises ahead (overlap) runs its chunks alone.
    pub(crate) fn batches(&self) -> bool {
        !self.overlap
    }

    /// The model the session runs.
    pub(crate) fn dit(&self) -> &Arc<WanTransformer> {
        &self.dit
    }

    fn release(&mut self) {
        self.pending = None;
        self.kv = None;
        self.cond = None;
        self.text = TextKeyValues(Vec::new());
        self.pending_text = None;
        self.prompt = prompt::PromptState::default();
        self.decode_state.release();
    }

    /// The session's chunks as an iterator (see [`Chunks`]).
    pub fn chunks(&mut self) -> Chunks<&mut Session> {
        Chunks { session: self }
    }

    /// Ends the session, releasing everything it holds.
    pub fn close(self) {}
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field(
                "chunks",
                &format_args!(
                    "{}/{}",
                    self.next_block,
                    self.blocks.map_or("∞".to_string(), |b| b.to_string())
                ),
            )
            .field("seed", &self.seed)
            .finish()
    }
}

/// A session's chunks in order ([`Session::chunks`], or the session itself taken by
/// value): `None` once it made its last, or after the error that ended it.
#[derive(Debug)]
pub struct Chunks<S> {
    session: S,
}

impl<S: std::borrow::BorrowMut<Session>> Iterator for Chunks<S> {
    type Item = Result<Chunk>;

    fn next(&mut self) -> Option<Result<Chunk>> {
        match self.session.borrow_mut().next_chunk() {
            Err(EngineError::Finished(_)) => None,
            other => Some(other),
        }
    }
}

impl IntoIterator for Session {
    type Item = Result<Chunk>;
    type IntoIter = Chunks<Session>;

    fn into_iter(self) -> Chunks<Session> {
        Chunks { session: self }
    }
}

impl<'a> IntoIterator for &'a mut Session {
    type Item = Result<Chunk>;
    type IntoIter = Chunks<&'a mut Session>;

    fn into_iter(self) -> Chunks<&'a mut Session> {
        Chunks { session: self }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let inside = self.enter_span();
        self.release();
        phases::session_end(self.device.platform().as_ref());
        drop(inside);
        // The phase ended the span (it was entered); a second close does nothing.
        if let Some(id) = self.span {
            self.device.platform().allocator().close_span(id);
        }
    }
}
