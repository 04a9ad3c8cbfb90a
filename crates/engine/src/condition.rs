//! The image condition of an image-conditioned model (LingBot-World, `small`), streamed
//! block by block: the pixel video `[image, zeros…]` of the whole horizon is never built.
//! Block 0 encodes the first frame and 8 zero frames, every later block 12 zero frames,
//! with the causal encoder's cache carried between blocks, so each block gets exactly the
//! latents of the whole-horizon encode (a test holds the bytes) while the session holds
//! one block's condition and the encoder's cache, whatever its length.
//!
//! After some blocks only zero frames reach the encoder's outputs, and the condition
//! stops changing: once a block's latents equal the previous block's bit for bit and the
//! encoder's cache is unchanged too (same fingerprint), every later block would encode
//! the same zeros from the same cache, so the condition is reused instead of encoded.
//! A device that computes nothing (the planner's meta twin) cannot compare values: it
//! settles at the block [`probe_settle_block`] finds for the VAE's architecture, which is
//! where a real session settles, so the twin's plan matches the real allocations.

/// Blocks the probe encodes before it gives up finding the fixed point.
const PROBE_BLOCKS: usize = 48;

use headroom_model::dit::config::IMAGE_MASK_CHANNELS;
use headroom_model::vae::{same_bytes, StreamingEncodeState, VaeConfig};
use headroom_model::{StateReader, StateWriter, WanVae};
use headroom_tensor::{DType, Device, Tensor};

use crate::blocks::BLOCK_FRAMES;
use crate::error::{EngineError, Result};

/// A session's image condition, one block at a time.
#[derive(Debug)]
pub(crate) struct ImageCondition {
    /// The first frame `[1, 3, 1, H, W]`, until block 0 takes it.
    first: Option<Tensor>,
    state: StreamingEncodeState,
    /// The block the condition below belongs to, and the condition
    /// `[1, 4 + z_dim, 3, h, w]`.
    current: Option<(usize, Tensor)>,
    /// Pixel height and width.
    size: [usize; 2],
    /// The encoder cache's fingerprint after the last block encoded.
    last_fingerprint: Option<u64>,
    /// The block from which the condition is reused instead of encoded.
    settled_at: Option<usize>,
    /// The previous block's condition, while the next one is encoded.
    previous: Option<Tensor>,
    /// Where a condition that cannot compare values (a meta device) settles.
    meta_settles_at: Option<usize>,
    /// A fingerprint of the first frame's source (the request's image, the model's own
    /// first frame, or black): conditions of one origin at one block are the same.
    origin: u64,
    device: Device,
}

impl ImageCondition {
    /// The condition of a session starting from `first` (`[1, 3, 1, H, W]` in [−1, 1]),
    /// made from a source of fingerprint `origin`; on a meta device it settles at block
    /// `meta_settles_at`.
    pub(crate) fn new(first: Tensor, meta_settles_at: Option<usize>, origin: u64) -> Result<Self> {
        let [1, 3, 1, h, w] = *first.shape() else {
            return Err(EngineError::request(
                "image",
                format!(
                    "the first frame must be [1, 3, 1, H, W], got {:?}",
                    first.shape()
                ),
            ));
        };
        Ok(Self {
            device: first.device().clone(),
            first: Some(first),
            state: StreamingEncodeState::default(),
            current: None,
            size: [h, w],
            last_fingerprint: None,
            settled_at: None,
            previous: None,
            meta_settles_at,
            origin,
        })
    }

    /// Makes block `n`'s condition current: encoded now when `n` is the next block,
    /// nothing to do when it is already current. Blocks come in order.
    pub(crate) fn advance(&mut self, vae: &WanVae, n: usize) -> Result<()> {
        let Some(pixels) = self.pixels_for(n)? else {
            return Ok(());
        };
        let latent = vae.normalize(&vae.encode_frames(&pixels, &mut self.state)?)?;
        drop(pixels);
        self.settle(n, latent)
    }

    /// [`Self::advance`] of several sessions' conditions to their block `n` at once
    /// (one video size, so their encoders stand at the same point): one batched encode,
    /// each session's latents the bytes it gets alone.
    pub(crate) fn advance_batch(
        conds: &mut [&mut ImageCondition],
        vae: &WanVae,
        n: usize,
    ) -> Result<()> {
        let mut pending = Vec::new();
        for (k, cond) in conds.iter_mut().enumerate() {
            if let Some(pixels) = cond.pixels_for(n)? {
                pending.push((k, pixels));
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        // Sessions whose encoders stand in the same state and take the same pixels (one
        // first frame: a server's default image) get the same latents: each group is
        // encoded once and its state and latents copied to the others. Conditions of one
        // origin at one block are such a group; a meta device (the planner's twin),
        // which cannot compare values, goes by the origin alone, so its plan matches.
        let mut copy_of: Vec<Option<usize>> = vec![None; pending.len()];
        for j in 1..pending.len() {
            copy_of[j] = (0..j).filter(|&r| copy_of[r].is_none()).find(|&r| {
                let (a, b) = (pending[r].0, pending[j].0);
                let (pa, pb) = (&pending[r].1, &pending[j].1);
                conds[a].origin == conds[b].origin
                    && (pa.device().is_meta()
                        || (same_bytes(pa, pb) && conds[a].state.same_as(&conds[b].state)))
            });
        }
        let encoded: Vec<usize> = (0..pending.len())
            .filter(|&j| copy_of[j].is_none())
            .collect();
        let videos: Vec<&Tensor> = encoded.iter().map(|&j| &pending[j].1).collect();
        let mut states: Vec<&mut StreamingEncodeState> = Vec::with_capacity(encoded.len());
        let mut owners = encoded.iter().map(|&j| pending[j].0).peekable();
        for (k, cond) in conds.iter_mut().enumerate() {
            if owners.peek() == Some(&k) {
                owners.next();
                states.push(&mut cond.state);
            }
        }
        let latents = vae.encode_frames_batch(&videos, &mut states)?;
        drop(states);
        drop(videos);
        let mut latent_of: Vec<Option<Tensor>> = vec![None; pending.len()];
        for (&j, latent) in encoded.iter().zip(latents) {
            latent_of[j] = Some(latent);
        }
        // Every copy takes its encoder's state before any condition settles: settling
        // drops the encoder's cache, and a copy of a dropped cache would start the next
        // block's zeros as a stream's first chunk (a batch of one origin failed at the
        // block its conditions settle, block 9 on `world`).
        let mut settling = Vec::with_capacity(pending.len());
        for j in 0..pending.len() {
            let (k, from) = (pending[j].0, copy_of[j]);
            let latent = match from {
                Some(r) => {
                    conds[k].state = conds[pending[r].0].state.duplicate()?;
                    latent_of[r].clone()
                }
                None => latent_of[j].clone(),
            };
            let latent = latent.unwrap_or_else(|| unreachable!("every group was encoded"));
            settling.push((k, latent));
        }
        for (k, latent) in settling {
            conds[k].settle(n, vae.normalize(&latent)?)?;
        }
        Ok(())
    }

    /// The pixels block `n` encodes when it is the next block (its previous
    /// condition freed first), `None` when it is current already.
    fn pixels_for(&mut self, n: usize) -> Result<Option<Tensor>> {
        let next = match &self.current {
            Some((b, _)) if *b == n => return Ok(None),
            Some((b, _)) => b + 1,
            None => 0,
        };
        if n != next {
            return Err(EngineError::request(
                "image condition",
                format!("block {n} asked for, but block {next} comes next"),
            ));
        }
        if self.settled_at.is_some() {
            // A fixed point: block n's condition is the previous block's.
            if let Some((b, _)) = self.current.as_mut() {
                *b = n;
            }
            return Ok(None);
        }
        // The previous block's condition is only kept to see whether this one equals it.
        self.previous = self.current.take().map(|(_, c)| c);
        let [h, w] = self.size;
        let first = self.first.take();
        // Block 0: the image, then 8 zero frames (1 + 4 + 4); later blocks 3 × 4 zeros.
        let zeros = match &first {
            Some(_) => 4 * (BLOCK_FRAMES - 1),
            None => 4 * BLOCK_FRAMES,
        };
        let rest = Tensor::zeros(&[1, 3, zeros, h, w], DType::F32, &self.device)?;
        Ok(Some(match &first {
            Some(f) => Tensor::cat(&[f, &rest], 2)?,
            None => rest,
        }))
    }

    /// Makes block `n`'s normalised latents its condition: the mask (1 on the first
    /// latent frame of block 0, else 0) in front.
    fn settle(&mut self, n: usize, latent: Tensor) -> Result<()> {
        let device = self.device.clone();
        let [_, _, t, lh, lw] = *latent.shape() else {
            unreachable!("latents are 5-D")
        };
        let mask = if n == 0 {
            Tensor::cat(
                &[
                    &Tensor::full(
                        &[1, IMAGE_MASK_CHANNELS, 1, lh, lw],
                        1.0,
                        DType::F32,
                        &device,
                    )?,
                    &Tensor::zeros(
                        &[1, IMAGE_MASK_CHANNELS, t - 1, lh, lw],
                        DType::F32,
                        &device,
                    )?,
                ],
                2,
            )?
        } else {
            Tensor::zeros(&[1, IMAGE_MASK_CHANNELS, t, lh, lw], DType::F32, &device)?
        };
        let condition = Tensor::cat(&[&mask, &latent], 1)?;
        let previous = self.previous.take();
        let fingerprint = self.state.fingerprint()?;
        let settles = if self.device.is_meta() {
            self.meta_settles_at == Some(n + 1)
        } else {
            fingerprint.is_some()
                && fingerprint == self.last_fingerprint
                && match &previous {
                    Some(previous) => same_bits(previous, &condition)?,
                    None => false,
                }
        };
        if settles {
            self.settled_at = Some(n + 1);
            // Nothing is encoded any more: the cache goes.
            self.state = StreamingEncodeState::default();
        }
        self.last_fingerprint = fingerprint;
        self.current = Some((n, condition));
        Ok(())
    }

    /// Saves what later blocks depend on: the first frame (until block 0 takes it), the
    /// encoder's cache, the current block's condition, and where it stands.
    pub(crate) fn save(&self, w: &mut StateWriter<'_>) -> Result<()> {
        w.maybe_tensor("first", self.first.as_ref())?;
        self.state.save(&mut w.scope("encoder"))?;
        w.field("current_block", &self.current.as_ref().map(|(b, _)| *b))?;
        w.maybe_tensor("current", self.current.as_ref().map(|(_, c)| c))?;
        w.field("size", &self.size)?;
        w.field("last_fingerprint", &self.last_fingerprint)?;
        w.field("settled_at", &self.settled_at)?;
        w.field("origin", &self.origin)?;
        Ok(())
    }

    /// The condition [`Self::save`] saved, on `r`'s device.
    pub(crate) fn restore(r: &StateReader<'_>) -> Result<Self> {
        let current = match r.field::<Option<usize>>("current_block")? {
            Some(b) => Some((b, r.tensor("current")?)),
            None => None,
        };
        Ok(Self {
            first: r.maybe_tensor("first")?,
            state: StreamingEncodeState::restore(&r.scope("encoder"))?,
            current,
            size: r.field("size")?,
            last_fingerprint: r.field("last_fingerprint")?,
            settled_at: r.field("settled_at")?,
            previous: None,
            meta_settles_at: None,
            origin: r.field("origin")?,
            device: r.device().clone(),
        })
    }

    /// The block from which the condition is reused (the encoder reached its fixed
    /// point), once it did.
    #[cfg(test)]
    pub(crate) fn settled_at(&self) -> Option<usize> {
        self.settled_at
    }

    /// The current block's condition `[1, 4 + z_dim, 3, h, w]`, once a block was made
    /// current.
    pub(crate) fn current(&self) -> Option<&Tensor> {
        self.current.as_ref().map(|(_, c)| c)
    }

    /// Bytes held: the current block's condition and the encoder's cache.
    pub(crate) fn bytes(&self) -> u64 {
        let first = self.first.as_ref().map_or(0, Tensor::storage_bytes);
        let current = self.current.as_ref().map_or(0, |(_, c)| c.storage_bytes());
        (first + current + self.state.bytes()) as u64
    }
}

/// The block from which the image condition of a VAE of `config`'s architecture is
/// reused: a narrow seeded VAE of the same temporal structure (stages, residual blocks,
/// temporal downsampling) encodes a noise image at the smallest size on the host until
/// its condition settles. Where the image stops reaching the encoder's outputs depends
/// on that structure only, not on the weights, the image or the size. `None` when it
/// did not settle within the probe's blocks (or the probe failed: nothing is reused).
pub(crate) fn probe_settle_block(config: &VaeConfig) -> Option<usize> {
    let probe = || -> Result<Option<usize>> {
        let device = Device::cpu()?;
        let narrow = VaeConfig {
            base_dim: 4,
            ..config.clone()
        };
        let vae = WanVae::seeded(narrow, 1, &device, DType::F32)?;
        let side = config.spatial_factor() * 2;
        let first = Tensor::randn(&[1, 3, 1, side, side], 5, 0, DType::F32, &device)?;
        let mut cond = ImageCondition::new(first, None, 0)?;
        for n in 0..PROBE_BLOCKS {
            cond.advance(&vae, n)?;
            if cond.settled_at.is_some() {
                return Ok(cond.settled_at);
            }
        }
        Ok(None)
    };
    probe().ok().flatten()
}

/// Whether two tensors hold the same shape and bits.
fn same_bits(a: &Tensor, b: &Tensor) -> Result<bool> {
    if a.shape() != b.shape() || a.dtype() != b.dtype() {
        return Ok(false);
    }
    if let (Some(x), Some(y)) = (a.host_bytes(), b.host_bytes()) {
        return Ok(x == y);
    }
    let bits = |t: &Tensor| -> Result<Vec<u32>> {
        Ok(t.to_f32_vec()?.iter().map(|v| v.to_bits()).collect())
    };
    Ok(bits(a)? == bits(b)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::ModelPreset;
    use headroom_tensor::Device;

    /// The whole-horizon condition as it was built before streaming: the pixel video
    /// `[image, zeros × (frames − 1)]` encoded in one pass, the mask in front.
    fn whole_horizon(vae: &WanVae, first: &Tensor, blocks: usize) -> Tensor {
        let [_, _, _, h, w] = *first.shape() else {
            unreachable!()
        };
        let frames = 1 + 4 * (blocks * BLOCK_FRAMES - 1);
        let rest = Tensor::zeros(&[1, 3, frames - 1, h, w], DType::F32, first.device()).unwrap();
        let video = Tensor::cat(&[first, &rest], 2).unwrap();
        let latent = vae.normalize(&vae.encode(&video).unwrap()).unwrap();
        let [_, _, t, lh, lw] = *latent.shape() else {
            unreachable!()
        };
        let dev = first.device();
        let ones = Tensor::full(&[1, 4, 1, lh, lw], 1.0, DType::F32, dev).unwrap();
        let zeros = Tensor::zeros(&[1, 4, t - 1, lh, lw], DType::F32, dev).unwrap();
        let mask = Tensor::cat(&[&ones, &zeros], 2).unwrap();
        Tensor::cat(&[&mask, &latent], 1).unwrap()
    }

    #[test]
    fn streamed_blocks_are_the_bytes_of_the_whole_horizon_encode() {
        let dev = Device::cpu().unwrap();
        let vae = WanVae::seeded(
            ModelPreset::named("small").unwrap().vae,
            7,
            &dev,
            DType::F32,
        )
        .unwrap();
        let (h, w) = (32, 48);
        let pixels: Vec<f32> = (0..3 * h * w)
            .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
            .collect();
        let first = Tensor::from_slice(&pixels, &[1, 3, 1, h, w], &dev).unwrap();
        // 24 blocks reach the fixed point, after which the condition is reused.
        for blocks in [1, 3, 10, 24] {
            let whole = whole_horizon(&vae, &first, blocks);
            let mut streamed = ImageCondition::new(first.clone(), None, 0).unwrap();
            for n in 0..blocks {
                streamed.advance(&vae, n).unwrap();
                let block = streamed.current().unwrap().clone();
                let want = whole.narrow(2, n * BLOCK_FRAMES, BLOCK_FRAMES).unwrap();
                let bits = |t: &Tensor| -> Vec<u32> {
                    t.to_f32_vec()
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect()
                };
                assert_eq!(bits(&block), bits(&want), "{blocks} blocks: block {n}");
                // Asking again for the current block keeps it without encoding.
                streamed.advance(&vae, n).unwrap();
                assert_eq!(streamed.current().unwrap().shape(), block.shape());
            }
            let settled = streamed.settled_at();
            eprintln!("{blocks} blocks: settled at {settled:?}");
            if blocks == 24 {
                assert!(settled.is_some_and(|b| b < 24), "settled at {settled:?}");
                assert_eq!(
                    probe_settle_block(vae.config()),
                    settled,
                    "the probe finds where a real condition settles"
                );
                assert_eq!(streamed.state.bytes(), 0, "the encoder's cache is freed");
            }
            assert!(
                streamed.advance(&vae, blocks + 1).is_err(),
                "blocks come in order"
            );
        }
    }
}
