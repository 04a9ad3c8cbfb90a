//! Admission: a request's rules, its KV pages from the shared pool, room for its
//! decoder state and conditioning, its planned peak beside what live sessions have
//! committed, and then the open session. An admission dropped unopened gives all back.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use headroom_mem::SpanId;
use headroom_model::kv::{KvPool, PageLayout, SessionKv};
use headroom_tensor::{DType, Tensor};

use crate::blocks::BLOCK_FRAMES;
use crate::condition::ImageCondition;
use crate::error::{AdmissionKind, EngineError, Result};
use crate::session::{Session, SessionRequest};
use crate::snapshot::SessionSnapshot;
use crate::text::pad_text;
use headroom_model::dit::TextKeyValues;

use super::Engine;

impl Engine {
    fn validate(&self, r: &SessionRequest) -> Result<Option<usize>> {
        let sp = self.dit.sharding().map_or(1, |shard| shard.sp.size());
        let blocks = crate::model_source::check_shape(
            self.dit.config(),
            self.vae.config(),
            sp,
            r.width,
            r.height,
            r.num_frames,
        )?;
        if r.steps == 0 {
            return Err(EngineError::request("steps", "must be at least 1"));
        }
        self.decoder_for(r.decoder)?;
        if let Some(rule) = r.flow_shift.and_then(headroom_model::dmd::flow_shift_error) {
            return Err(EngineError::request("flow_shift", rule));
        }
        if let Some(g) = r.camera_guidance {
            if let Some(rule) = headroom_model::dmd::guidance_scale_error(g) {
                return Err(EngineError::request("camera_guidance", rule));
            }
            if g != 1.0 && !self.dit.has_camera() {
                return Err(EngineError::request(
                    "camera_guidance",
                    "needs a model with a camera adapter (this one takes no camera)",
                ));
            }
        }
        crate::model_source::check_camera(
            r.num_frames,
            r.actions.len(),
            r.trajectory.as_ref().map(|t| t.poses.len()),
        )?;
        if r.prompt.is_some() && r.text_embeds.is_some() {
            return Err(EngineError::request(
                "prompt",
                "give a prompt or text_embeds, not both",
            ));
        }
        if r.prompt.as_deref().is_some_and(|p| !p.trim().is_empty()) && !self.prompts.available() {
            return Err(EngineError::request(
                "prompt",
                "this model has no text encoder (no text_encoder/ in its folder), so it takes no prompt",
            ));
        }
        if let Some(image) = &r.image {
            if image.shape() != [3, r.height, r.width] {
                return Err(EngineError::request(
                    "image",
                    format!(
                        "must be [3, {}, {}] in [−1, 1], got {:?}",
                        r.height,
                        r.width,
                        image.shape()
                    ),
                ));
            }
        }
        Ok(blocks)
    }

    /// Bytes a new allocation can take: the device's free memory plus what the allocator
    /// holds cached.
    fn free_bytes(&self) -> u64 {
        self.platform().mem_info().0 + self.platform().memory_stats().cached_now()
    }

    /// Tokens of one latent frame at `width` × `height`.
    fn frame_tokens(&self, width: usize, height: usize) -> usize {
        let c = self.dit.config();
        let s = self.vae.config().spatial_factor();
        (height / s / c.patch_size[1]) * (width / s / c.patch_size[2])
    }

    /// The layout of this engine's KV pages.
    fn page_layout(&self) -> PageLayout {
        let c = self.dit.config();
        PageLayout {
            layers: c.num_layers,
            tokens: self.config.kv_page_tokens,
            heads: self.dit.kv_heads(),
            head_dim: c.attention_head_dim,
            dtype: self.config.weight_dtype,
        }
    }

    /// KV pages a session at `width` × `height` holds: its window's frames, each
    /// ⌈tokens / page tokens⌉ pages. Sessions of any resolution share one pool.
    pub fn kv_pages_for(&self, width: usize, height: usize) -> usize {
        self.page_layout()
            .session_pages(self.frame_tokens(width, height), self.config.window_frames)
    }

    /// The pool, created at the first session with room for `max_sessions` sessions of
    /// `need` pages each (or the configured budget). A session that needs more pages
    /// than the whole pool holds rebuilds it larger while no session holds pages, and is
    /// refused (to wait for the others) while one does.
    fn pool_for(&self, layout: PageLayout, need: usize) -> Result<Arc<KvPool>> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        match pool.as_ref() {
            Some(p) if p.layout() == layout && p.total_pages() >= need => {
                return Ok(Arc::clone(p))
            }
            Some(p) if p.free_pages() != p.total_pages() => {
                return Err(EngineError::admission(AdmissionKind::KvPages, format!(
                    "the KV pool holds {} pages and this session needs {need}; it grows once the {} pages in use are given back",
                    p.total_pages(),
                    p.total_pages() - p.free_pages(),
                )))
            }
            _ => {}
        }
        // Replacing an idle pool frees its pages before the new one takes its own.
        *pool = None;
        let budget = match self.config.kv_fraction {
            Some(f) if !(f > 0.0 && f <= 1.0) => {
                return Err(EngineError::request(
                    "kv_fraction",
                    format!("must be in (0, 1], got {f}"),
                ))
            }
            Some(f) => Some((self.platform().mem_info().0 as f64 * f) as u64),
            None => self.config.kv_budget_bytes,
        };
        let budget = budget
            .unwrap_or_else(|| layout.bytes() * (need * self.config.max_sessions.max(1)) as u64);
        let page = layout.bytes().max(1);
        let pages = budget / page;
        let free = self.free_bytes();
        if pages * page > free {
            return Err(EngineError::admission_bytes(
                AdmissionKind::Memory,
                pages * page,
                free,
                format!(
                    "the KV pool's {} B ({pages} pages of {page} B) do not fit in {free} B free",
                    pages * page
                ),
            ));
        }
        let created = KvPool::with_budget(layout, budget, need, &self.device)
            .map_err(|e| EngineError::admission(AdmissionKind::Memory, e.to_string()))?;
        *pool = Some(Arc::clone(&created));
        Ok(created)
    }

    /// Validates and admits a session: its KV pages are reserved now, and its decoder
    /// state and conditioning must fit in the device's free memory.
    pub fn open_session(&self, request: SessionRequest) -> Result<Session> {
        self.admit_session(request)?.open()
    }

    /// The first half of [`Engine::open_session`], which no collective takes part in:
    /// the request's rules, the KV pages, the free memory, the prompt and the planned
    /// span. Ranks of a mesh admit, agree that every rank admitted, then open (whose
    /// forwards meet at collectives); an admission dropped unopened gives all back.
    pub fn admit_session(&self, request: SessionRequest) -> Result<Admitted<'_>> {
        let (kv, blocks) = self.admit_room(&request)?;
        let embeds = match request.prompt.as_deref() {
            Some(prompt) => self.prompts.encode(prompt)?,
            None => request.text_embeds.clone(),
        };
        // The planned span starts after the prompt is encoded: whether it came from the
        // cache changes the allocations, not the session's.
        let span = self.planner.begin_span(self, &request, blocks, false)?;
        Ok(Admitted {
            engine: self,
            parts: Some((request, kv, Opening::Fresh(embeds), blocks)),
            span,
        })
    }

    /// What admitting `request` takes before its text: its rules, its KV pages from
    /// the pool, room for its decoder state and conditioning; returns the pages and the
    /// session's blocks (`None`: no end).
    pub(super) fn admit_room(
        &self,
        request: &SessionRequest,
    ) -> Result<(SessionKv, Option<usize>)> {
        let blocks = self.validate(request)?;
        let tokens = self.frame_tokens(request.width, request.height);
        let layout = self.page_layout();
        let pool = self.pool_for(
            layout,
            layout.session_pages(tokens, self.config.window_frames),
        )?;
        let kv = SessionKv::new(
            &pool,
            tokens,
            self.config.sink_frames,
            self.config.window_frames,
            BLOCK_FRAMES,
        )
        .map_err(|e| EngineError::admission(AdmissionKind::Memory, e.to_string()))?;
        let state = self
            .decoder_for(request.decoder)?
            .state_bytes(request.height, request.width);
        // The image condition is streamed: one block's latents at a time (the 4 mask
        // channels and the VAE's latent channels, f32).
        let s = self.vae.config().spatial_factor();
        let channels = 4 + self.vae.config().z_dim;
        let cond_bytes =
            (channels * BLOCK_FRAMES * (request.height / s) * (request.width / s) * 4) as u64;
        let free = self.free_bytes();
        if state + cond_bytes > free {
            return Err(EngineError::admission_bytes(
                AdmissionKind::Memory,
                state + cond_bytes,
                free,
                format!(
                "decoder state {state} B + conditioning {cond_bytes} B do not fit in {free} B free"
            ),
            ));
        }
        Ok((kv, blocks))
    }

    /// The rest of `open_session`, inside the planned span.
    fn open_planned(
        &self,
        request: SessionRequest,
        kv: SessionKv,
        embeds: Option<Tensor>,
        blocks: Option<usize>,
        span: Option<SpanId>,
    ) -> Result<Session> {
        let c = self.dit.config();
        let padded = self.padded_text(embeds.as_ref())?;
        let text = self.dit.text_key_values(padded.as_ref())?;
        drop(embeds);
        let cond = if c.takes_image_condition() {
            Some(self.image_condition(&request)?)
        } else {
            None
        };
        let session = self
            .new_session(kv, text, cond, &request, blocks)?
            .with_text_embeds(padded.as_ref())?;
        drop(padded);
        let round_member = self.planner.round_member(self, &request, span);
        Ok(session
            .with_span(span)
            .with_detached(span.is_some() && self.planner.batched_steps())
            .with_round_member(round_member))
    }

    /// A new session of `request` over its admitted pages, text and condition, with
    /// the engine's text encoder and identity.
    pub(super) fn new_session(
        &self,
        kv: SessionKv,
        text: TextKeyValues,
        cond: Option<ImageCondition>,
        request: &SessionRequest,
        blocks: Option<usize>,
    ) -> Result<Session> {
        let id = format!("session-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        Ok(Session::new(
            id,
            Arc::clone(&self.dit),
            Arc::clone(&self.vae),
            self.decoder_for(request.decoder)?,
            kv,
            text,
            cond,
            request,
            blocks,
        )?
        .with_prompts(Arc::clone(&self.prompts))
        .with_identity(Arc::clone(&self.identity)))
    }

    /// Text embeddings zero-padded to the 512 tokens the Wan pipelines feed.
    fn padded_text(&self, text: Option<&Tensor>) -> Result<Option<Tensor>> {
        pad_text(text, self.dit.config().text_dim, &self.device)
    }

    /// The session's image condition, streamed block by block ([`ImageCondition`]):
    /// `[mask (4) | normalised image latent (16)]` per latent frame, the VAE mean of
    /// `[image, 0, 0, …]` (the request's image, else the folder's own first frame, else
    /// black), mask 1 at frame 0 only. The later pixel frames are zeros in the [−1, 1]
    /// range (mid-grey), as LingBot's `image2video_fast.py` (`torch.zeros`) and
    /// vllm-omni's `_prepare_condition` (`new_zeros`) build them; black (−1) frames
    /// condition a real checkpoint on a video it was never trained on.
    fn image_condition(&self, r: &SessionRequest) -> Result<ImageCondition> {
        let first = match &r.image {
            Some(image) => image
                .to_device(&self.device)?
                .to_dtype(DType::F32)?
                .reshape(&[1, 3, 1, r.height, r.width])?,
            None => match &self.first_frame {
                Some(rgb) => crate::first_frame::to_tensor(rgb, r.width, r.height, &self.device)?
                    .reshape(&[1, 3, 1, r.height, r.width])?,
                None => Tensor::full(
                    &[1, 3, 1, r.height, r.width],
                    -1.0,
                    DType::F32,
                    &self.device,
                )?,
            },
        };
        // A meta device cannot see where the condition settles: the architecture says.
        let settles = self
            .device
            .is_meta()
            .then(|| self.planner.condition_settle_block(self));
        ImageCondition::new(first, settles.flatten(), self.image_origin(r)?)
    }

    /// A fingerprint of where a session's first frame comes from (the request's image,
    /// the folder's own first frame, or black) and its size: the same on the meta twin
    /// as on the real device.
    fn image_origin(&self, r: &SessionRequest) -> Result<u64> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (r.width, r.height).hash(&mut hasher);
        match (&r.image, &self.first_frame) {
            (Some(image), _) => {
                image.shape().hash(&mut hasher);
                match image.host_bytes() {
                    Some(bytes) => hasher.write(bytes),
                    // Nothing to read: the shape stands for it.
                    None if image.device().is_meta() => {}
                    None => {
                        for v in image.to_f32_vec()? {
                            v.to_bits().hash(&mut hasher);
                        }
                    }
                }
            }
            (None, Some(rgb)) => {
                rgb.dimensions().hash(&mut hasher);
                hasher.write(rgb.as_raw());
            }
            (None, None) => "black".hash(&mut hasher),
        }
        Ok(hasher.finish())
    }

    /// Refuses a session whose planned peak does not fit beside what is committed: the
    /// capacity must hold what is live outside the arenas (weights, the KV pool, cached
    /// prompts, tensors of sessions left to the cache), every live session's planned
    /// peak (its arena, reserved from its first chunk, and the long-lived tensors its
    /// plan leaves to the cache, counted whole even where some are live already) and
    /// the new peak. Free cached blocks count as free.
    pub(super) fn admit_planned_peak(&self, peak: u64) -> Result<()> {
        let (_, capacity) = self.platform().mem_info();
        let committed = self.committed_bytes();
        if committed.saturating_add(peak) > capacity {
            return Err(EngineError::admission_bytes(AdmissionKind::PlannedPeak, peak, capacity.saturating_sub(committed), format!(
                "the session's planned peak of {} does not fit: {} of the {} capacity is committed to the weights, the KV pool and the live sessions' planned peaks; lower the resolution or frames, wait for a session to end, or raise --capacity",
                headroom_mem::format_bytes(peak),
                headroom_mem::format_bytes(committed),
                headroom_mem::format_bytes(capacity),
            )));
        }
        Ok(())
    }

    /// Bytes of the capacity not committed ([`Engine::committed_bytes`]): what the next
    /// session's planned peak must fit in.
    pub fn planned_bytes_free(&self) -> u64 {
        let (_, capacity) = self.platform().mem_info();
        capacity.saturating_sub(self.committed_bytes())
    }

    /// Bytes the engine and its live sessions have committed: what is live outside the
    /// arenas, arenas of ended spans still held, and every live span's planned peak;
    /// what a session's admission adds its peak to.
    pub fn committed_bytes(&self) -> u64 {
        let allocator = self.platform().allocator();
        let c = allocator.span_commitments();
        let stats = self.platform().memory_stats();
        let allocated = stats.allocated_now();
        // Live outside the arenas, plus arenas of spans that ended but still hold a block.
        let outside = allocated.saturating_sub(c.arena_allocated);
        let retiring = c.arena_bytes.saturating_sub(c.planned_arenas);
        outside + retiring + c.planned_peaks
    }
}

/// How an admitted session opens: from its request's text, or from a snapshot.
pub(super) enum Opening {
    /// A new session conditioned on these embeddings (none: empty text).
    Fresh(Option<Tensor>),
    /// A session resumed from a snapshot.
    Resumed(Arc<SessionSnapshot>),
}

/// A session admitted by [`Engine::admit_session`] (or [`Engine::admit_resume`]) and
/// not yet opened: it holds its KV pages and its planned span; dropping it releases
/// both.
pub struct Admitted<'e> {
    pub(super) engine: &'e Engine,
    pub(super) parts: Option<(SessionRequest, SessionKv, Opening, Option<usize>)>,
    /// The planned span admission opened, if it did (a session streamed until stopped
    /// without a plan runs without one).
    pub(super) span: Option<SpanId>,
}

impl std::fmt::Debug for Admitted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("open", &self.parts.is_none())
            .finish()
    }
}

impl Admitted<'_> {
    /// Opens the admitted session: the image condition, the text's keys/values, the
    /// first block's noise (sharded forwards meet at collectives here).
    pub fn open(mut self) -> Result<Session> {
        let Some((request, kv, opening, blocks)) = self.parts.take() else {
            return Err(EngineError::request("session", "already opened"));
        };
        let allocator = self.engine.platform().allocator();
        let opened = {
            let _inside = self.span.map(|id| allocator.enter_span(Some(id)));
            match opening {
                Opening::Fresh(embeds) => self
                    .engine
                    .open_planned(request, kv, embeds, blocks, self.span),
                Opening::Resumed(snapshot) => self
                    .engine
                    .open_resumed(&snapshot, request, kv, blocks, self.span),
            }
        };
        if let (Err(_), Some(id)) = (&opened, self.span) {
            allocator.close_span(id);
        }
        opened
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let (Some(_), Some(id)) = (self.parts.take(), self.span) {
            self.engine.platform().allocator().close_span(id);
        }
    }
}
