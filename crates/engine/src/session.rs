//! A streaming session: the per-block DMD loop against the session's KV pages, the
//! commit forward, and the session-owned VAE decode, with reclaim consulted at every
//! named phase boundary. Dropping a session releases its pages, decoder state and
//! conditioning on every path.

use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_mem::{MemoryStats, Phase, SpanGuard, SpanId};
use headroom_model::camera::{
    default_intrinsics, framewise_deltas, identity, ray_embedding, CameraUpdate, Controller,
    InteractionHandler, Keys, Pose, STEP,
};
use headroom_model::dit::config::IMAGE_MASK_CHANNELS;
use headroom_model::dit::{BatchItem, KeyValues, TextKeyValues, TokenGrid};
use headroom_model::dmd::{guided_velocity, renoise, x0_from_velocity, DmdSchedule};
use headroom_model::kv::SessionKv;
use headroom_model::{OutputFormat, StreamingDecodeState, VideoDecoder, WanTransformer, WanVae};
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::{DType, Device, Tensor};

use crate::cancel::{CancelToken, Checkpoint};
use crate::condition::ImageCondition;
use crate::error::{EngineError, Result};
use crate::loop_io::{LatentSink, NoiseSource};
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

/// A block being denoised: its inputs and where its DMD loop stands.
#[derive(Debug)]
pub(crate) struct BlockRun {
    first: usize,
    past: Option<Vec<KeyValues>>,
    camera: Option<Tensor>,
    /// A still camera's tokens for the block, under camera guidance.
    still: Option<Tensor>,
    x: Tensor,
    x0: Tensor,
    /// The next forward: DMD step `k` while `k < steps`, then the commit.
    k: usize,
    /// The block's keys/values, once a forward gave them for the commit.
    own: Option<Vec<KeyValues>>,
    start: Instant,
    denoise: Duration,
}

/// The inputs of one transformer forward of a block.
#[derive(Debug)]
pub(crate) struct StepInput {
    tokens: Tensor,
    positions: Vec<[usize; 3]>,
    t: f32,
    grid: TokenGrid,
    /// The model input the tokens were embedded from, held through the forward.
    _input: Tensor,
}

/// A block's clean latents and how long they took.
#[derive(Debug)]
pub(crate) struct Denoised {
    pub(crate) x0: Tensor,
    denoise: Duration,
    commit: Duration,
}

/// Decodes clean block latents into u8 frames `[T, H, W, 3]` through the session's
/// decoder state, looking at `cancel` before it starts and between latent frames.
fn decode_block(
    decoder: &dyn VideoDecoder,
    state: &mut StreamingDecodeState,
    x0: &Tensor,
    cancel: &CancelToken,
    id: &str,
) -> Result<(Tensor, Duration)> {
    if let Some(e) = cancelled(cancel, id, Checkpoint::Decode) {
        return Err(e);
    }
    let start = Instant::now();
    let stopped_after = std::cell::Cell::new(None);
    let go_on = |frames| {
        let stop = cancel.stop_reason().is_some();
        if stop {
            stopped_after.set(Some(frames));
        }
        !stop
    };
    let pixels = decoder
        .decode_streams(&[x0], &mut [state], OutputFormat::PlanarUint8, &go_on)?
        .and_then(|mut v| v.pop());
    let Some(pixels) = pixels else {
        let at = Checkpoint::DecodedFrames {
            frames: stopped_after.get().unwrap_or(0),
        };
        return Err(cancelled(cancel, id, at)
            .unwrap_or_else(|| EngineError::Internal("the decode produced no frames".into())));
    };
    Ok((frames_of(pixels)?, start.elapsed()))
}

/// Planar u8 pixels `[3, T, H, W]` as the frames of a chunk, `[T, H, W, 3]`.
pub(crate) fn frames_of(pixels: Tensor) -> Result<Tensor> {
    let pixels = pixels.permute(&[1, 2, 3, 0])?.contiguous()?;
    pixels.device().synchronize()?;
    Ok(pixels)
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
    /// Checked at every safe point of a chunk.
    cancel: CancelToken,
    /// The planned span the session's allocations go to, if admission opened one.
    span: Option<SpanId>,
    /// The shared span of the batched round the session is in, while it is in one.
    round: Option<SpanId>,
    /// What the session brings to the plans of batched rounds (under `planned`).
    round_member: Option<Arc<crate::round::RoundMember>>,
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
            schedule: DmdSchedule::shifted(request.steps, request.flow_shift)?,
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
            cancel: CancelToken::new(),
            span: None,
            round: None,
            round_member: None,
        })
    }

    /// Sends the session's allocations to planned span `span`, which ends with it.
    pub(crate) fn with_span(mut self, span: Option<SpanId>) -> Self {
        self.span = span;
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
    pub(crate) fn detach_span(&self) {
        if let Some(id) = self.span {
            self.device.platform().allocator().detach_span(id);
        }
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

    /// Changes the prompt: it is encoded now (errors surface here) and conditions every
    /// block from the next chunk boundary on. With `overlap`, the block already denoised
    /// ahead keeps the old prompt, so the change shows one chunk later.
    pub fn set_prompt(&mut self, prompt: &str) -> Result<()> {
        let embeds = match &self.prompts {
            Some(prompts) => prompts.encode(prompt)?,
            None => {
                return Err(EngineError::request(
                    "prompt",
                    "this session was not opened by an engine with a text encoder",
                ))
            }
        };
        self.pending_text = Some(self.dit.text_key_values(embeds.as_ref())?);
        Ok(())
    }

    /// Changes the text to embeddings `[L, text_dim]` (zero-padded to 512 tokens, as
    /// at the start): like [`Session::set_prompt`], from the next block denoised on.
    pub fn set_text_embeds(&mut self, embeds: &Tensor) -> Result<()> {
        let text = crate::text::pad_text(Some(embeds), self.dit.config().text_dim, &self.device)?;
        self.pending_text = Some(self.dit.text_key_values(text.as_ref())?);
        Ok(())
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

    /// The next noise tensor the loop draws: supplied, or from the session's generator.
    fn noise(&mut self, shape: &[usize]) -> Result<Tensor> {
        if let Some(t) = self.noise_source.draw(self.draws, shape, &self.device)? {
            self.draws += 1;
            return Ok(t);
        }
        let t = Tensor::randn(
            shape,
            self.seed,
            self.noise_counter,
            DType::F32,
            &self.device,
        )?;
        self.noise_counter += t.numel() as u64;
        Ok(t)
    }

    /// This block's camera tokens: the keys of its 3 latent frames integrated from the
    /// previous block's last pose, relative deltas normalised over the block (anchor
    /// dropped), rays on the pixel grid folded onto the latent grid (STEPWISE A4–A10).
    fn camera_tokens(&mut self, first_frame: usize) -> Result<Option<Tensor>> {
        if !self.dit.has_camera() {
            return Ok(None);
        }
        let [h, w] = self.video_hw;
        let fold = self.vae.config().spatial_factor();
        if let Some((deltas, ks)) = &self.trajectory {
            // A file trajectory is embedded whole (normalised by its global maximum) and
            // sliced per block (STEPWISE A5).
            let range = first_frame..first_frame + BLOCK_FRAMES;
            let rays = ray_embedding(&deltas[range.clone()], h, w, &ks[range], fold, &self.device)?;
            return Ok(self.dit.camera_tokens(&rays)?);
        }
        let (poses, scale) = match self.interaction.as_mut() {
            // Interaction: the server cannot see future motion, so translations use the
            // fixed scale of one W step (STEPWISE A7).
            Some(handler) => {
                let anchor = handler.pose();
                (
                    std::iter::once(anchor)
                        .chain(handler.step_chunk(BLOCK_FRAMES))
                        .collect::<Vec<_>>(),
                    Some(STEP),
                )
            }
            None => {
                let mut poses = vec![self.controller.pose];
                for f in first_frame..first_frame + BLOCK_FRAMES {
                    let keys = self.actions.get(f).copied().unwrap_or_default();
                    poses.push(self.controller.step(keys));
                }
                (poses, None)
            }
        };
        let deltas = framewise_deltas(&poses, scale);
        let rays = ray_embedding(
            &deltas[1..],
            h,
            w,
            &[default_intrinsics(w, h)],
            fold,
            &self.device,
        )?;
        Ok(self.dit.camera_tokens(&rays)?)
    }

    /// The tokens of a camera that stands still over the block (the negative of camera
    /// guidance): identity deltas with the block's intrinsics.
    fn still_camera_tokens(&self, first_frame: usize) -> Result<Option<Tensor>> {
        let [h, w] = self.video_hw;
        let ks = match &self.trajectory {
            Some((_, ks)) => ks[first_frame..first_frame + BLOCK_FRAMES].to_vec(),
            None => vec![default_intrinsics(w, h)],
        };
        let deltas = [identity(); BLOCK_FRAMES];
        let fold = self.vae.config().spatial_factor();
        let rays = ray_embedding(&deltas, h, w, &ks, fold, &self.device)?;
        Ok(self.dit.camera_tokens(&rays)?)
    }

    /// The model input of block latents `x`: with the block's image condition appended
    /// for image-conditioned models.
    fn model_input(&self, x: &Tensor) -> Result<Tensor> {
        match self.cond.as_ref().and_then(ImageCondition::current) {
            Some(c) => Ok(Tensor::cat(&[x, c], 1)?),
            None => Ok(x.clone()),
        }
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
        let phase = match result {
            Ok(_) | Err(EngineError::Finished(_)) => return,
            // A cancelled chunk ends the session as a close does.
            Err(EngineError::Cancelled { .. }) => Phase::SessionEnd,
            // A failed chunk ends the session: give back what it held now.
            Err(_) => Phase::Error,
        };
        // The session leaves its round: its end ends its own span.
        self.round = None;
        let _own = self.enter_span();
        self.release();
        self.device.platform().phase(phase);
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

    /// Hands the denoised block `n` to the latent sink, decodes it through the
    /// session's decoder state and makes the chunk (the path without overlap).
    pub(crate) fn decode_chunk(
        &mut self,
        n: usize,
        block: Denoised,
        stats_denoise_end: MemoryStats,
    ) -> Result<Chunk> {
        if let Some(sink) = &self.latent_sink {
            sink.accept(n, &block.x0)?;
        }
        let (frames, decode) = decode_block(
            self.decoder.as_ref(),
            &mut self.decode_state,
            &block.x0,
            &self.cancel,
            &self.id,
        )?;
        Ok(self.delivered(n, &block, frames, decode, stats_denoise_end))
    }

    /// What a batched decode of block `n` takes from this session: the block goes to
    /// the latent sink and the cancel token is looked at.
    pub(crate) fn decode_input(&self, n: usize, block: &Denoised) -> Result<()> {
        if let Some(sink) = &self.latent_sink {
            sink.accept(n, &block.x0)?;
        }
        self.checkpoint(Checkpoint::Decode)
    }

    /// The session's decoder and its state, for a batched decode.
    pub(crate) fn decoder(&mut self) -> (&Arc<dyn VideoDecoder>, &mut StreamingDecodeState) {
        (&self.decoder, &mut self.decode_state)
    }

    /// The session's image condition, VAE and video size, for a batched encode.
    pub(crate) fn condition(&mut self) -> Option<(&mut ImageCondition, &Arc<WanVae>, [usize; 2])> {
        let hw = self.video_hw;
        self.cond.as_mut().map(|c| (c, &self.vae, hw))
    }

    /// Block `n`'s chunk of `frames`, decoded in `decode`; the session moves on.
    pub(crate) fn delivered(
        &mut self,
        n: usize,
        block: &Denoised,
        frames: Tensor,
        decode: Duration,
        stats_denoise_end: MemoryStats,
    ) -> Chunk {
        self.next_block += 1;
        Chunk {
            index: n,
            frames,
            timings: ChunkTimings {
                denoise: block.denoise,
                commit: block.commit,
                decode,
            },
            stats_denoise_end,
            stats_decoded: self.device.platform().memory_stats(),
        }
    }

    fn try_next_chunk(&mut self) -> Result<Chunk> {
        let n = self.chunk_start()?;
        let platform = self.device.platform().clone();
        let block = match self.pending.take() {
            Some(block) => block,
            None => {
                let block = self.denoise_block(n)?;
                platform.phase(Phase::DenoiseEnd);
                block
            }
        };
        let stats_denoise_end = platform.memory_stats();
        if !(self.overlap && self.blocks.is_none_or(|b| n + 1 < b)) {
            return self.decode_chunk(n, block, stats_denoise_end);
        }
        if let Some(sink) = &self.latent_sink {
            sink.accept(n, &block.x0)?;
        }
        let (frames, decode) = {
            // Decode block n on a second thread while block n + 1 denoises here; the
            // decoder state moves to that thread and back.
            let placeholder = StreamingDecodeState::new(&self.id)?;
            let mut state = std::mem::replace(&mut self.decode_state, placeholder);
            let decoder = Arc::clone(&self.decoder);
            let x0 = block.x0.clone();
            let (cancel, id) = (self.cancel.clone(), self.id.clone());
            // The decode belongs to this session's planned span on that thread too.
            let (allocator, span) = (self.device.platform().allocator().clone(), self.span);
            let (decoded, next) = std::thread::scope(|scope| {
                let worker = scope.spawn(move || {
                    let _inside = allocator.enter_span(span);
                    let out = decode_block(decoder.as_ref(), &mut state, &x0, &cancel, &id);
                    (out, state)
                });
                let next = self.denoise_block(n + 1);
                (worker.join(), next)
            });
            let (decoded, state) =
                decoded.map_err(|_| EngineError::Internal("the decode thread panicked".into()))?;
            self.decode_state = state;
            self.pending = Some(next?);
            platform.phase(Phase::DenoiseEnd);
            decoded?
        };
        Ok(self.delivered(n, &block, frames, decode, stats_denoise_end))
    }

    /// Starts block `n`: a prompt change takes effect, the block's image condition is
    /// encoded, its history gathered from the KV pages, its camera tokens and first
    /// noise drawn.
    pub(crate) fn begin_block(&mut self, n: usize) -> Result<BlockRun> {
        if let Some(text) = self.pending_text.take() {
            // A prompt change takes effect at the first block denoised after it.
            self.text = text;
        }
        let first = BLOCK_FRAMES * n;
        let [h, w] = self.latent_hw;
        let out_c = self.dit.config().out_channels();
        let start = Instant::now();
        // This block's image condition, encoded as the block starts (the last block's
        // goes first, so one block's is held at a time).
        if let Some(cond) = self.cond.as_mut() {
            cond.advance(&self.vae, n)?;
        }
        let past = self
            .kv
            .as_ref()
            .map(SessionKv::gather)
            .transpose()?
            .flatten();
        let camera = self.camera_tokens(first)?;
        let still = match camera {
            Some(_) if self.camera_guidance != 1.0 => self.still_camera_tokens(first)?,
            _ => None,
        };
        let x = self.noise(&[1, out_c, BLOCK_FRAMES, h, w])?;
        Ok(BlockRun {
            first,
            past,
            camera,
            still,
            x0: x.clone(),
            x,
            k: 0,
            own: None,
            start,
            denoise: Duration::ZERO,
        })
    }

    /// The block's next transformer forward (a DMD step, then the commit at t = 0), or
    /// `None` once its keys/values are there; looks at the cancel token first.
    pub(crate) fn step_input(&self, run: &BlockRun) -> Result<Option<StepInput>> {
        if run.own.is_some() {
            return Ok(None);
        }
        let steps = self.schedule.len();
        let (x, t) = if run.k < steps {
            self.checkpoint(Checkpoint::DenoiseStep { step: run.k })?;
            (&run.x, self.schedule.timesteps[run.k])
        } else {
            self.checkpoint(Checkpoint::Commit)?;
            (&run.x0, 0.0)
        };
        let input = self.model_input(x)?;
        let grid = self.dit.grid(&input)?;
        let tokens = self.dit.embed(&input)?;
        Ok(Some(StepInput {
            positions: grid.positions(run.first),
            tokens,
            t,
            grid,
            _input: input,
        }))
    }

    /// This session's part of a forward: its text, history and camera tokens.
    pub(crate) fn batch_item<'a>(
        &'a self,
        run: &'a BlockRun,
        step: &'a StepInput,
    ) -> BatchItem<'a> {
        BatchItem {
            tokens: &step.tokens,
            positions: &step.positions,
            t: step.t,
            text: &self.text,
            past: run.past.as_deref(),
            camera: run.camera.as_ref(),
        }
    }

    /// Under camera guidance, the still camera's part of a DMD step's forward (the same
    /// tokens, history and text); `None` for the commit and without guidance.
    pub(crate) fn guided_item<'a>(
        &'a self,
        run: &'a BlockRun,
        step: &'a StepInput,
    ) -> Option<BatchItem<'a>> {
        let still = run.still.as_ref()?;
        (run.k < self.schedule.len()).then(|| BatchItem {
            camera: Some(still),
            ..self.batch_item(run, step)
        })
    }

    /// Takes the forward's velocity `v` and keys/values `own` (and the still camera's
    /// velocity under guidance): a DMD step's x0 and the next step's noisy latents, or
    /// the commit's keys/values.
    pub(crate) fn step_output(
        &mut self,
        run: &mut BlockRun,
        step: StepInput,
        v: Tensor,
        own: Vec<KeyValues>,
        still_v: Option<Tensor>,
    ) -> Result<()> {
        let steps = self.schedule.len();
        let k = run.k;
        run.k += 1;
        if k >= steps {
            run.own = Some(own);
            return Ok(());
        }
        if self.reuse_last_step_kv && k + 1 == steps {
            run.own = Some(own);
        } else {
            drop(own);
        }
        let v = match still_v {
            Some(still_v) => guided_velocity(&v, &still_v, self.camera_guidance)?,
            None => v,
        };
        let v = self.dit.unpatchify(&v, step.grid)?;
        drop(step);
        run.x0 = x0_from_velocity(&run.x, &v, self.schedule.sigmas[k])?;
        if run.first == 0 && self.dit.config().keep_first_frame {
            run.x0 = self.keep_given_frame(&run.x0)?;
        }
        if k + 1 < steps {
            let [h, w] = self.latent_hw;
            let out_c = self.dit.config().out_channels();
            let eps = self.noise(&[1, out_c, BLOCK_FRAMES, h, w])?;
            run.x = renoise(&run.x0, &eps, self.schedule.sigmas[k + 1])?;
        } else {
            run.x0.device().synchronize()?;
            run.denoise = run.start.elapsed();
            run.start = Instant::now();
        }
        Ok(())
    }

    /// Block 0's x0 with latent frame 0 replaced by the given image's latents (a model
    /// with `keep_first_frame`): every later step noises, and the commit keeps, the
    /// truth for the frame the session was given.
    fn keep_given_frame(&self, x0: &Tensor) -> Result<Tensor> {
        let Some(c) = self.cond.as_ref().and_then(ImageCondition::current) else {
            return Ok(x0.clone());
        };
        let [_, z, f, _, _] = *x0.shape() else {
            return Ok(x0.clone());
        };
        let given = c
            .narrow(1, IMAGE_MASK_CHANNELS, z)?
            .narrow(2, 0, 1)?
            .to_dtype(x0.dtype())?;
        Ok(Tensor::cat(&[&given, &x0.narrow(2, 1, f - 1)?], 2)?)
    }

    /// Commits the block's keys/values to the session's KV pages.
    pub(crate) fn finish_block(&mut self, run: BlockRun) -> Result<Denoised> {
        let BlockRun {
            first,
            past,
            camera,
            still,
            x0,
            own,
            start,
            denoise,
            ..
        } = run;
        drop(past);
        drop(camera);
        drop(still);
        let own = own.ok_or_else(|| {
            EngineError::Internal("the block ended before its keys/values".into())
        })?;
        if let Some(kv) = self.kv.as_mut() {
            kv.commit(first, &own)?;
        }
        drop(own);
        x0.device().synchronize()?;
        Ok(Denoised {
            x0,
            denoise,
            commit: start.elapsed(),
        })
    }

    /// The DMD steps of block `n` and its KV commit (the commit forward at t = 0, or the
    /// last step's keys/values when reusing them), one forward at a time.
    fn denoise_block(&mut self, n: usize) -> Result<Denoised> {
        let mut run = self.begin_block(n)?;
        while let Some(step) = self.step_input(&run)? {
            let forward = |item: BatchItem| {
                self.dit.forward_tokens(
                    item.tokens,
                    item.positions,
                    item.t,
                    item.text,
                    item.past,
                    Mask::None,
                    item.camera,
                )
            };
            let (v, own) = forward(self.batch_item(&run, &step))?;
            let still_v = match self.guided_item(&run, &step) {
                Some(item) => Some(forward(item)?.0),
                None => None,
            };
            self.step_output(&mut run, step, v, own, still_v)?;
        }
        self.finish_block(run)
    }

    fn release(&mut self) {
        self.pending = None;
        self.kv = None;
        self.cond = None;
        self.text = TextKeyValues(Vec::new());
        self.pending_text = None;
        self.decode_state.release();
    }

    /// Queues a camera update (`target` or `velocity`); it takes effect at the next chunk
    /// boundary. A session driven by an action script refuses updates, as vllm-omni does.
    pub fn interact(&mut self, update: CameraUpdate) -> Result<()> {
        if !self.actions.is_empty() || self.trajectory.is_some() {
            return Err(EngineError::request(
                "interaction",
                "this session follows an action script; camera updates cannot be mixed with it",
            ));
        }
        self.interaction
            .get_or_insert_with(InteractionHandler::default)
            .queue(update)?;
        Ok(())
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
        self.device.platform().phase(Phase::SessionEnd);
        drop(inside);
        // The phase ended the span (it was entered); a second close does nothing.
        if let Some(id) = self.span {
            self.device.platform().allocator().close_span(id);
        }
    }
}
