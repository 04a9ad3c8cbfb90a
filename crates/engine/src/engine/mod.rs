//! `Engine`: loads (or seeds) a model once on a platform, owns the KV page pool, and
//! admits sessions only when their pages, decoder state and conditioning fit.

mod planned;
mod round_plan;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use headroom_mem::{Platform, SpanId};
use headroom_model::dit::Sharding;
use headroom_model::import::{self, ImportOptions};
use headroom_model::kv::{KvPool, PageLayout, SessionKv};
use headroom_model::{DecoderKind, TinyDecoder, VideoDecoder, WanTransformer, WanVae};
use headroom_tensor::{DType, Device, Tensor};
use headroom_text::TextEncoderReport;

use crate::blocks::BLOCK_FRAMES;
use crate::condition::ImageCondition;
use crate::error::{AdmissionKind, EngineError, Result};
use crate::mesh::Mesh;
use crate::model_source::ModelSource;
use crate::preset::ModelPreset;
use crate::session::{Session, SessionRequest};
use crate::text::{pad_text, Prompts};

pub use crate::config::EngineConfig;

/// A loaded model serving sessions one after another.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    device: Device,
    dit: Arc<WanTransformer>,
    vae: Arc<WanVae>,
    /// The tiny decoder, when one is loaded.
    tiny: Option<Arc<TinyDecoder>>,
    pool: Mutex<Option<Arc<KvPool>>>,
    next_id: AtomicU64,
    prompts: Arc<Prompts>,
    /// The model folder's own first frame (`first_frame.png`), used when a session
    /// brings no image.
    first_frame: Option<image::RgbImage>,
    /// The sim twin that meta-executes sessions for the planned allocator (none on a
    /// twin itself and on sharded ranks, which record instead).
    pub(crate) meta: Option<Arc<planned::MetaTwin>>,
    /// Makes the plans of batched rounds, once the first session is admitted.
    rounds: std::sync::OnceLock<Arc<round_plan::RoundPlanner>>,
    /// Plans kept on disk, when the config names a folder.
    pub(crate) plan_cache: Option<crate::plan_cache::PlanCache>,
    /// Where image conditions settle on a meta device ([`crate::condition::probe_settle_block`]),
    /// probed on first use.
    pub(crate) condition_settles: std::sync::OnceLock<Option<usize>>,
    /// Sessions may be stepped in batches with others ([`Engine::set_batched_steps`]).
    pub(crate) batched_steps: std::sync::atomic::AtomicBool,
    /// Bytes the device held once the model was loaded.
    weights_bytes: u64,
}

/// What an engine keeps for its whole life, in allocated bytes: with no session open,
/// the device holds exactly this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Resident {
    /// The model's weights (and a resident text encoder's), as loaded.
    pub weights_bytes: u64,
    /// The KV page pool (0 before the first session).
    pub kv_pool_bytes: u64,
    /// Cached prompt embeddings.
    pub prompt_cache_bytes: u64,
}

impl Resident {
    /// The sum.
    pub fn total(&self) -> u64 {
        self.weights_bytes + self.kv_pool_bytes + self.prompt_cache_bytes
    }
}

impl Engine {
    /// Runs `work` on an engine per rank of `mesh` (world rank `sp_rank · tp + tp_rank`), each on
    /// the platform `platform(rank)` gives, and returns the results in rank order. A
    /// rank that fails aborts the mesh, so the others fail instead of waiting forever;
    /// the first error is returned.
    pub fn on_each_rank<T, P, W>(
        mesh: Mesh,
        config: &EngineConfig,
        platform: P,
        work: W,
    ) -> Result<Vec<T>>
    where
        T: Send,
        P: Fn(usize) -> Result<Arc<dyn Platform>> + Sync,
        W: Fn(usize, &Engine) -> Result<T> + Sync,
    {
        mesh.validate()?;
        if mesh == Mesh::SINGLE {
            let engine = Engine::on(config.clone(), platform(0)?)?;
            return Ok(vec![work(0, &engine)?]);
        }
        mesh.run_threads(|groups| {
            let rank = groups.rank();
            let engine = Engine::on_rank(config.clone(), platform(rank)?, Some(groups.sharding))?;
            work(rank, &engine)
        })
    }

    /// An engine on the host (`cpu` platform) with the configured policies.
    pub fn new(config: EngineConfig) -> Result<Self> {
        let platform = config.cpu_platform()?;
        Self::on(config, platform)
    }

    /// An engine on `platform` (tests use a recording or failing platform).
    pub fn on(config: EngineConfig, platform: Arc<dyn Platform>) -> Result<Self> {
        Self::on_rank(config, platform, None)
    }

    /// One rank of a sharded engine on `platform`: it holds its part of the transformer
    /// and of the KV cache, and decodes every chunk itself (replicated decode). Every
    /// rank of the mesh must run the same sessions with the same requests.
    pub fn on_rank(
        config: EngineConfig,
        platform: Arc<dyn Platform>,
        shard: Option<Sharding>,
    ) -> Result<Self> {
        let meta = shard
            .is_none()
            .then(|| Arc::new(planned::MetaTwin::default()));
        let mut engine = Self::build(config, Device::new(platform), shard)?;
        engine.meta = meta;
        Ok(engine)
    }

    /// One rank of a mesh driven by [`crate::replicated`] (ranks as processes of an MPI
    /// job, or threads): its share of the transformer and of the KV cache, and a meta
    /// twin of the whole mesh, so the planned allocator replays a plan from the first
    /// session on, the same plan `headroom plan` makes for this rank.
    pub fn on_mesh(
        config: EngineConfig,
        platform: Arc<dyn Platform>,
        groups: &crate::mesh::RankGroups,
    ) -> Result<Self> {
        let mesh = groups.mesh();
        if mesh == Mesh::SINGLE {
            return Self::on(config, platform);
        }
        let mut engine = Self::build(config, Device::new(platform), Some(groups.sharding.clone()))?;
        engine.meta = Some(Arc::new(planned::MetaTwin::for_mesh(mesh, groups.rank())));
        Ok(engine)
    }

    /// This rank's engine of a mesh on `device` (a GPU device, one per rank, whose TP
    /// and SP groups run on NCCL), with the meta twin of the whole mesh for planning.
    pub fn on_mesh_device(
        config: EngineConfig,
        device: Device,
        groups: &crate::mesh::RankGroups,
    ) -> Result<Self> {
        let mesh = groups.mesh();
        if mesh == Mesh::SINGLE {
            return Self::on_device(config, device);
        }
        let mut engine = Self::build(config, device, Some(groups.sharding.clone()))?;
        engine.meta = Some(Arc::new(planned::MetaTwin::for_mesh(mesh, groups.rank())));
        Ok(engine)
    }

    /// An engine on `device`: a GPU device (`Device::cuda`, or `Device::checked_gpu` to
    /// run every op through the launch path without a GPU) or any host device.
    pub fn on_device(config: EngineConfig, device: Device) -> Result<Self> {
        let mut engine = Self::build(config, device, None)?;
        engine.meta = Some(Arc::new(planned::MetaTwin::default()));
        Ok(engine)
    }

    /// The sim twin of an engine: same config, no twin of its own.
    pub(crate) fn twin(config: EngineConfig, platform: Arc<dyn Platform>) -> Result<Self> {
        let config = EngineConfig {
            plan_cache: None,
            ..config
        };
        Self::build(config, Device::new(platform), None)
    }

    fn build(config: EngineConfig, device: Device, shard: Option<Sharding>) -> Result<Self> {
        if config.kv_page_tokens == 0 {
            return Err(EngineError::request("kv_page_tokens", "must be at least 1"));
        }
        let dtype = config.weight_dtype;
        let source = ModelSource::resolve(&config.model)?;
        let first_frame = match &source {
            ModelSource::Pipeline(folder) => crate::first_frame::load(folder)?,
            _ => None,
        };
        // `--config` describes the `--transformer` checkpoint, never the base.
        let override_config = ImportOptions {
            config: config.transformer_config.clone(),
            base: None,
        };
        let (dit, vae) = if let Some(folder) = source.folder() {
            // Real weights: a diffusers pipeline or an original Wan repo folder.
            let plain = ImportOptions::default();
            let vae = import::load_vae(folder, &plain, &device, dtype)?;
            let dit = match &config.transformer {
                Some(path) => {
                    let base = source.dit_config()?;
                    let options = ImportOptions {
                        base: Some(base),
                        ..override_config
                    };
                    import::load_transformer(Path::new(path), &options, &device, dtype, shard)?
                }
                None => import::load_transformer(folder, &plain, &device, dtype, shard)?,
            };
            (dit, vae)
        } else {
            let preset = ModelPreset::named(&config.model)?;
            let dit = match &config.transformer {
                Some(path) => {
                    let options = ImportOptions {
                        base: Some(preset.dit.clone()),
                        ..override_config
                    };
                    import::load_transformer(Path::new(path), &options, &device, dtype, shard)?
                }
                None => WanTransformer::seeded_sharded(
                    preset.dit,
                    config.weight_seed,
                    &device,
                    dtype,
                    shard,
                )?,
            };
            (
                dit,
                WanVae::seeded(
                    preset.vae,
                    config.weight_seed.wrapping_add(1),
                    &device,
                    dtype,
                )?,
            )
        };
        // Every session (de)normalises latents: refuse now, naming the field.
        vae.config().validate_latent_stats()?;
        let (z, c) = (vae.config().z_dim, dit.config());
        if c.out_channels() != z || (c.in_channels != z && !c.takes_image_condition()) {
            return Err(EngineError::request(
                "model",
                format!(
                    "transformer channels {} in / {} out do not fit a VAE with z_dim {z} (need out = z_dim, in = z_dim or 2·z_dim + 4)",
                    c.in_channels,
                    c.out_channels()
                ),
            ));
        }
        let s = vae.config().spatial_factor();
        if let Some(fold) = dit.camera_fold().filter(|&fold| fold != s) {
            return Err(EngineError::request(
                "model",
                format!(
                    "the camera adapter takes rays folded {fold}×{fold} (6·{fold}² channels per latent cell) but the VAE compresses {s}× in space; they must match"
                ),
            ));
        }
        let tiny = load_tiny(&config, &source, &vae, &device, dtype)?;
        let prompts = Prompts::new(
            &config.model,
            c.text_dim,
            config.weight_seed.wrapping_add(2),
            &device,
            dtype,
            config.text_encoder,
            config.text_cache_bytes,
        )?;
        let plan_cache = config
            .plan_cache
            .as_deref()
            .map(crate::plan_cache::PlanCache::new)
            .transpose()?;
        // Everything allocated so far is the model: its weights (and a resident text
        // encoder's), what stays for the engine's life.
        let weights_bytes = device.platform().memory_stats().allocated_now();
        Ok(Self {
            weights_bytes,
            prompts: Arc::new(prompts),
            first_frame,
            plan_cache,
            config,
            device,
            dit: Arc::new(dit),
            vae: Arc::new(vae),
            tiny,
            pool: Mutex::new(None),
            next_id: AtomicU64::new(1),
            meta: None,
            rounds: std::sync::OnceLock::new(),
            condition_settles: std::sync::OnceLock::new(),
            batched_steps: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// What the engine keeps between sessions: weights, KV pool, prompt cache.
    pub fn resident(&self) -> Resident {
        Resident {
            weights_bytes: self.weights_bytes,
            kv_pool_bytes: self.kv_pool().map_or(0, |p| p.bytes()),
            prompt_cache_bytes: self.text_report().map_or(0, |r| r.cache_bytes),
        }
    }

    /// What the plan cache did so far (`None` without `plan_cache`).
    pub fn plan_cache_counts(&self) -> Option<crate::plan_cache::PlanCacheCounts> {
        self.plan_cache
            .as_ref()
            .map(crate::plan_cache::PlanCache::counts)
    }

    /// The configuration the engine was built with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// `(width, height)` of the model folder's own first frame: the size it was
    /// trained at, if it has one.
    pub fn native_size(&self) -> Option<(usize, usize)> {
        self.first_frame
            .as_ref()
            .map(|f| (f.width() as usize, f.height() as usize))
    }

    /// The device sessions run on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The platform sessions run on.
    pub fn platform(&self) -> &Arc<dyn Platform> {
        self.device.platform()
    }

    /// The transformer.
    pub fn transformer(&self) -> &WanTransformer {
        &self.dit
    }

    /// The VAE.
    pub fn vae(&self) -> &WanVae {
        &self.vae
    }

    /// The tiny decoder, when one is loaded.
    pub fn tiny_decoder(&self) -> Option<&Arc<TinyDecoder>> {
        self.tiny.as_ref()
    }

    /// The decoder a session asking for `kind` (`None`: the engine's default) gets, or
    /// the error naming `decoder` when that is a tiny one and none is loaded.
    pub fn decoder_for(&self, kind: Option<DecoderKind>) -> Result<Arc<dyn VideoDecoder>> {
        match kind.unwrap_or(self.config.decoder) {
            DecoderKind::Full => Ok(Arc::clone(&self.vae) as Arc<dyn VideoDecoder>),
            DecoderKind::Tiny => match &self.tiny {
                Some(tiny) => Ok(Arc::clone(tiny) as Arc<dyn VideoDecoder>),
                None => Err(EngineError::request(
                    "decoder",
                    "\"tiny\" needs a tiny decoder, and this engine has none loaded (start it with --tiny-decoder FILE or --decoder tiny)",
                )),
            },
        }
    }

    /// The text encoder's memory and cache report, once a prompt (or a model folder's
    /// `text_encoder/`) created it.
    pub fn text_report(&self) -> Option<TextEncoderReport> {
        self.prompts.report()
    }

    /// Whether sessions can take a prompt: the model has a text encoder.
    pub fn has_text_encoder(&self) -> bool {
        self.prompts.available()
    }

    /// Crosses the `sleep` boundary: no session is open, so the allocator's cache goes
    /// back to the device (under every reclaim policy but `never`), leaving the weights,
    /// the KV pool and the prompt cache resident.
    pub fn sleep(&self) -> Option<headroom_mem::Reclaim> {
        self.platform().phase(headroom_mem::Phase::Sleep)
    }

    /// The KV pool, once the first session created it.
    pub fn kv_pool(&self) -> Option<Arc<KvPool>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

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
            return Err(EngineError::admission(
                AdmissionKind::Memory,
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

    /// Tells the engine that its sessions are stepped in batches with one another (a
    /// server with `--batch-steps` and more than one slot): under the planned allocator
    /// their spans then start detached from their plans, whose peaks still count for
    /// admission while their work goes to the caching path. A plan describes a session
    /// alone, not a stacked forward, and an arena reserved beside the cache would hold
    /// its work twice.
    pub fn set_batched_steps(&self, batched: bool) {
        self.batched_steps.store(batched, Ordering::Relaxed);
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
        let blocks = self.validate(&request)?;
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
        // The image condition is streamed: one block's latents at a time.
        let s = self.vae.config().spatial_factor();
        let cond_bytes =
            (20 * BLOCK_FRAMES * (request.height / s) * (request.width / s) * 4) as u64;
        let free = self.free_bytes();
        if state + cond_bytes > free {
            return Err(EngineError::admission(
                AdmissionKind::Memory,
                format!(
                "decoder state {state} B + conditioning {cond_bytes} B do not fit in {free} B free"
            ),
            ));
        }
        let embeds = match request.prompt.as_deref() {
            Some(prompt) => self.prompts.encode(prompt)?,
            None => request.text_embeds.clone(),
        };
        // The planned span starts after the prompt is encoded: whether it came from the
        // cache changes the allocations, not the session's.
        let span = self.begin_planned_span(&request, blocks)?;
        Ok(Admitted {
            engine: self,
            parts: Some((request, kv, embeds, blocks)),
            span,
        })
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
        let text = self
            .dit
            .text_key_values(self.padded_text(embeds.as_ref())?.as_ref())?;
        drop(embeds);
        let cond = if c.takes_image_condition() {
            Some(self.image_condition(&request)?)
        } else {
            None
        };
        let id = format!("session-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let session = Session::new(
            id,
            Arc::clone(&self.dit),
            Arc::clone(&self.vae),
            self.decoder_for(request.decoder)?,
            kv,
            text,
            cond,
            &request,
            blocks,
        )?;
        let round_member = self.round_member(&request, span);
        Ok(session
            .with_prompts(Arc::clone(&self.prompts))
            .with_span(span)
            .with_round_member(round_member))
    }

    /// What a session of `request` brings to the plans of batched rounds: only where it
    /// has a planned span and the engine a meta twin of its own (not a mesh's).
    fn round_member(
        &self,
        request: &SessionRequest,
        span: Option<SpanId>,
    ) -> Option<Arc<crate::round::RoundMember>> {
        let meta = self.meta.as_ref()?;
        if span.is_none() || self.dit.sharding().is_some() {
            return None;
        }
        let planner = self
            .rounds
            .get_or_init(|| Arc::new(round_plan::RoundPlanner::new(self, Arc::clone(meta))));
        let key = planned::span_key(&self.config, None, request);
        let planner: Arc<dyn crate::round::RoundPlans> = planner.clone();
        Some(Arc::new(crate::round::RoundMember::new(
            planner, request, key,
        )))
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
        let settles = self.device.is_meta().then(|| self.condition_settle_block());
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
}

/// The folder file a model may carry its own tiny decoder in.
pub const TINY_DECODER_FILE: &str = "tiny_decoder.safetensors";

/// The engine's tiny decoder: `config.tiny_decoder`, else (when sessions decode tiny by
/// default) the model folder's [`TINY_DECODER_FILE`], else for a built-in model seeded
/// weights of the released decoder of its latents; checked against the VAE's latents.
fn load_tiny(
    config: &EngineConfig,
    source: &ModelSource,
    vae: &WanVae,
    device: &Device,
    dtype: DType,
) -> Result<Option<Arc<TinyDecoder>>> {
    let (z, s) = (vae.latent_channels(), vae.spatial_factor());
    let tiny = match (&config.tiny_decoder, source.folder(), config.decoder) {
        (Some(path), _, _) => TinyDecoder::load(path, device, dtype)?,
        (None, _, DecoderKind::Full) => return Ok(None),
        (None, Some(folder), DecoderKind::Tiny) => {
            let path = folder.join(TINY_DECODER_FILE);
            if !path.is_file() {
                return Err(EngineError::request(
                    "decoder",
                    format!(
                        "\"tiny\" needs a tiny decoder: give --tiny-decoder FILE (taew2_1 decodes 16-channel latents, taew2_2 48) or put {TINY_DECODER_FILE} in {}",
                        folder.display()
                    ),
                ));
            }
            TinyDecoder::load(&path, device, dtype)?
        }
        (None, None, DecoderKind::Tiny) => TinyDecoder::seeded(
            headroom_model::TinyConfig::released_for(z)?,
            config.weight_seed.wrapping_add(3),
            device,
            dtype,
        )?,
    };
    if tiny.latent_channels() != z || tiny.spatial_factor() != s {
        return Err(EngineError::request(
            "tiny_decoder",
            format!(
                "decodes {}-channel latents {}× in space, and the model's VAE makes {z}-channel latents {s}×",
                tiny.latent_channels(),
                tiny.spatial_factor()
            ),
        ));
    }
    Ok(Some(Arc::new(tiny)))
}

/// A session admitted by [`Engine::admit_session`] and not yet opened: it holds its KV
/// pages and its planned span; dropping it releases both.
pub struct Admitted<'e> {
    engine: &'e Engine,
    parts: Option<(SessionRequest, SessionKv, Option<Tensor>, Option<usize>)>,
    /// The planned span admission opened, if it did (a session streamed until stopped
    /// without a plan runs without one).
    span: Option<SpanId>,
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
        let Some((request, kv, embeds, blocks)) = self.parts.take() else {
            return Err(EngineError::request("session", "already opened"));
        };
        let allocator = self.engine.platform().allocator();
        let opened = {
            let _inside = self.span.map(|id| allocator.enter_span(Some(id)));
            self.engine
                .open_planned(request, kv, embeds, blocks, self.span)
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
