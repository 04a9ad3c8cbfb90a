//! Loading an engine: where it runs ([`Placement`]: alone on a device, or one rank of a
//! mesh), the model's weights (a folder's checkpoints or seeded presets), the tiny
//! decoder and the text encoder, checked against each other before any session opens.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use headroom_mem::Platform;
use headroom_model::dit::Sharding;
use headroom_model::import::{self, ImportOptions};
use headroom_model::{DecoderKind, TinyDecoder, VideoDecoder, WanTransformer, WanVae, WeightStore};
use headroom_tensor::{DType, Device};

use crate::error::{EngineError, Result};
use crate::mesh::{Mesh, RankGroups};
use crate::model_source::ModelSource;
use crate::preset::ModelPreset;
use crate::snapshot::identity::{EngineIdentity, MeshPlace};
use crate::text::Prompts;

pub use crate::config::EngineConfig;

use super::planned::MetaTwin;
use super::planner::Planner;
use super::Engine;

/// Where an engine runs and how it gets the plans of its sessions: one constructor,
/// [`Engine::load`], takes it.
#[derive(Debug, Clone)]
pub struct Placement {
    device: Device,
    rank: Rank,
}

/// The rank side of a [`Placement`].
#[derive(Debug, Clone)]
enum Rank {
    /// An engine of its own, planning with a meta twin of itself.
    Alone,
    /// One rank of a mesh, planning with a meta twin of the whole mesh.
    Mesh {
        sharding: Sharding,
        mesh: Mesh,
        rank: usize,
    },
    /// One rank of a mesh that records its plans (its ranks run as threads here).
    Recording(Sharding),
    /// The sim twin of an engine: no twin and no plan cache of its own.
    Twin,
}

impl Placement {
    /// An engine alone on `platform` (the host's `cpu` platform, or a recording or
    /// modelled one in tests and plans).
    pub fn host(platform: Arc<dyn Platform>) -> Self {
        Self::device(Device::new(platform))
    }

    /// An engine alone on `device`: a GPU device (`Device::cuda`, or
    /// `Device::checked_gpu` to run every op through the launch path without a GPU) or
    /// any host device.
    pub fn device(device: Device) -> Self {
        Self {
            device,
            rank: Rank::Alone,
        }
    }

    /// One rank of a mesh driven by [`crate::replicated`] (ranks as processes of an MPI
    /// job, or threads) on `device`: its share of the transformer and of the KV cache,
    /// and a meta twin of the whole mesh, so the planned allocator replays a plan from
    /// the first session on, the same plan `headroom plan` makes for this rank. A mesh
    /// of one rank is an engine alone.
    pub fn rank(device: Device, groups: &RankGroups) -> Self {
        let mesh = groups.mesh();
        if mesh == Mesh::SINGLE {
            return Self::device(device);
        }
        Self {
            device,
            rank: Rank::Mesh {
                sharding: groups.sharding.clone(),
                mesh,
                rank: groups.rank(),
            },
        }
    }

    /// One rank of a mesh whose ranks run as threads of this process
    /// ([`Engine::on_each_rank`]): it records its plans, having no twin.
    fn recording(device: Device, sharding: Sharding) -> Self {
        Self {
            device,
            rank: Rank::Recording(sharding),
        }
    }

    /// The sim twin of an engine on `platform`.
    fn twin(platform: Arc<dyn Platform>) -> Self {
        Self {
            device: Device::new(platform),
            rank: Rank::Twin,
        }
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
            let engine = Engine::load(config.clone(), Placement::host(platform(0)?))?;
            return Ok(vec![work(0, &engine)?]);
        }
        mesh.run_threads(|groups| {
            let rank = groups.rank();
            let device = Device::new(platform(rank)?);
            let engine = Engine::load(
                config.clone(),
                Placement::recording(device, groups.sharding),
            )?;
            work(rank, &engine)
        })
    }

    /// An engine on the host (`cpu` platform) with the configured policies:
    /// [`Engine::load`] with [`Placement::host`].
    pub fn new(config: EngineConfig) -> Result<Self> {
        let platform = config.cpu_platform()?;
        Self::load(config, Placement::host(platform))
    }

    /// The sim twin of an engine of `config` on `platform`: no twin or plan cache of
    /// its own.
    pub(super) fn twin(config: EngineConfig, platform: Arc<dyn Platform>) -> Result<Self> {
        Self::load(config, Placement::twin(platform))
    }

    /// Loads the model of `config` where `placement` says, with the planner that
    /// placement gets: a meta twin of the engine alone or of its whole mesh, none on a
    /// recording rank or a twin.
    pub fn load(config: EngineConfig, placement: Placement) -> Result<Self> {
        let Placement { device, rank } = placement;
        let (config, shard, twin) = match rank {
            Rank::Alone => (config, None, Some(MetaTwin::default())),
            Rank::Mesh {
                sharding,
                mesh,
                rank,
            } => (config, Some(sharding), Some(MetaTwin::for_mesh(mesh, rank))),
            Rank::Recording(sharding) => (config, Some(sharding), None),
            Rank::Twin => (
                EngineConfig {
                    plan_cache: None,
                    ..config
                },
                None,
                None,
            ),
        };
        Self::build(config, device, shard, twin)
    }

    fn build(
        config: EngineConfig,
        device: Device,
        shard: Option<Sharding>,
        twin: Option<MetaTwin>,
    ) -> Result<Self> {
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
            weights: config.weights,
        };
        let (dit, vae) = if let Some(folder) = source.folder() {
            // Real weights: a diffusers pipeline or an original Wan repo folder.
            let plain = ImportOptions::default();
            let vae = import::load_vae(folder, &plain, &device, dtype)?;
            let plain = ImportOptions {
                weights: config.weights,
                ..plain
            };
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
                None => WanTransformer::from_store_sharded(
                    preset.dit,
                    &WeightStore::seeded(config.weight_seed, &device, dtype)
                        .with_format(config.weights),
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
        let mesh = match dit.sharding() {
            Some(s) => MeshPlace {
                tp: s.tp.size(),
                sp: s.sp.size(),
                rank: s.sp.rank() * s.tp.size() + s.tp.rank(),
            },
            None => MeshPlace {
                tp: 1,
                sp: 1,
                rank: 0,
            },
        };
        let architecture = format!("{:?}\n{:?}", dit.config(), vae.config());
        let identity = Arc::new(EngineIdentity::new(&config, &architecture, mesh));
        Ok(Self {
            identity,
            weights_bytes,
            prompts: Arc::new(prompts),
            first_frame,
            config,
            device,
            dit: Arc::new(dit),
            vae: Arc::new(vae),
            tiny,
            pool: Mutex::new(None),
            next_id: AtomicU64::new(1),
            planner: Planner::new(twin.map(Arc::new), plan_cache),
        })
    }
}

/// The folder file a model may carry its own tiny decoder in.
pub const TINY_DECODER_FILE: &str = "tiny_decoder.safetensors";

/// The engine's tiny decoder: `config.tiny_decoder`, else (when sessions decode tiny by
/// default) the model folder's [`TINY_DECODER_FILE`], else for a built-in model seeded
/// weights of the released decoder of its latents; checked against the VAE's latents
/// (channels, spatial and temporal factors).
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
    // Frames per latent frame too: sessions count their frames by the VAE's factor.
    let t = vae.config().temporal_factor();
    if tiny.latent_channels() != z || tiny.spatial_factor() != s || tiny.config().t_upscale() != t {
        return Err(EngineError::request(
            "tiny_decoder",
            format!(
                "decodes {}-channel latents {}× in space and {}× in time, and the model's VAE makes {z}-channel latents {s}× and {t}×",
                tiny.latent_channels(),
                tiny.spatial_factor(),
                tiny.config().t_upscale()
            ),
        ));
    }
    Ok(Some(Arc::new(tiny)))
}
