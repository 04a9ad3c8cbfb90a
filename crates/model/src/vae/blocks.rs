//! The VAE's layers (WAN.md §2.2–2.7): causal conv3d with its 2-frame cache, channel RMS
//! norm, residual and attention blocks, temporal/spatial resampling.
//!
//! Caches live outside the layers, in a slot list owned by the caller (a streaming
//! session), so the shared network is never mutated by a decode. Each cached layer owns
//! one slot index, assigned in forward order at construction.

use headroom_tensor::kernels::resample::PadMode;
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::ops::conv::{Conv3dOptions, TimePad};
use headroom_tensor::{DType, Tensor};

use crate::error::Result;
use crate::weights::{Init, WeightStore};

/// Per-session cache slots (one per cached layer) and the dtype they are kept in.
#[derive(Debug)]
pub struct Slots<'a> {
    /// One entry per cached layer.
    pub slots: &'a mut [Option<Tensor>],
    /// Storage dtype of cached frames.
    pub dtype: DType,
}

/// Hands out slot indices in forward order while a network is built.
#[derive(Debug, Default)]
pub struct SlotCounter(pub usize);

impl SlotCounter {
    fn next(&mut self) -> usize {
        self.0 += 1;
        self.0 - 1
    }
}

/// Copies `count` trailing frames of `x [B, C, T, H, W]` into a compact block (a view
/// would keep the whole input alive).
fn last_frames(x: &Tensor, count: usize, dtype: DType) -> Result<Tensor> {
    let t = x.shape()[2];
    Ok(x.narrow(2, t - count, count)?.copy_as(dtype)?)
}

/// `CausalConv3d`: zero padding moved in front of time; with a cache slot, the slot's
/// frames stand in for the zeros (WAN.md §2.2, §2.9B).
#[derive(Debug)]
pub struct CausalConv3d {
    weight: Tensor,
    bias: Tensor,
    front: usize,
    pad_hw: [usize; 2],
    stride: [usize; 3],
    slot: Option<usize>,
}

impl CausalConv3d {
    /// Loads `{prefix}.weight` `[cout, cin, k…]` and `{prefix}.bias`; a conv with time
    /// padding gets a cache slot.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        w: &WeightStore,
        prefix: &str,
        cin: usize,
        cout: usize,
        kernel: [usize; 3],
        padding: [usize; 3],
        stride: [usize; 3],
        slots: &mut SlotCounter,
    ) -> Result<Self> {
        let weight = w.get(
            &format!("{prefix}.weight"),
            &[cout, cin, kernel[0], kernel[1], kernel[2]],
            Init::FanIn,
        )?;
        let bias = w.get_as(
            &format!("{prefix}.bias"),
            &[cout],
            Init::Scaled(0.05),
            DType::F32,
        )?;
        let front = 2 * padding[0];
        Ok(Self {
            weight,
            bias,
            front,
            pad_hw: [padding[1], padding[2]],
            stride,
            slot: (front > 0).then(|| slots.next()),
        })
    }

    /// The VAE's common conv: 3×3×3, causal padding 1, stride 1, cached.
    pub fn load_3x3x3(
        w: &WeightStore,
        prefix: &str,
        cin: usize,
        cout: usize,
        slots: &mut SlotCounter,
    ) -> Result<Self> {
        Self::load(w, prefix, cin, cout, [3, 3, 3], [1, 1, 1], [1, 1, 1], slots)
    }

    /// Runs the conv; a cached conv prepends its slot's frames and keeps the last `front`
    /// frames of its input for the next chunk.
    ///
    /// A slot holds only the real frames seen so far: fewer than `front` in a stream's
    /// first chunks, the missing ones standing for leading zeros (as in Wan's own
    /// cache), and an empty slot for `front` zeros. Those zeros go to the conv as zero
    /// time padding, whose taps the kernel does not compute (a third of the first
    /// chunk's work at full resolution, where Wan's decoder multiplies them); every
    /// chunking of a stream meets the same zeros at the same frames, so it gives the same
    /// bytes.
    pub fn forward(&self, x: &Tensor, cache: &mut Slots<'_>) -> Result<Tensor> {
        let mut options = Conv3dOptions {
            stride: self.stride,
            pad_t_front: 0,
            time_pad: TimePad::Zeros,
            pad_hw: self.pad_hw,
        };
        let Some(slot) = self.slot else {
            return Ok(x.conv3d(&self.weight, Some(&self.bias), options)?);
        };
        let previous = cache.slots[slot].take();
        let held = previous.as_ref().map_or(0, |p| p.shape()[2]);
        let joined = match previous {
            Some(frames) => Tensor::cat(&[&frames.to_dtype(DType::F32)?, x], 2)?,
            None => x.clone(),
        };
        // The last `front` frames, or all of them while fewer were seen.
        let keep = (held + x.shape()[2]).min(self.front);
        cache.slots[slot] = Some(last_frames(&joined, keep, cache.dtype)?);
        options.pad_t_front = self.front - held;
        Ok(joined.conv3d(&self.weight, Some(&self.bias), options)?)
    }

    /// Output channels.
    pub fn out_channels(&self) -> usize {
        self.weight.shape()[0]
    }

    /// The cache slot and the frames × channels it holds, if cached.
    pub fn cache_frames(&self) -> Option<(usize, usize, usize)> {
        self.slot.map(|s| (s, self.front, self.weight.shape()[1]))
    }
}

/// Wan's channel RMS norm (`gamma` only).
#[derive(Debug)]
pub struct ChannelRms {
    gamma: Tensor,
}

impl ChannelRms {
    /// Loads `{prefix}.gamma` of `shape` (`[C,1,1,1]` or `[C,1,1]`).
    pub fn load(w: &WeightStore, prefix: &str, shape: &[usize]) -> Result<Self> {
        Ok(Self {
            gamma: w.get_as(&format!("{prefix}.gamma"), shape, Init::NearOne, DType::F32)?,
        })
    }

    /// Normalises over axis 1.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.rms_norm_channels(&self.gamma)?)
    }

    /// `silu(forward(x))` in one pass (the same bits).
    pub fn forward_silu(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.rms_norm_channels_silu(&self.gamma)?)
    }
}

/// `WanResidualBlock(in → out)`.
#[derive(Debug)]
pub struct ResidualBlock {
    norm1: ChannelRms,
    conv1: CausalConv3d,
    norm2: ChannelRms,
    conv2: CausalConv3d,
    shortcut: Option<CausalConv3d>,
}

impl ResidualBlock {
    /// Loads the block at `prefix`.
    pub fn load(
        w: &WeightStore,
        prefix: &str,
        cin: usize,
        cout: usize,
        slots: &mut SlotCounter,
    ) -> Result<Self> {
        Ok(Self {
            norm1: ChannelRms::load(w, &format!("{prefix}.norm1"), &[cin, 1, 1, 1])?,
            conv1: CausalConv3d::load_3x3x3(w, &format!("{prefix}.conv1"), cin, cout, slots)?,
            norm2: ChannelRms::load(w, &format!("{prefix}.norm2"), &[cout, 1, 1, 1])?,
            conv2: CausalConv3d::load_3x3x3(w, &format!("{prefix}.conv2"), cout, cout, slots)?,
            shortcut: (cin != cout)
                .then(|| {
                    CausalConv3d::load(
                        w,
                        &format!("{prefix}.conv_shortcut"),
                        cin,
                        cout,
                        [1, 1, 1],
                        [0, 0, 0],
                        [1, 1, 1],
                        slots,
                    )
                })
                .transpose()?,
        })
    }

    /// `conv2(silu(rms(conv1(silu(rms(x)))))) + shortcut(x)`.
    pub fn forward(&self, x: &Tensor, cache: &mut Slots<'_>) -> Result<Tensor> {
        let h = match &self.shortcut {
            Some(conv) => conv.forward(x, cache)?,
            None => x.clone(),
        };
        let y = self.norm1.forward_silu(x)?;
        let y = self.conv1.forward(&y, cache)?;
        let y = self.norm2.forward_silu(&y)?;
        let y = self.conv2.forward(&y, cache)?;
        Ok(y.add(&h)?)
    }

    /// The cached convs, in forward order.
    pub fn convs(&self) -> [&CausalConv3d; 2] {
        [&self.conv1, &self.conv2]
    }
}

/// `[B, C, T, H, W]` → `[B·T, C, H, W]` (frame-major).
fn frames_of(x: &Tensor) -> Result<Tensor> {
    let [b, c, t, h, w] = *x.shape() else {
        unreachable!("the VAE only passes 5-D tensors")
    };
    Ok(x.permute(&[0, 2, 1, 3, 4])?.reshape(&[b * t, c, h, w])?)
}

/// `[B·T, C, H, W]` → `[B, C, T, H, W]`.
fn video_of(f: &Tensor, b: usize, t: usize) -> Result<Tensor> {
    let [_, c, h, w] = *f.shape() else {
        unreachable!("frames are 4-D")
    };
    Ok(f.reshape(&[b, t, c, h, w])?
        .permute(&[0, 2, 1, 3, 4])?
        .contiguous()?)
}

/// `WanAttentionBlock`: per-frame single-head spatial self-attention.
#[derive(Debug)]
pub struct AttentionBlock {
    norm: ChannelRms,
    qkv_w: Tensor,
    qkv_b: Tensor,
    proj_w: Tensor,
    proj_b: Tensor,
}

impl AttentionBlock {
    /// Loads the block at `prefix` for `dim` channels.
    pub fn load(w: &WeightStore, prefix: &str, dim: usize) -> Result<Self> {
        Ok(Self {
            norm: ChannelRms::load(w, &format!("{prefix}.norm"), &[dim, 1, 1])?,
            qkv_w: w.get(
                &format!("{prefix}.to_qkv.weight"),
                &[3 * dim, dim, 1, 1],
                Init::FanIn,
            )?,
            qkv_b: w.get_as(
                &format!("{prefix}.to_qkv.bias"),
                &[3 * dim],
                Init::Scaled(0.05),
                DType::F32,
            )?,
            proj_w: w.get(
                &format!("{prefix}.proj.weight"),
                &[dim, dim, 1, 1],
                Init::FanIn,
            )?,
            proj_b: w.get_as(
                &format!("{prefix}.proj.bias"),
                &[dim],
                Init::Scaled(0.05),
                DType::F32,
            )?,
        })
    }

    /// `x + proj(attention(qkv(rms(x))))`, frame by frame.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [b, c, t, h, w] = *x.shape() else {
            unreachable!("the VAE only passes 5-D tensors")
        };
        let f = self.norm.forward(&frames_of(x)?)?;
        let qkv = f.conv2d(&self.qkv_w, Some(&self.qkv_b), [1, 1], [0, 0])?;
        let tokens = qkv
            .reshape(&[b * t, 3 * c, h * w])?
            .transpose(1, 2)?
            .contiguous()?;
        let part = |i: usize| -> Result<Tensor> { Ok(tokens.narrow(2, i * c, c)?.unsqueeze(2)?) };
        let o = Tensor::scaled_dot_product_attention_in(
            &part(0)?,
            &part(1)?,
            &part(2)?,
            Mask::None,
            None,
            crate::compute_for(self.qkv_w.dtype()),
        )?;
        let o = o
            .reshape(&[b * t, h * w, c])?
            .transpose(1, 2)?
            .reshape(&[b * t, c, h, w])?;
        let o = o.conv2d(&self.proj_w, Some(&self.proj_b), [1, 1], [0, 0])?;
        Ok(video_of(&o, b, t)?.add(x)?)
    }
}

/// What a resample layer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResampleMode {
    /// Spatial ×½.
    Down2d,
    /// Spatial ×½ then temporal ×½.
    Down3d,
    /// Spatial ×2 (channels halve).
    Up2d,
    /// Temporal ×2 then spatial ×2 (channels halve).
    Up3d,
}

/// `WanResample` (WAN.md §2.7).
#[derive(Debug)]
pub struct Resample {
    mode: ResampleMode,
    conv_w: Tensor,
    conv_b: Tensor,
    time_conv: Option<CausalConv3d>,
    slot: Option<usize>,
}

impl Resample {
    /// Loads the resample layer at `prefix` for `dim` channels.
    pub fn load(
        w: &WeightStore,
        prefix: &str,
        dim: usize,
        mode: ResampleMode,
        slots: &mut SlotCounter,
    ) -> Result<Self> {
        let up = matches!(mode, ResampleMode::Up2d | ResampleMode::Up3d);
        let out = if up { dim / 2 } else { dim };
        let (time_conv, slot) = match mode {
            ResampleMode::Up3d => (
                Some(CausalConv3d::load(
                    w,
                    &format!("{prefix}.time_conv"),
                    dim,
                    2 * dim,
                    [3, 1, 1],
                    [1, 0, 0],
                    [1, 1, 1],
                    slots,
                )?),
                None,
            ),
            ResampleMode::Down3d => {
                let conv = CausalConv3d::load(
                    w,
                    &format!("{prefix}.time_conv"),
                    dim,
                    dim,
                    [3, 1, 1],
                    [0, 0, 0],
                    [2, 1, 1],
                    slots,
                )?;
                (Some(conv), Some(slots.next()))
            }
            _ => (None, None),
        };
        Ok(Self {
            mode,
            conv_w: w.get(
                &format!("{prefix}.resample.1.weight"),
                &[out, dim, 3, 3],
                Init::FanIn,
            )?,
            conv_b: w.get_as(
                &format!("{prefix}.resample.1.bias"),
                &[out],
                Init::Scaled(0.05),
                DType::F32,
            )?,
            time_conv,
            slot,
        })
    }

    /// The cached time conv of an upsampler (its slot doubles as the "first chunk seen"
    /// marker: empty until the first chunk passed).
    pub fn time_conv(&self) -> Option<&CausalConv3d> {
        self.time_conv.as_ref()
    }

    /// The downsampler's slot (it keeps the last frame).
    pub fn down_slot(&self) -> Option<usize> {
        self.slot
    }

    /// Resamples one chunk.
    pub fn forward(&self, x: &Tensor, cache: &mut Slots<'_>) -> Result<Tensor> {
        let [b, _, _, _, _] = *x.shape() else {
            unreachable!("the VAE only passes 5-D tensors")
        };
        match self.mode {
            ResampleMode::Up2d => self.up_spatial(x, b),
            ResampleMode::Up3d => {
                let conv = self.time_conv.as_ref().expect("up3d has a time conv");
                let (slot, _, _) = conv.cache_frames().expect("the up3d time conv is cached");
                let doubled = if cache.slots[slot].is_none() {
                    // First chunk: frame 0 passes through undoubled; the slot now holds
                    // the zero frames that diffusers' "Rep" marker stands for.
                    let [b, c, _, h, w] = *x.shape() else {
                        unreachable!()
                    };
                    cache.slots[slot] =
                        Some(Tensor::zeros(&[b, c, 2, h, w], cache.dtype, x.device())?);
                    x.clone()
                } else {
                    let r = conv.forward(x, cache)?;
                    let [b, c2, t, h, w] = *r.shape() else {
                        unreachable!()
                    };
                    let c = c2 / 2;
                    // Channel block s of r is sub-frame s: x[:, c, 2i + s] = r[:, s·C + c, i].
                    r.reshape(&[b, 2, c, t, h, w])?
                        .permute(&[0, 2, 3, 1, 4, 5])?
                        .reshape(&[b, c, 2 * t, h, w])?
                };
                self.up_spatial(&doubled, b)
            }
            ResampleMode::Down2d => self.down_spatial(x, b),
            ResampleMode::Down3d => {
                let y = self.down_spatial(x, b)?;
                let slot = self.slot.expect("down3d has a slot");
                match cache.slots[slot].take() {
                    None => {
                        cache.slots[slot] = Some(last_frames(&y, 1, cache.dtype)?);
                        Ok(y)
                    }
                    Some(prev) => {
                        let joined = Tensor::cat(&[&prev.to_dtype(DType::F32)?, &y], 2)?;
                        cache.slots[slot] = Some(last_frames(&y, 1, cache.dtype)?);
                        let conv = self.time_conv.as_ref().expect("down3d has a time conv");
                        conv.forward(&joined, cache)
                    }
                }
            }
        }
    }

    fn up_spatial(&self, x: &Tensor, b: usize) -> Result<Tensor> {
        let t = x.shape()[2];
        let f = frames_of(x)?.upsample_nearest2x()?;
        let f = f.conv2d(&self.conv_w, Some(&self.conv_b), [1, 1], [1, 1])?;
        video_of(&f, b, t)
    }

    fn down_spatial(&self, x: &Tensor, b: usize) -> Result<Tensor> {
        let t = x.shape()[2];
        // ZeroPad2d((0, 1, 0, 1)): right and bottom only.
        let f = frames_of(x)?.pad(&[(0, 0), (0, 0), (0, 1), (0, 1)], PadMode::Zeros)?;
        let f = f.conv2d(&self.conv_w, Some(&self.conv_b), [2, 2], [0, 0])?;
        video_of(&f, b, t)
    }
}

/// `WanMidBlock`: residual → attention → residual.
#[derive(Debug)]
pub struct MidBlock {
    res0: ResidualBlock,
    attn: AttentionBlock,
    res1: ResidualBlock,
}

impl MidBlock {
    /// Loads the mid block at `prefix`.
    pub fn load(
        w: &WeightStore,
        prefix: &str,
        dim: usize,
        slots: &mut SlotCounter,
    ) -> Result<Self> {
        Ok(Self {
            res0: ResidualBlock::load(w, &format!("{prefix}.resnets.0"), dim, dim, slots)?,
            attn: AttentionBlock::load(w, &format!("{prefix}.attentions.0"), dim)?,
            res1: ResidualBlock::load(w, &format!("{prefix}.resnets.1"), dim, dim, slots)?,
        })
    }

    /// Runs the three layers.
    pub fn forward(&self, x: &Tensor, cache: &mut Slots<'_>) -> Result<Tensor> {
        let x = self.res0.forward(x, cache)?;
        let x = self.attn.forward(&x)?;
        self.res1.forward(&x, cache)
    }

    /// The residual blocks.
    pub fn resnets(&self) -> [&ResidualBlock; 2] {
        [&self.res0, &self.res1]
    }
}
