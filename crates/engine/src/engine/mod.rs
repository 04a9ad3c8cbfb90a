//! `Engine`: loads (or seeds) a model once on a platform, owns the KV page pool, and
//! admits sessions only when their pages, decoder state and conditioning fit.
//!
//! Its parts: [`load`](Engine::load) builds it where a [`Placement`] says, `admission`
//! admits and opens sessions, `planned` is its planner for the `planned` allocator (the
//! meta twin, the plan cache, batched rounds' plans).

mod admission;
mod load;
mod planned;
mod planner;
mod resume;
mod round_plan;
mod snapshot_size;

pub use admission::Admitted;
pub use load::{Placement, TINY_DECODER_FILE};
pub use resume::SnapshotSource;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use headroom_mem::Platform;
use headroom_model::kv::KvPool;
use headroom_model::{DecoderKind, TinyDecoder, VideoDecoder, WanTransformer, WanVae};
use headroom_tensor::Device;
use headroom_text::TextEncoderReport;

use crate::error::{EngineError, Result};
use crate::text::Prompts;

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
    /// Plans sessions for the `planned` allocator: the meta twin, batched rounds' plans,
    /// the plan cache.
    planner: planner::Planner,
    /// Bytes the device held once the model was loaded.
    weights_bytes: u64,
    /// What sessions' snapshots say they ran on.
    identity: Arc<crate::snapshot::identity::EngineIdentity>,
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
        self.planner.plan_cache_counts()
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
        crate::phases::sleep(self.platform().as_ref())
    }

    /// The KV pool, once the first session created it.
    pub fn kv_pool(&self) -> Option<Arc<KvPool>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Tells the engine that its sessions are stepped in batches with one another (a
    /// server with `--batch-steps` and more than one slot): under the planned allocator
    /// their spans then start detached from their plans, whose peaks still count for
    /// admission while their work goes to the caching path. A plan describes a session
    /// alone, not a stacked forward, and an arena reserved beside the cache would hold
    /// its work twice.
    pub fn set_batched_steps(&self, batched: bool) {
        self.planner.set_batched_steps(batched);
    }

    /// Blocks a recording needs to end in steady chunks a periodic plan can repeat:
    /// the KV window full (`window_frames` visible, the sink included) and the image
    /// condition settled, then two runs of the longest period.
    pub fn steady_blocks(&self) -> usize {
        self.planner.steady_blocks(self)
    }
}
