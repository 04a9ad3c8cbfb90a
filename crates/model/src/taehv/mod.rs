//! TAEHV's tiny video decoder (github.com/madebyollin/taehv, `taehv.py`): the decoder
//! half of the released `taew2_1` / `taew2_2` files and of decoders distilled in their
//! layout, streamed per session.
//!
//! The network is one sequence of 2-D layers over frames: `tanh(x/3)·3`, a 3×3 conv to
//! the first width, then `N` stages (three in the released files, two in a decoder for
//! a VAE with 4× spatial compression) of three `MemBlock`s, a nearest ×2 upsample, a
//! `TGrow` (a 1×1 conv whose channel groups become successive frames) and a 3×3 conv to
//! the next width; a ReLU, a last 3×3 conv to `3·p²` channels, a pixel shuffle by `p`,
//! and a clamp to [0, 1]. A memory block sees its own input at the previous frame, so a
//! stream's state is one frame per memory block (`3·N`), a few tens of MiB where the
//! full VAE keeps GiBs; nothing else carries from frame to frame. The first
//! `t_upscale − 1` output frames of a stream are dropped, so latent frame 0 gives one
//! frame and every later one `t_upscale` (4), as the Wan VAE does.
//!
//! Decoding runs one latent frame at a time (each frame's work is the same whatever the
//! chunking, so chunked decodes equal one call byte for byte), with the sessions of a
//! batch stacked along the batch axis.

mod load;
mod stream;

use std::path::Path;

use headroom_tensor::{DType, Device, Tensor};

use crate::error::{ModelError, Result};
use crate::weights::{Init, WeightStore};

pub use load::{is_taehv, is_taehv_file, recognise};

/// Memory blocks per stage.
const MEM_BLOCKS: usize = 3;

/// The most stages a decoder may have (a file says how many; 8 is 256× in space).
pub const MAX_STAGES: usize = 8;

/// The most output frames per latent frame (the product of the time strides; Wan's
/// VAEs make 4).
pub const MAX_T_UPSCALE: usize = 16;

/// Index in `taehv.py`'s `decoder` Sequential of layer `offset` of stage `k` (0–2 its
/// memory blocks, 3 the upsample, 4 the `TGrow`, 5 the conv): after the clamp, the
/// first conv and a ReLU (0–2), six layers a stage.
fn stage_layer(k: usize, offset: usize) -> usize {
    3 + 6 * k + offset
}

/// Index of the output conv of a decoder of `stages` stages, `4 + 6·stages` (after the
/// stages come a ReLU, then the conv).
fn last_layer(stages: usize) -> usize {
    stage_layer(stages, 1)
}

/// Shape of a TAEHV decoder: what the file's shapes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TinyConfig {
    /// Latent channels it decodes (16 for `taew2_1`, 48 for `taew2_2`).
    pub latent_channels: usize,
    /// Output pixel-shuffle factor (1 for `taew2_1`, 2 for `taew2_2`).
    pub patch: usize,
    /// Width of each stage and of the output conv: one more than the stages
    /// (`[256, 128, 64, 64]` for three).
    pub widths: Vec<usize>,
    /// Frames each stage's `TGrow` makes of one, one per stage (`[1, 2, 2]`: 4 frames a
    /// latent frame).
    pub time_strides: Vec<usize>,
}

impl TinyConfig {
    /// `taew2_1`'s shapes: Wan 2.1 latents (16 channels), no patch.
    pub fn taew2_1() -> Self {
        Self {
            latent_channels: 16,
            patch: 1,
            widths: vec![256, 128, 64, 64],
            time_strides: vec![1, 2, 2],
        }
    }

    /// `taew2_2`'s shapes: Wan 2.2-5B latents (48 channels), patch 2.
    pub fn taew2_2() -> Self {
        Self {
            latent_channels: 48,
            patch: 2,
            ..Self::taew2_1()
        }
    }

    /// The released decoder for latents of `channels` channels (16 → `taew2_1`, 48 →
    /// `taew2_2`), for plans made without a file.
    pub fn released_for(channels: usize) -> Result<Self> {
        match channels {
            16 => Ok(Self::taew2_1()),
            48 => Ok(Self::taew2_2()),
            c => Err(ModelError::config(
                "decoder",
                format!("no released tiny decoder decodes {c}-channel latents (taew2_1 has 16, taew2_2 48): give a --tiny-decoder file"),
            )),
        }
    }

    /// Stages (×2 upsamples): one per time stride.
    pub fn stage_count(&self) -> usize {
        self.time_strides.len()
    }

    /// Output frames per latent frame (saturating: [`Self::validate`] bounds it).
    pub fn t_upscale(&self) -> usize {
        self.time_strides
            .iter()
            .fold(1usize, |acc, &s| acc.saturating_mul(s))
    }

    /// Pixels per latent cell along each side: `2^stages · patch` (saturating:
    /// [`Self::validate`] bounds it).
    pub fn spatial_factor(&self) -> usize {
        u32::try_from(self.stage_count())
            .ok()
            .and_then(|n| 1usize.checked_shl(n))
            .map_or(usize::MAX, |f| f.saturating_mul(self.patch))
    }

    /// Refuses empty widths and strides, a stage count outside 1..=[`MAX_STAGES`],
    /// widths that are not one more than the stages, and more than [`MAX_T_UPSCALE`]
    /// frames per latent frame.
    pub fn validate(&self) -> Result<()> {
        if self.latent_channels == 0 || self.patch == 0 {
            return Err(ModelError::config(
                "tiny decoder",
                "latent channels and patch must be at least 1",
            ));
        }
        let n = self.stage_count();
        if !(1..=MAX_STAGES).contains(&n) {
            return Err(ModelError::config(
                "time_strides",
                format!("{n} stages (one stride each); a tiny decoder has 1 to {MAX_STAGES}"),
            ));
        }
        if self.widths.len() != n + 1 {
            return Err(ModelError::config(
                "widths",
                format!(
                    "{:?} has {} entries; {n} stages need {} (each stage's and the output conv's)",
                    self.widths,
                    self.widths.len(),
                    n + 1
                ),
            ));
        }
        if self.widths.contains(&0) || self.time_strides.contains(&0) {
            return Err(ModelError::config(
                "tiny decoder",
                format!(
                    "widths {:?} and time strides {:?} must be at least 1",
                    self.widths, self.time_strides
                ),
            ));
        }
        if self.t_upscale() > MAX_T_UPSCALE {
            return Err(ModelError::config(
                "time_strides",
                format!(
                    "{:?} make {} frames per latent frame; at most {MAX_T_UPSCALE}",
                    self.time_strides,
                    self.t_upscale()
                ),
            ));
        }
        Ok(())
    }

    /// Per stage: (width, frames per latent frame, pixels per latent cell) of the memory
    /// blocks' inputs, which a stream's state holds one frame of per block.
    fn stages(&self) -> Vec<(usize, usize, usize)> {
        let mut frames = 1;
        let mut out = Vec::with_capacity(self.stage_count());
        for (k, (&width, &stride)) in self.widths.iter().zip(&self.time_strides).enumerate() {
            out.push((width, frames, 1 << k));
            frames *= stride;
        }
        out
    }

    /// Bytes a stream's state holds for video of `height × width` in `dtype` (after its
    /// first latent frame; nothing before).
    pub fn state_bytes(&self, height: usize, width: usize, dtype: DType) -> u64 {
        let s = self.spatial_factor();
        let (h, w) = (height / s, width / s);
        self.stages()
            .iter()
            .map(|&(c, _, scale)| (MEM_BLOCKS * c * h * scale * w * scale * dtype.size()) as u64)
            .sum()
    }
}

/// A 3×3 (or 1×1) conv2d with optional bias.
#[derive(Debug)]
struct Conv {
    weight: Tensor,
    bias: Option<Tensor>,
    pad: usize,
}

impl Conv {
    fn load(w: &WeightStore, key: &str, cin: usize, cout: usize, bias: bool) -> Result<Self> {
        Ok(Self {
            weight: w.get(&format!("{key}.weight"), &[cout, cin, 3, 3], Init::FanIn)?,
            bias: bias
                .then(|| {
                    w.get_as(
                        &format!("{key}.bias"),
                        &[cout],
                        Init::Scaled(0.05),
                        DType::F32,
                    )
                })
                .transpose()?,
            pad: 1,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.conv2d(
            &self.weight,
            self.bias.as_ref(),
            [1, 1],
            [self.pad, self.pad],
        )?)
    }
}

/// `MemBlock(n, n)`: `relu(conv(relu(conv(relu(conv(cat[x, past]))))) + x)`, where
/// `past` is the block's input at the previous frame.
#[derive(Debug)]
struct MemBlock {
    convs: [Conv; 3],
    /// The first conv's weights on `x` alone (its first `n` input channels): a stream's
    /// first frame has a zero past, whose products are all zero.
    first_x: Tensor,
}

/// Frame `t` of each of `b` streams of `s` frames in `x [b·s, …]`, for `t` in `range`,
/// stream-major: `[b·len, …]` (a view when `b` is 1).
fn frames_of(x: &Tensor, b: usize, s: usize, range: std::ops::Range<usize>) -> Result<Tensor> {
    let len = range.len();
    if b == 1 {
        return Ok(x.narrow(0, range.start, len)?);
    }
    let parts = (0..b)
        .map(|k| x.narrow(0, k * s + range.start, len))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0)?)
}

/// `a [b·p, …]` and `c [b·q, …]` interleaved per stream: `[b·(p + q), …]`.
fn per_stream_cat(a: &Tensor, c: &Tensor, b: usize) -> Result<Tensor> {
    if b == 1 {
        return Ok(Tensor::cat(&[a, c], 0)?);
    }
    let (p, q) = (a.shape()[0] / b, c.shape()[0] / b);
    let mut parts = Vec::with_capacity(2 * b);
    for k in 0..b {
        parts.push(a.narrow(0, k * p, p)?);
        parts.push(c.narrow(0, k * q, q)?);
    }
    Ok(Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0)?)
}

impl MemBlock {
    fn load(w: &WeightStore, key: &str, n: usize) -> Result<Self> {
        let first = Conv::load(w, &format!("{key}.conv.0"), 2 * n, n, true)?;
        let first_x = first.weight.narrow(1, 0, n)?.contiguous()?;
        Ok(Self {
            convs: [
                first,
                Conv::load(w, &format!("{key}.conv.2"), n, n, true)?,
                Conv::load(w, &format!("{key}.conv.4"), n, n, true)?,
            ],
            first_x,
        })
    }

    /// `x [B·s, n, H, W]` holds `s` successive frames of each of `B` streams; `slot` the
    /// streams' previous frames `[B, n, H, W]` (`None`: fresh streams, a zero past).
    /// Returns the block's output for frames `live..s` of each stream (`[B·(s − live),
    /// …]`; the earlier ones feed nothing the caller keeps) and leaves each stream's last
    /// frame in `slot`. A fresh stream's frame 0 skips the zero past's products.
    fn forward(
        &self,
        x: &Tensor,
        s: usize,
        live: usize,
        slot: &mut Option<Tensor>,
        dtype: DType,
    ) -> Result<Tensor> {
        let [bs, ..] = *x.shape() else {
            unreachable!("frames are 4-D")
        };
        let b = bs / s;
        let zero_first = slot.is_none() && live == 0;
        // Frames whose past is a real frame: `full..s`.
        let full = live + usize::from(zero_first);
        let mut y = None;
        if full < s {
            let past = if full > 0 {
                frames_of(x, b, s, full - 1..s - 1)?
            } else {
                // The state may be narrower (bf16) than the frames: the conv rounds its
                // input to the weights' dtype anyway, so widening it changes no product.
                let prev = slot
                    .as_ref()
                    .map(|t| t.to_dtype(x.dtype()))
                    .transpose()?
                    .unwrap_or_else(|| unreachable!("full is 0 only with a state"));
                per_stream_cat(&prev, &frames_of(x, b, s, 0..s - 1)?, b)?
            };
            let input = Tensor::cat(&[&frames_of(x, b, s, full..s)?, &past], 1)?;
            drop(past);
            y = Some(self.convs[0].forward(&input)?);
        }
        if zero_first {
            let first = frames_of(x, b, s, 0..1)?;
            let y0 = first.conv2d(&self.first_x, self.convs[0].bias.as_ref(), [1, 1], [1, 1])?;
            y = Some(match y {
                Some(rest) => per_stream_cat(&y0, &rest, b)?,
                None => y0,
            });
        }
        let y = y.unwrap_or_else(|| unreachable!("live < s"));
        let y = self.convs[1].forward(&y.relu()?)?.relu()?;
        let y = self.convs[2]
            .forward(&y)?
            .add(&frames_of(x, b, s, live..s)?)?
            .relu()?;
        *slot = Some(frames_of(x, b, s, s - 1..s)?.copy_as(dtype)?);
        Ok(y)
    }
}

/// One stage: three memory blocks, ×2 upsample, `TGrow`, conv to the next width.
///
/// Run in an order with fewer products and the same sums: `TGrow` is a 1×1 conv, so it
/// runs before the nearest upsample (each upsampled pixel is a copy); and a 3×3 conv of
/// a ×2 nearest upsample is four 2×2 convs of the small image, one per output phase
/// (`phase`: [`phase_weights`]), 16/36 of the products. No upsampled tensor is made.
#[derive(Debug)]
struct Stage {
    blocks: Vec<MemBlock>,
    /// `TGrow`'s 1×1 weight `[n·stride, n, 1, 1]`.
    grow: Tensor,
    stride: usize,
    /// The conv's four phases, `[4·cout, cin, 2, 2]`, output channel `4c + 2a + b`.
    phase: Tensor,
}

/// The TAEHV decoder; immutable once loaded (streams keep their state themselves).
#[derive(Debug)]
pub struct TinyDecoder {
    id: u64,
    config: TinyConfig,
    first: Conv,
    stages: Vec<Stage>,
    last: Conv,
    device: Device,
    dtype: DType,
}

impl TinyDecoder {
    /// Builds the decoder from a store under TAEHV's keys (`decoder.{index}.…`, indexed
    /// as `taehv.py`'s Sequential of `config`'s stages).
    pub fn from_store(config: TinyConfig, w: &WeightStore) -> Result<Self> {
        config.validate()?;
        let n = &config.widths;
        let first = Conv::load(w, "decoder.1", config.latent_channels, n[0], true)?;
        let mut stages = Vec::with_capacity(config.stage_count());
        for (k, &stride) in config.time_strides.iter().enumerate() {
            let key = |offset| format!("decoder.{}", stage_layer(k, offset));
            let blocks = (0..MEM_BLOCKS)
                .map(|j| MemBlock::load(w, &key(j), n[k]))
                .collect::<Result<Vec<_>>>()?;
            let grow = load::grow_weight(w, &format!("{}.conv.weight", key(4)), n[k], stride)?;
            let conv = Conv::load(w, &key(5), n[k], n[k + 1], false)?;
            stages.push(Stage {
                blocks,
                grow,
                stride,
                phase: phase_weights(&conv.weight)?,
            });
        }
        let stage_count = config.stage_count();
        let last = Conv::load(
            w,
            &format!("decoder.{}", last_layer(stage_count)),
            n[stage_count],
            3 * config.patch * config.patch,
            true,
        )?;
        Ok(Self {
            id: crate::vae::next_decoder_id(),
            first,
            stages,
            last,
            device: w.device().clone(),
            dtype: w.dtype(),
            config,
        })
    }

    /// Loads a TAEHV file (`.pth` in f16 or f32, or `.safetensors`), its shapes read
    /// from the file, weights in `dtype` (f32 or bf16).
    pub fn load(path: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let (config, store) = load::open(path, device, dtype)?;
        Self::from_store(config, &store)
    }

    /// Seeded random weights for `config` (tests, plans without a file).
    pub fn seeded(config: TinyConfig, seed: u64, device: &Device, dtype: DType) -> Result<Self> {
        Self::from_store(config, &WeightStore::seeded(seed, device, dtype))
    }

    /// The shapes.
    pub fn config(&self) -> &TinyConfig {
        &self.config
    }

    /// A process-unique id (states remember which decoder they belong to).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dtype the weights (and the streams' state) are kept in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Memory-block slots a stream's state holds.
    pub fn slot_count(&self) -> usize {
        self.stages.len() * MEM_BLOCKS
    }

    /// The state dtype: bf16 state for a bf16 decoder (its convs round their inputs to
    /// bf16 anyway, so nothing is lost), else f32.
    pub fn state_dtype(&self) -> DType {
        if self.dtype == DType::BF16 {
            DType::BF16
        } else {
            DType::F32
        }
    }

    /// Decodes one latent frame of `B` streams, `z [B, C, h, w]`, against their stacked
    /// `slots` (one per memory block): frames `[B·f, 3, H, W]` in [0, 1], `f` successive
    /// frames per stream: the last `t_upscale − skip` of the frame's `t_upscale` (the
    /// first `skip` are dropped before the full-size layers; their memory-block inputs
    /// still reach the state).
    pub fn forward_frame(
        &self,
        z: &Tensor,
        slots: &mut [Option<Tensor>],
        skip: usize,
    ) -> Result<Tensor> {
        let dtype = self.state_dtype();
        let x = z.mul_scalar(1.0 / 3.0)?.tanh()?.mul_scalar(3.0)?;
        let mut x = self.first.forward(&x)?.relu()?;
        let mut frames = 1;
        let mut slot = 0;
        let last = self.stages.len() - 1;
        for (k, stage) in self.stages.iter().enumerate() {
            // Frames of the last stage whose outputs are all dropped need no last block.
            let dead = if k == last { skip / stage.stride } else { 0 };
            for (j, block) in stage.blocks.iter().enumerate() {
                let live = if j + 1 == stage.blocks.len() { dead } else { 0 };
                x = block.forward(&x, frames, live, &mut slots[slot], dtype)?;
                slot += 1;
            }
            let [bs, n, h, w] = *x.shape() else {
                unreachable!("frames are 4-D")
            };
            let b = bs / (frames - dead);
            x = x.conv2d(&stage.grow, None, [1, 1], [0, 0])?.reshape(&[
                bs * stage.stride,
                n,
                h,
                w,
            ])?;
            frames = (frames - dead) * stage.stride;
            let rest = skip - dead * stage.stride;
            if k == last && rest > 0 {
                x = x
                    .reshape(&[b, frames, n, h, w])?
                    .narrow(1, rest, frames - rest)?
                    .contiguous()?
                    .reshape(&[b * (frames - rest), n, h, w])?;
            }
            x = upsampled_conv(&x, &stage.phase)?;
        }
        let x = self.last.forward(&x.relu()?)?;
        let x = if self.config.patch > 1 {
            x.pixel_shuffle(self.config.patch)?
        } else {
            x
        };
        Ok(x.clamp(0.0, 1.0)?)
    }
}

/// Which rows of a 3×3 kernel land on each of a 2×2 kernel's rows, per output phase:
/// output row `2i + a` of a conv over a ×2 nearest upsample reads upsampled rows
/// `2i + a − 1 … 2i + a + 1`, which are small rows `i − 1, i, i` (phase 0) or
/// `i, i, i + 1` (phase 1).
const PHASE_TAPS: [[&[usize]; 2]; 2] = [[&[0], &[1, 2]], [&[0, 1], &[2]]];

/// A 3×3 conv weight `[cout, cin, 3, 3]` as the four 2×2 convs of its phases over the
/// small image, `[4·cout, cin, 2, 2]` with output channel `4c + 2a + b` for output row
/// phase `a` and column phase `b` (summed in f32, then held in the weight's dtype).
fn phase_weights(weight: &Tensor) -> Result<Tensor> {
    let [cout, cin, 3, 3] = *weight.shape() else {
        unreachable!("loaded as [cout, cin, 3, 3]")
    };
    let shape = [4 * cout, cin, 2, 2];
    if weight.device().is_meta() {
        return Ok(Tensor::zeros(&shape, weight.dtype(), weight.device())?);
    }
    let w = weight.to_f32_vec()?;
    let mut out = vec![0f32; 4 * cout * cin * 4];
    for c in 0..cout {
        for ci in 0..cin {
            let src = &w[(c * cin + ci) * 9..][..9];
            for (a, rows) in PHASE_TAPS.iter().enumerate() {
                for (b, cols) in PHASE_TAPS.iter().enumerate() {
                    let dst = (((4 * c + 2 * a + b) * cin) + ci) * 4;
                    for ty in 0..2 {
                        for tx in 0..2 {
                            out[dst + 2 * ty + tx] = rows[ty]
                                .iter()
                                .flat_map(|&ky| cols[tx].iter().map(move |&kx| src[3 * ky + kx]))
                                .sum();
                        }
                    }
                }
            }
        }
    }
    Ok(Tensor::from_slice(&out, &shape, weight.device())?.to_dtype(weight.dtype())?)
}

/// `conv3×3(upsample_nearest2x(x))` without bias from the conv's phase weights: one
/// 2×2 conv of `x [n, cin, h, w]` with padding 1 (`[n, 4·cout, h + 1, w + 1]`), phase
/// `(a, b)` read at offset `(a, b)`, interleaved into `[n, cout, 2h, 2w]`.
fn upsampled_conv(x: &Tensor, phase: &Tensor) -> Result<Tensor> {
    let [n, _, h, w] = *x.shape() else {
        unreachable!("frames are 4-D")
    };
    let cout = phase.shape()[0] / 4;
    let y = x
        .conv2d(phase, None, [1, 1], [1, 1])?
        .reshape(&[n, cout, 4, h + 1, w + 1])?;
    let parts = (0..4)
        .map(|p| {
            let (a, b) = (p / 2, p % 2);
            y.narrow(2, p, 1)?.narrow(3, a, h)?.narrow(4, b, w)
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let phases = Tensor::cat(&parts.iter().collect::<Vec<_>>(), 2)?;
    drop((parts, y));
    Ok(phases.reshape(&[n, 4 * cout, h, w])?.pixel_shuffle(2)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_indices_follow_taehv_py_sequential_for_any_stage_count() {
        // taehv.py's three stages: memory blocks 3–5, TGrow 7, conv 8; … conv 20; last 22.
        assert_eq!(
            (stage_layer(0, 0), stage_layer(0, 4), stage_layer(0, 5)),
            (3, 7, 8)
        );
        assert_eq!((stage_layer(2, 0), stage_layer(2, 5)), (15, 20));
        assert_eq!(last_layer(3), 22);
        // Two stages: TGrows 7 and 13, convs 8 and 14, a ReLU at 15, the last conv 16.
        assert_eq!(
            (stage_layer(1, 4), stage_layer(1, 5), last_layer(2)),
            (13, 14, 16)
        );
        assert_eq!(last_layer(1), 10);
    }

    #[test]
    fn factors_and_state_follow_the_stage_count() {
        let two = TinyConfig {
            widths: vec![12, 8, 6],
            time_strides: vec![2, 2],
            ..TinyConfig::taew2_1()
        };
        two.validate().unwrap();
        assert_eq!(
            (two.stage_count(), two.spatial_factor(), two.t_upscale()),
            (2, 4, 4)
        );
        // Stage 0 at the latent size, stage 1 at twice it: 3 blocks each.
        let (h, w) = (5, 7);
        assert_eq!(
            two.state_bytes(4 * h, 4 * w, DType::F32),
            (3 * 4 * (12 * h * w + 8 * 4 * h * w)) as u64
        );
        let one = TinyDecoder::seeded(two, 1, &Device::cpu().unwrap(), DType::F32).unwrap();
        assert_eq!(one.slot_count(), 6);
        let released = TinyConfig::taew2_1();
        assert_eq!((released.stage_count(), released.spatial_factor()), (3, 8));
        assert_eq!(released.t_upscale(), 4);
    }

    #[test]
    fn configs_out_of_bounds_are_refused_naming_the_field() {
        let base = TinyConfig::taew2_1();
        let nine = TinyConfig {
            widths: vec![4; 10],
            time_strides: vec![1; 9],
            ..base.clone()
        };
        assert!(nine
            .validate()
            .unwrap_err()
            .to_string()
            .contains("time_strides"));
        let short = TinyConfig {
            widths: vec![4; 3],
            ..base.clone()
        };
        assert!(short.validate().unwrap_err().to_string().contains("widths"));
        let long_time = TinyConfig {
            time_strides: vec![4, 4, 2],
            ..base
        };
        assert!(long_time
            .validate()
            .unwrap_err()
            .to_string()
            .contains("at most 16"));
    }
}
