//! `Encoder3d` and `Decoder3d` (WAN.md §2.8), run one temporal chunk at a time against a
//! caller-owned list of cache slots.

use headroom_tensor::Tensor;

use super::blocks::{
    AttentionBlock, CausalConv3d, ChannelRms, MidBlock, Resample, ResampleMode, ResidualBlock,
    SlotCounter, Slots,
};
use super::config::VaeConfig;
use crate::error::Result;
use crate::weights::WeightStore;

/// One entry of the encoder's flat `down_blocks` list.
#[derive(Debug)]
enum DownLayer {
    Res(Box<ResidualBlock>),
    Attn(Box<AttentionBlock>),
    Resample(Box<Resample>),
}

/// The encoder: video `[B, 3, T, H, W]` → `[B, 2·z_dim, T', H/s, W/s]` (before quant_conv).
#[derive(Debug)]
pub struct Encoder {
    conv_in: CausalConv3d,
    down: Vec<DownLayer>,
    mid: MidBlock,
    norm_out: ChannelRms,
    conv_out: CausalConv3d,
    slots: usize,
}

impl Encoder {
    /// Loads `encoder.*`.
    pub fn load(w: &WeightStore, config: &VaeConfig) -> Result<Self> {
        let mut slots = SlotCounter::default();
        let dims = config.enc_dims();
        let conv_in = CausalConv3d::load_3x3x3(
            w,
            "encoder.conv_in",
            config.in_channels,
            dims[0],
            &mut slots,
        )?;
        let mut down = Vec::new();
        let mut scale = 1.0f64;
        let stages = config.dim_mult.len();
        for s in 0..stages {
            let (mut cin, cout) = (dims[s], dims[s + 1]);
            for _ in 0..config.num_res_blocks {
                let prefix = format!("encoder.down_blocks.{}", down.len());
                let block = ResidualBlock::load(w, &prefix, cin, cout, &mut slots)?;
                down.push(DownLayer::Res(Box::new(block)));
                if config.attn_scales.contains(&scale) {
                    let prefix = format!("encoder.down_blocks.{}", down.len());
                    down.push(DownLayer::Attn(Box::new(AttentionBlock::load(
                        w, &prefix, cout,
                    )?)));
                }
                cin = cout;
            }
            if s != stages - 1 {
                let mode = if config.temperal_downsample[s] {
                    ResampleMode::Down3d
                } else {
                    ResampleMode::Down2d
                };
                let prefix = format!("encoder.down_blocks.{}", down.len());
                let resample = Resample::load(w, &prefix, cout, mode, &mut slots)?;
                down.push(DownLayer::Resample(Box::new(resample)));
                scale /= 2.0;
            }
        }
        let last = *dims.last().expect("enc_dims is never empty");
        let mid = MidBlock::load(w, "encoder.mid_block", last, &mut slots)?;
        let norm_out = ChannelRms::load(w, "encoder.norm_out", &[last, 1, 1, 1])?;
        let conv_out =
            CausalConv3d::load_3x3x3(w, "encoder.conv_out", last, 2 * config.z_dim, &mut slots)?;
        Ok(Self {
            conv_in,
            down,
            mid,
            norm_out,
            conv_out,
            slots: slots.0,
        })
    }

    /// Number of cache slots a session needs.
    pub fn slot_count(&self) -> usize {
        self.slots
    }

    /// Encodes one chunk.
    pub fn forward(&self, x: &Tensor, cache: &mut Slots<'_>) -> Result<Tensor> {
        let mut x = self.conv_in.forward(x, cache)?;
        for layer in &self.down {
            x = match layer {
                DownLayer::Res(r) => r.forward(&x, cache)?,
                DownLayer::Attn(a) => a.forward(&x)?,
                DownLayer::Resample(r) => r.forward(&x, cache)?,
            };
        }
        let x = self.mid.forward(&x, cache)?;
        let x = self.norm_out.forward_silu(&x)?;
        self.conv_out.forward(&x, cache)
    }
}

/// One `up_blocks.i`: residual blocks and an optional upsampler.
#[derive(Debug)]
struct UpBlock {
    resnets: Vec<ResidualBlock>,
    upsampler: Option<Resample>,
}

/// The decoder: `[B, z_dim, T, h, w]` → `[B, 3, T', h·s, w·s]` (before the clamp).
#[derive(Debug)]
pub struct Decoder {
    conv_in: CausalConv3d,
    mid: MidBlock,
    up: Vec<UpBlock>,
    norm_out: ChannelRms,
    conv_out: CausalConv3d,
    slots: usize,
}

impl Decoder {
    /// Loads `decoder.*`.
    pub fn load(w: &WeightStore, config: &VaeConfig) -> Result<Self> {
        let mut slots = SlotCounter::default();
        let dims = config.dec_dims();
        let conv_in =
            CausalConv3d::load_3x3x3(w, "decoder.conv_in", config.z_dim, dims[0], &mut slots)?;
        let mid = MidBlock::load(w, "decoder.mid_block", dims[0], &mut slots)?;
        let stages = config.dim_mult.len();
        let temporal = config.temperal_upsample();
        let mut up = Vec::new();
        for i in 0..stages {
            let (cin0, cout) = (if i == 0 { dims[0] } else { dims[i] / 2 }, dims[i + 1]);
            let mut resnets = Vec::new();
            let mut cin = cin0;
            for r in 0..=config.num_res_blocks {
                let prefix = format!("decoder.up_blocks.{i}.resnets.{r}");
                resnets.push(ResidualBlock::load(w, &prefix, cin, cout, &mut slots)?);
                cin = cout;
            }
            let upsampler = (i != stages - 1)
                .then(|| {
                    let mode = if temporal[i] {
                        ResampleMode::Up3d
                    } else {
                        ResampleMode::Up2d
                    };
                    Resample::load(
                        w,
                        &format!("decoder.up_blocks.{i}.upsamplers.0"),
                        cout,
                        mode,
                        &mut slots,
                    )
                })
                .transpose()?;
            up.push(UpBlock { resnets, upsampler });
        }
        let last = *dims.last().expect("dec_dims is never empty");
        let norm_out = ChannelRms::load(w, "decoder.norm_out", &[last, 1, 1, 1])?;
        let conv_out =
            CausalConv3d::load_3x3x3(w, "decoder.conv_out", last, config.out_channels, &mut slots)?;
        Ok(Self {
            conv_in,
            mid,
            up,
            norm_out,
            conv_out,
            slots: slots.0,
        })
    }

    /// Number of cache slots a session needs.
    pub fn slot_count(&self) -> usize {
        self.slots
    }

    /// Decodes one chunk of latent frames (already through post_quant_conv).
    pub fn forward(&self, x: &Tensor, cache: &mut Slots<'_>) -> Result<Tensor> {
        let x = self.conv_in.forward(x, cache)?;
        let mut x = self.mid.forward(&x, cache)?;
        for block in &self.up {
            for r in &block.resnets {
                x = r.forward(&x, cache)?;
            }
            if let Some(u) = &block.upsampler {
                x = u.forward(&x, cache)?;
            }
        }
        let x = self.norm_out.forward_silu(&x)?;
        self.conv_out.forward(&x, cache)
    }

    /// Every cached slot as (frames, channels, spatial scale relative to the latent grid),
    /// for the declared state size.
    pub fn slot_layout(&self) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        let mut scale = 1;
        let mut push = |conv: &CausalConv3d, scale: usize| {
            if let Some((_, frames, channels)) = conv.cache_frames() {
                out.push((frames, channels, scale));
            }
        };
        push(&self.conv_in, scale);
        for r in self.mid.resnets() {
            r.convs().into_iter().for_each(|c| push(c, scale));
        }
        for block in &self.up {
            for r in &block.resnets {
                r.convs().into_iter().for_each(|c| push(c, scale));
            }
            if let Some(u) = &block.upsampler {
                if let Some(t) = u.time_conv() {
                    push(t, scale);
                }
                scale *= 2;
            }
        }
        push(&self.conv_out, scale);
        out
    }
}
