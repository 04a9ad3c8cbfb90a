//! The Wan 2.1 causal VAE (`AutoencoderKLWan`, diffusers 0.42.1; WAN.md §2): loading,
//! encode, whole decode, latent (de)normalisation, and the session-owned streaming
//! decoder in [`stream`].

pub(crate) mod batch;
pub mod blocks;
pub mod coder;
pub mod config;
pub mod stream;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use headroom_tensor::ops::conv::Conv3dOptions;
use headroom_tensor::{DType, Device, Tensor};

pub use config::VaeConfig;
pub use stream::{OutputFormat, StreamingDecodeState, StreamingDecoder};

use crate::error::{ModelError, Result};
use crate::state::{StateReader, StateWriter};
use crate::weights::{read_config, Init, WeightStore};
use blocks::Slots;
use coder::{Decoder, Encoder};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A process-unique decoder id (full and tiny decoders share the sequence, so a state
/// never mistakes one for the other).
pub(crate) fn next_decoder_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A 1×1×1 conv without cache (`quant_conv`, `post_quant_conv`).
#[derive(Debug)]
struct PointConv {
    weight: Tensor,
    bias: Tensor,
}

impl PointConv {
    fn load(w: &WeightStore, prefix: &str, channels: usize) -> Result<Self> {
        Ok(Self {
            weight: w.get(
                &format!("{prefix}.weight"),
                &[channels, channels, 1, 1, 1],
                Init::FanIn,
            )?,
            bias: w.get_as(
                &format!("{prefix}.bias"),
                &[channels],
                Init::Scaled(0.05),
                DType::F32,
            )?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.conv3d(
            &self.weight,
            Some(&self.bias),
            Conv3dOptions::causal([0, 0, 0]),
        )?)
    }
}

/// The encoder's per-stream cache: one slot per cached conv and the frames seen.
#[derive(Debug, Default)]
pub struct StreamingEncodeState {
    slots: Vec<Option<Tensor>>,
    frames: usize,
}

impl StreamingEncodeState {
    /// Bytes the cache holds (its slots' storage).
    pub fn bytes(&self) -> usize {
        self.slots.iter().flatten().map(Tensor::storage_bytes).sum()
    }

    /// Whether `other` has seen as many frames and holds the same cache, byte for byte
    /// (false where the bytes are not on the host to compare): then the same input
    /// encodes to the same latents through either.
    pub fn same_as(&self, other: &Self) -> bool {
        self.frames == other.frames
            && self.slots.len() == other.slots.len()
            && self.slots.iter().zip(&other.slots).all(|pair| match pair {
                (None, None) => true,
                (Some(a), Some(b)) => same_bytes(a, b),
                _ => false,
            })
    }

    /// Saves the cache slots and the frames seen.
    pub fn save(&self, w: &mut StateWriter<'_>) -> Result<()> {
        w.field("frames", &self.frames)?;
        w.slots("slot", &self.slots)
    }

    /// The cache [`Self::save`] saved.
    pub fn restore(r: &StateReader<'_>) -> Result<Self> {
        Ok(Self {
            slots: r.slots("slot")?,
            frames: r.field("frames")?,
        })
    }

    /// A copy whose cache has storage of its own.
    pub fn duplicate(&self) -> Result<Self> {
        let slots = self
            .slots
            .iter()
            .map(|s| s.as_ref().map(|t| t.copy_as(t.dtype())).transpose())
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Self {
            slots,
            frames: self.frames,
        })
    }

    /// A hash of the cache's shapes and values (`None` on a device that computes
    /// nothing): two states with one fingerprint encode the same input alike.
    pub fn fingerprint(&self) -> Result<Option<u64>> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for slot in &self.slots {
            match slot {
                Some(t) if t.device().is_meta() => return Ok(None),
                Some(t) => {
                    t.shape().hash(&mut hasher);
                    // The bytes in place where the host holds them; else their values.
                    match t.host_bytes() {
                        Some(bytes) => hasher.write(bytes),
                        None => {
                            for v in t.to_f32_vec()? {
                                v.to_bits().hash(&mut hasher);
                            }
                        }
                    }
                }
                None => 0usize.hash(&mut hasher),
            }
        }
        Ok(Some(hasher.finish()))
    }
}

/// Whether two tensors have one shape, one dtype and the same bytes on the host (false
/// where either's bytes are not readable in place).
pub fn same_bytes(a: &Tensor, b: &Tensor) -> bool {
    a.shape() == b.shape()
        && a.dtype() == b.dtype()
        && matches!((a.host_bytes(), b.host_bytes()), (Some(x), Some(y)) if x == y)
}

/// The Wan 2.1 VAE; immutable once loaded (sessions keep their caches themselves).
#[derive(Debug)]
pub struct WanVae {
    id: u64,
    config: VaeConfig,
    encoder: Encoder,
    decoder: Decoder,
    quant_conv: PointConv,
    post_quant_conv: PointConv,
    device: Device,
}

impl WanVae {
    /// Builds the network from a weight store.
    pub fn from_store(config: VaeConfig, w: &WeightStore) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            id: next_decoder_id(),
            encoder: Encoder::load(w, &config)?,
            decoder: Decoder::load(w, &config)?,
            quant_conv: PointConv::load(w, "quant_conv", 2 * config.z_dim)?,
            post_quant_conv: PointConv::load(w, "post_quant_conv", config.z_dim)?,
            device: w.device().clone(),
            config,
        })
    }

    /// Loads a diffusers VAE folder (`config.json` + safetensors) with weights in `dtype`.
    pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let config = VaeConfig::from_json(&read_config(dir)?)?;
        Self::from_store(config, &WeightStore::from_dir(dir, device, dtype)?)
    }

    /// Seeded random weights for `config`.
    pub fn seeded(config: VaeConfig, seed: u64, device: &Device, dtype: DType) -> Result<Self> {
        Self::from_store(config, &WeightStore::seeded(seed, device, dtype))
    }

    /// The config.
    pub fn config(&self) -> &VaeConfig {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A process-unique id (states remember which VAE they belong to).
    pub fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    pub(crate) fn post_quant(&self, z: &Tensor) -> Result<Tensor> {
        self.post_quant_conv.forward(z)
    }

    /// Latent mean of a video `[B, 3, T, H, W]` in [−1, 1] (`encode(x).latent_dist.mean`).
    /// Frames beyond `1 + 4·⌊(T−1)/4⌋` are dropped, as diffusers does.
    pub fn encode(&self, video: &Tensor) -> Result<Tensor> {
        let op = "vae encode";
        let [_, c, t, h, w] = *video.shape() else {
            return Err(ModelError::input(
                op,
                format!("video must be [B, 3, T, H, W], got {:?}", video.shape()),
            ));
        };
        let s = self.config.spatial_factor();
        if c != self.config.in_channels || t == 0 || h % s != 0 || w % s != 0 {
            return Err(ModelError::input(
                op,
                format!(
                    "video {:?} needs {} channels, T ≥ 1 and H, W divisible by {s}",
                    video.shape(),
                    self.config.in_channels
                ),
            ));
        }
        let used = 1 + 4 * ((t - 1) / 4);
        let mut state = StreamingEncodeState::default();
        self.encode_frames(&video.narrow(2, 0, used)?, &mut state)
    }

    /// Encodes the next frames of a stream to latent means, carrying the encoder's causal
    /// cache in `state`: the stream's first frame is a chunk of its own, later frames go
    /// in chunks of 4 (diffusers' order), one latent frame per chunk. Splitting a video
    /// into pieces this way gives the same latents as encoding it whole.
    pub fn encode_frames(
        &self,
        video: &Tensor,
        state: &mut StreamingEncodeState,
    ) -> Result<Tensor> {
        let op = "vae encode";
        let t = video.shape().get(2).copied().unwrap_or(0);
        let first = usize::from(state.frames == 0);
        if t < first || (t - first) % 4 != 0 || t == 0 {
            return Err(ModelError::input(
                op,
                format!("{t} frames do not split into whole chunks (the stream's first frame alone, then 4 at a time)"),
            ));
        }
        if state.slots.len() != self.encoder.slot_count() {
            state.slots = (0..self.encoder.slot_count()).map(|_| None).collect();
        }
        let mut cache = Slots {
            slots: &mut state.slots,
            dtype: DType::F32,
        };
        let mut outs = Vec::new();
        let mut at = 0;
        while at < t {
            let len = if state.frames == 0 { 1 } else { 4 };
            outs.push(
                self.encoder
                    .forward(&video.narrow(2, at, len)?, &mut cache)?,
            );
            state.frames += len;
            at += len;
        }
        let refs: Vec<&Tensor> = outs.iter().collect();
        let h = self.quant_conv.forward(&Tensor::cat(&refs, 2)?)?;
        Ok(h.narrow(1, 0, self.config.z_dim)?.contiguous()?)
    }

    /// [`Self::encode_frames`] of several streams at once: `videos[k]` (one shape for
    /// all) continues the stream of `states[k]`, the caches stacked along the batch axis
    /// and handed back after; the streams must be at the same point (the same frames
    /// seen). Each gets the latents it gets alone.
    pub fn encode_frames_batch(
        &self,
        videos: &[&Tensor],
        states: &mut [&mut StreamingEncodeState],
    ) -> Result<Vec<Tensor>> {
        let op = "vae encode";
        let same = videos.iter().all(|v| v.shape() == videos[0].shape())
            && states.iter().all(|s| s.frames == states[0].frames);
        if videos.is_empty() || videos.len() != states.len() || !same {
            return Err(ModelError::input(
                op,
                format!(
                    "{} videos for {} streams: a batch has one of each, of one shape, each stream as far as the others",
                    videos.len(),
                    states.len()
                ),
            ));
        }
        for state in states.iter_mut() {
            if state.slots.len() != self.encoder.slot_count() {
                state.slots = (0..self.encoder.slot_count()).map(|_| None).collect();
            }
        }
        let frames = states[0].frames;
        let mut lists: Vec<&mut Vec<Option<Tensor>>> =
            states.iter_mut().map(|s| &mut s.slots).collect();
        let mut batch = StreamingEncodeState {
            slots: batch::take_stacked(&mut lists)?,
            frames,
        };
        drop(lists);
        let latents = self.encode_frames(&Tensor::cat(videos, 0)?, &mut batch)?;
        for (state, own) in states
            .iter_mut()
            .zip(batch::unstack_slots(batch.slots, videos.len())?)
        {
            state.slots = own;
            state.frames = batch.frames;
        }
        (0..videos.len())
            .map(|k| Ok(latents.narrow(0, k, 1)?.contiguous()?))
            .collect()
    }

    /// Decodes latents `[1, z_dim, T, h, w]` (already denormalised) in one call:
    /// `[1, 3, 1 + tc·(T−1), h·s, w·s]` clamped to [−1, 1].
    pub fn decode(&self, z: &Tensor) -> Result<Tensor> {
        let decoder = StreamingDecoder::new(self, None);
        let mut state = StreamingDecodeState::new("decode")?;
        let out = decoder.decode_chunk(z, &mut state, OutputFormat::Video, true)?;
        out.ok_or_else(|| ModelError::input("vae decode", "no output produced"))
    }

    /// Pipeline denormalisation before decode: `z / (1/std) + mean` per channel.
    pub fn denormalize(&self, latents: &Tensor) -> Result<Tensor> {
        let (inv, mean) = self.latent_stats(latents.device())?;
        Ok(latents.div(&inv)?.add(&mean)?)
    }

    /// Pipeline normalisation after encode: `(z − mean) · (1/std)` per channel.
    pub fn normalize(&self, latents: &Tensor) -> Result<Tensor> {
        let (inv, mean) = self.latent_stats(latents.device())?;
        Ok(latents.sub(&mean)?.mul(&inv)?)
    }

    fn latent_stats(&self, device: &Device) -> Result<(Tensor, Tensor)> {
        self.config.validate_latent_stats()?;
        let z = self.config.z_dim;
        let inv: Vec<f32> = self.config.latents_std.iter().map(|s| 1.0 / s).collect();
        Ok((
            Tensor::from_slice(&inv, &[1, z, 1, 1, 1], device)?,
            Tensor::from_slice(&self.config.latents_mean, &[1, z, 1, 1, 1], device)?,
        ))
    }
}
