//! How an engine is set up: the model, the memory policies, the KV window and pool, the
//! text encoder and the decoder.

use std::sync::Arc;

use headroom_mem::{AllocatorConfig, CachingPlatform, Platform, ReclaimPolicy};
use headroom_model::{DecoderKind, WeightFormat};
use headroom_tensor::DType;
use headroom_text::TextEncoderMode;

use crate::error::Result;

/// How an engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Built-in model name, a diffusers pipeline folder, or an original Wan repo folder
    /// (config.json + DiT safetensors + `Wan2.1_VAE.pth` [+ T5 `.pth` + tokenizer]).
    pub model: String,
    /// A transformer checkpoint (file or folder, any supported layout) that replaces the
    /// model's own DiT: a Self-Forcing `.pt` or a LingBot-World folder over a Wan folder.
    pub transformer: Option<String>,
    /// The `--transformer` checkpoint's config (diffusers or original keys) when the
    /// checkpoint carries none and its shapes do not settle it.
    pub transformer_config: Option<std::path::PathBuf>,
    /// Seed of the built-in model's weights.
    pub weight_seed: u64,
    /// Allocator settings of the `cpu` platform.
    pub allocator: AllocatorConfig,
    /// Reclaim policy at phase boundaries.
    pub reclaim: ReclaimPolicy,
    /// Bytes of KV pages the pool takes, once, at the first session; `None` sizes it
    /// for `max_sessions` sessions exactly.
    pub kv_budget_bytes: Option<u64>,
    /// Fraction of the device memory free when the pool is created (after the weights)
    /// that KV pages take, as serving engines size their caches; overrides
    /// `kv_budget_bytes`.
    pub kv_fraction: Option<f64>,
    /// Sessions the automatic KV budget makes room for.
    pub max_sessions: usize,
    /// Frames kept for the whole session.
    pub sink_frames: usize,
    /// Frames a block sees at most (history + itself).
    pub window_frames: usize,
    /// Storage dtype of the weights (compute is f32).
    pub weight_dtype: DType,
    /// How the DiT blocks' linear weights are held: as loaded, fp8 or int8 (`--weights`).
    pub weights: WeightFormat,
    /// Capacity of the `cpu` platform in bytes (physical memory when `None`): emulates a
    /// memory-tight device, and is what `bounded` reclaim fractions refer to.
    pub capacity: Option<u64>,
    /// Whether the text encoder's weights stay loaded or are loaded per new prompt.
    pub text_encoder: TextEncoderMode,
    /// Byte budget of the prompt-embedding cache (0 turns it off).
    pub text_cache_bytes: u64,
    /// Tokens per KV page: a latent frame takes ⌈its tokens / this⌉ pages, so sessions
    /// of every resolution share one pool.
    pub kv_page_tokens: usize,
    /// A folder where the planned allocator's plans are kept across runs
    /// ([`crate::plan_cache`]); none: plans live in memory only.
    pub plan_cache: Option<std::path::PathBuf>,
    /// The decoder sessions get unless their request names one.
    pub decoder: DecoderKind,
    /// A TAEHV tiny decoder file (`.pth` or `.safetensors`), loaded beside the model so
    /// sessions may choose it. Without one, `decoder: Tiny` takes the model folder's
    /// `tiny_decoder.safetensors`, or for a built-in model seeded weights of the
    /// released decoder's shapes.
    pub tiny_decoder: Option<std::path::PathBuf>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            model: "small".to_string(),
            transformer: None,
            transformer_config: None,
            weight_seed: 0,
            allocator: AllocatorConfig::default(),
            reclaim: ReclaimPolicy::Never,
            kv_budget_bytes: None,
            kv_fraction: None,
            max_sessions: 1,
            sink_frames: 9,
            window_frames: 18,
            weight_dtype: DType::F32,
            weights: WeightFormat::Native,
            capacity: None,
            text_encoder: TextEncoderMode::Resident,
            text_cache_bytes: 64 << 20,
            kv_page_tokens: 16,
            plan_cache: None,
            decoder: DecoderKind::Full,
            tiny_decoder: None,
        }
    }
}

impl EngineConfig {
    /// A host (`cpu`) platform with this configuration's capacity, allocator and
    /// reclaim policy: what [`Engine::new`](crate::Engine::new) runs on, and each rank of a mesh.
    pub fn cpu_platform(&self) -> Result<Arc<dyn Platform>> {
        Ok(Arc::new(CachingPlatform::cpu(
            self.capacity,
            self.allocator.clone(),
            self.reclaim,
        )?))
    }
}
