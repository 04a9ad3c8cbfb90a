//! `TextEncoder`: prompts to the Wan pipelines' text embeddings, with the weights kept
//! resident or loaded on demand, and an LRU cache of embeddings by prompt.
//!
//! An embedding is what `WanPipeline._get_t5_prompt_embeds` builds: the cleaned prompt
//! tokenised and padded to `max_length`, encoded with the attention mask, the first `n`
//! rows (the real tokens) kept and the rest zeroed: f32 `[max_length, d_model]`. Padded
//! keys are masked, every layer but attention acts per token, and padded rows are zeroed
//! afterwards, so the encoder runs on the `n` real tokens only: the same rows for a
//! fraction of the work (a 20-token prompt costs 20 tokens, not 512).
//!
//! Memory: `resident` keeps the weights for the encoder's life. `on-demand` loads them
//! for each prompt that misses the cache and releases them before returning, then calls
//! the caller's `released` ([`TextEncoder::encode_with`]; the engine crosses `text_end`
//! there) so the platform's reclaim policy can hand the freed bytes back; the embedding is copied out before and back after the release, so
//! the only bytes the text phase leaves reserved are the returned embedding's. The cache
//! is keyed by the cleaned prompt (prompts that clean the same encode the same).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;

use headroom_tensor::{DType, Device, Tensor};

use crate::cache::{CacheStats, EmbeddingCache};
use crate::clean::prompt_clean;
use crate::config::Umt5Config;
use crate::error::{Result, TextError};
use crate::tokenizer::{TextTokenizer, TokenizedPrompt, MAX_LENGTH};
use crate::umt5::Umt5Encoder;

/// Whether the text encoder's weights stay on the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TextEncoderMode {
    /// Weights are loaded once and stay (fast prompts, the weights' bytes held always).
    #[default]
    Resident,
    /// Weights are loaded for each uncached prompt and released after it (nothing held
    /// between prompts; each new prompt pays a load).
    OnDemand,
}

impl TextEncoderMode {
    /// The name used on the command line (`resident`, `on-demand`).
    pub fn name(self) -> &'static str {
        match self {
            TextEncoderMode::Resident => "resident",
            TextEncoderMode::OnDemand => "on-demand",
        }
    }
}

impl fmt::Display for TextEncoderMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TextEncoderMode {
    type Err = TextError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "resident" => Ok(TextEncoderMode::Resident),
            "on-demand" | "ondemand" => Ok(TextEncoderMode::OnDemand),
            other => Err(TextError::config(
                "text encoder mode",
                format!("must be resident or on-demand, got {other:?}"),
            )),
        }
    }
}

/// Where the encoder's weights come from.
#[derive(Debug, Clone)]
enum WeightSource {
    /// A transformers `text_encoder/` folder.
    Dir(PathBuf),
    /// Wan's own T5 `.pth`.
    WanPth(PathBuf),
    /// Seeded random weights of a config.
    Seeded(Umt5Config, u64),
}

/// What a text encoder holds and how its cache did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TextEncoderReport {
    /// Resident or on-demand.
    pub mode: TextEncoderMode,
    /// Bytes of weights on the device now (0 between prompts when on-demand).
    pub resident_weight_bytes: u64,
    /// Bytes of weights while loaded (known after the first load).
    pub weight_bytes: u64,
    /// Times the weights were loaded.
    pub loads: u64,
    /// Prompts encoded (cache misses that ran the encoder).
    pub encodes: u64,
    /// Storage bytes of cached embeddings.
    pub cache_bytes: u64,
    /// The cache's byte budget.
    pub cache_budget_bytes: u64,
    /// Cached prompts.
    pub cache_entries: usize,
    /// Cache hits.
    pub cache_hits: u64,
    /// Cache misses.
    pub cache_misses: u64,
}

#[derive(Debug)]
struct State {
    resident: Option<Umt5Encoder>,
    cache: EmbeddingCache,
    weight_bytes: u64,
    loads: u64,
    encodes: u64,
}

/// Prompts to Wan text embeddings (tokenizer + UMT5 encoder + cache).
#[derive(Debug)]
pub struct TextEncoder {
    source: WeightSource,
    config: Umt5Config,
    tokenizer: TextTokenizer,
    device: Device,
    dtype: DType,
    mode: TextEncoderMode,
    state: Mutex<State>,
}

/// The tokenizer of the built-in seeded text encoders: the golden fixtures' tiny T5
/// tokenizer (made by `tools/make_text_fixtures.py`).
const BUILTIN_TOKENIZER: &str = include_str!("../tests/fixtures/tokenizer/tokenizer.json");
const BUILTIN_TOKENIZER_CONFIG: &str =
    include_str!("../tests/fixtures/tokenizer/tokenizer_config.json");

impl TextEncoder {
    /// The text encoder of a model folder holding `text_encoder/` (transformers
    /// `UMT5EncoderModel`) and `tokenizer/`, weights stored as `dtype` on `device`,
    /// embeddings of 512 tokens.
    pub fn load(
        dir: &Path,
        device: &Device,
        dtype: DType,
        mode: TextEncoderMode,
        cache_budget_bytes: u64,
    ) -> Result<Self> {
        if !dir.join("text_encoder").is_dir() {
            if let Some((t5, tokenizer)) = crate::wan_t5::wan_files(dir) {
                return Self::load_wan(&t5, &tokenizer, device, dtype, mode, cache_budget_bytes);
            }
        }
        let encoder_dir = dir.join("text_encoder");
        let tokenizer_dir = dir.join("tokenizer");
        for (folder, what) in [
            (&encoder_dir, "text_encoder"),
            (&tokenizer_dir, "tokenizer"),
        ] {
            if !folder.is_dir() {
                return Err(TextError::io(
                    folder,
                    format!("missing: a model folder needs {what}/ for prompts"),
                ));
            }
        }
        let config = Umt5Config::from_dir(&encoder_dir)?;
        let tokenizer = TextTokenizer::from_dir(&tokenizer_dir, MAX_LENGTH)?;
        let encoder = Self::new(
            WeightSource::Dir(encoder_dir.clone()),
            config,
            tokenizer,
            device,
            dtype,
            mode,
            cache_budget_bytes,
        )?;
        if mode == TextEncoderMode::OnDemand {
            // Fail now, not at the first prompt, when the weights are missing: opening
            // the files reads their headers only.
            headroom_model::WeightStore::from_files(&encoder_dir, "model", device, dtype)?;
        }
        Ok(encoder)
    }

    /// The text encoder of a Wan repo folder: Wan's T5 `.pth` (`t5`) and the tokenizer
    /// folder `google/umt5-xxl/` (`tokenizer_dir`); config from the checkpoint's shapes.
    pub fn load_wan(
        t5: &Path,
        tokenizer_dir: &Path,
        device: &Device,
        dtype: DType,
        mode: TextEncoderMode,
        cache_budget_bytes: u64,
    ) -> Result<Self> {
        // Opening the file reads the archive index and the pickle, not the tensors.
        let store = crate::wan_t5::open(t5, device, dtype)?;
        let config = crate::wan_t5::config_from_shapes(&store, t5)?;
        drop(store);
        let tokenizer = TextTokenizer::from_dir(tokenizer_dir, MAX_LENGTH)?;
        Self::new(
            WeightSource::WanPth(t5.to_path_buf()),
            config,
            tokenizer,
            device,
            dtype,
            mode,
            cache_budget_bytes,
        )
    }

    /// A seeded text encoder of width `d_model` with the built-in tiny tokenizer (the
    /// `tiny` and `small` presets, whose DiT takes `text_dim = d_model`).
    pub fn builtin(
        d_model: usize,
        seed: u64,
        device: &Device,
        dtype: DType,
        mode: TextEncoderMode,
        cache_budget_bytes: u64,
    ) -> Result<Self> {
        let tokenizer = TextTokenizer::from_json(
            BUILTIN_TOKENIZER,
            Some(BUILTIN_TOKENIZER_CONFIG),
            MAX_LENGTH,
        )?;
        let config = Umt5Config::tiny(tokenizer.vocab_size(), d_model);
        Self::seeded(
            config,
            seed,
            tokenizer,
            device,
            dtype,
            mode,
            cache_budget_bytes,
        )
    }

    /// A text encoder with seeded random weights of `config` and `tokenizer`.
    pub fn seeded(
        config: Umt5Config,
        seed: u64,
        tokenizer: TextTokenizer,
        device: &Device,
        dtype: DType,
        mode: TextEncoderMode,
        cache_budget_bytes: u64,
    ) -> Result<Self> {
        config.validate()?;
        Self::new(
            WeightSource::Seeded(config.clone(), seed),
            config,
            tokenizer,
            device,
            dtype,
            mode,
            cache_budget_bytes,
        )
    }

    fn new(
        source: WeightSource,
        config: Umt5Config,
        tokenizer: TextTokenizer,
        device: &Device,
        dtype: DType,
        mode: TextEncoderMode,
        cache_budget_bytes: u64,
    ) -> Result<Self> {
        if tokenizer.vocab_size() > config.vocab_size {
            return Err(TextError::config(
                "vocab_size",
                format!(
                    "the encoder's {} rows do not cover the tokenizer's {} tokens",
                    config.vocab_size,
                    tokenizer.vocab_size()
                ),
            ));
        }
        let encoder = Self {
            source,
            config,
            tokenizer,
            device: device.clone(),
            dtype,
            mode,
            state: Mutex::new(State {
                resident: None,
                cache: EmbeddingCache::new(cache_budget_bytes),
                weight_bytes: 0,
                loads: 0,
                encodes: 0,
            }),
        };
        if mode == TextEncoderMode::Resident {
            let weights = encoder.instantiate()?;
            let mut state = encoder.lock();
            state.weight_bytes = weights.weight_bytes();
            state.loads = 1;
            state.resident = Some(weights);
        }
        Ok(encoder)
    }

    /// Embeddings truncated and padded to `max_length` tokens instead of 512 (clears
    /// the cache: cached embeddings have the old length).
    pub fn with_max_length(mut self, max_length: usize) -> Result<Self> {
        self.tokenizer = self.tokenizer.with_max_length(max_length)?;
        self.lock().cache.clear();
        Ok(self)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while encoding leaves nothing half-written that a later call relies
        // on (the cache is only written with finished embeddings).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn instantiate(&self) -> Result<Umt5Encoder> {
        match &self.source {
            WeightSource::Dir(dir) => {
                let weights = Umt5Encoder::load(dir, &self.device, self.dtype)?;
                if weights.config() != &self.config {
                    return Err(TextError::io(
                        dir,
                        "config.json changed since the encoder was opened",
                    ));
                }
                Ok(weights)
            }
            WeightSource::WanPth(path) => Umt5Encoder::load_wan(path, &self.device, self.dtype),
            WeightSource::Seeded(config, seed) => {
                Umt5Encoder::seeded(config.clone(), *seed, &self.device, self.dtype)
            }
        }
    }

    /// The encoder config.
    pub fn config(&self) -> &Umt5Config {
        &self.config
    }

    /// Width of an embedding row (`d_model`).
    pub fn d_model(&self) -> usize {
        self.config.d_model
    }

    /// Rows of an embedding (`max_length`).
    pub fn max_length(&self) -> usize {
        self.tokenizer.max_length()
    }

    /// Resident or on-demand.
    pub fn mode(&self) -> TextEncoderMode {
        self.mode
    }

    /// The device the encoder runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// The cleaned prompt's tokens, as the pipelines feed them to the encoder.
    pub fn tokenize(&self, prompt: &str) -> Result<TokenizedPrompt> {
        self.tokenizer.tokenize(&prompt_clean(prompt))
    }

    /// The Wan embedding of `prompt`: f32 `[max_length, d_model]`, rows past the real
    /// tokens zero. Served from the cache when the cleaned prompt is there.
    pub fn encode(&self, prompt: &str) -> Result<Tensor> {
        self.encode_with(prompt, &|| {})
    }

    /// [`encode`](Self::encode) that calls `released` once an on-demand encode has
    /// released its weights (on success and on error), before the embedding is copied
    /// back: the caller's `text_end` boundary, where a reclaim returns the weights.
    pub fn encode_with(&self, prompt: &str, released: &dyn Fn()) -> Result<Tensor> {
        let cleaned = prompt_clean(prompt);
        let mut state = self.lock();
        if let Some(hit) = state.cache.get(&cleaned) {
            return Ok(hit);
        }
        let tokens = self.tokenizer.tokenize(&cleaned)?;
        let embeds = match state.resident.as_ref() {
            Some(weights) => self.embed(weights, &tokens)?,
            None => self.encode_on_demand(&mut state, &tokens, released)?,
        };
        state.encodes += 1;
        state.cache.insert(&cleaned, &embeds);
        Ok(embeds)
    }

    /// Loads the weights, encodes, releases the weights and calls `released`; the
    /// embedding is re-created after it (a reclaim there) so it does not pin a segment
    /// of the released weights.
    fn encode_on_demand(
        &self,
        state: &mut State,
        tokens: &TokenizedPrompt,
        released: &dyn Fn(),
    ) -> Result<Tensor> {
        let shape = [self.max_length(), self.d_model()];
        let result = (|| -> Result<Option<Vec<f32>>> {
            let weights = self.instantiate()?;
            state.loads += 1;
            state.weight_bytes = weights.weight_bytes();
            let embeds = self.embed(&weights, tokens)?;
            if self.device.is_meta() {
                return Ok(None);
            }
            Ok(Some(embeds.to_f32_vec()?))
        })();
        // Every device byte of the phase is dropped by now, on success and on error.
        released();
        match result? {
            Some(host) => Ok(Tensor::from_slice(&host, &shape, &self.device)?),
            None => Ok(Tensor::zeros(&shape, DType::F32, &self.device)?),
        }
    }

    /// Encoder rows of the real tokens, then zero rows up to `max_length`.
    fn embed(&self, weights: &Umt5Encoder, tokens: &TokenizedPrompt) -> Result<Tensor> {
        let hidden = weights.forward(&tokens.ids[..tokens.n], None)?;
        let pad = tokens.ids.len() - tokens.n;
        if pad == 0 {
            return Ok(hidden);
        }
        let zeros = Tensor::zeros(&[pad, self.d_model()], DType::F32, &self.device)?;
        Ok(Tensor::cat(&[&hidden, &zeros], 0)?)
    }

    /// Weights held, cache bytes and hit/miss counters.
    pub fn report(&self) -> TextEncoderReport {
        let state = self.lock();
        let cache: CacheStats = state.cache.stats();
        TextEncoderReport {
            mode: self.mode,
            resident_weight_bytes: state.resident.as_ref().map_or(0, Umt5Encoder::weight_bytes),
            weight_bytes: state.weight_bytes,
            loads: state.loads,
            encodes: state.encodes,
            cache_bytes: cache.bytes,
            cache_budget_bytes: cache.budget_bytes,
            cache_entries: cache.entries,
            cache_hits: cache.hits,
            cache_misses: cache.misses,
        }
    }

    /// Drops every cached embedding (their bytes return to the allocator once no session
    /// holds them).
    pub fn clear_cache(&self) {
        self.lock().cache.clear();
    }
}
