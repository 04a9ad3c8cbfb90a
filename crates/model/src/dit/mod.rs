//! The Wan transformer (`WanTransformer3DModel`, diffusers 0.42.1; WAN.md §3): patch
//! embedding, condition embedder, blocks with 3-axis RoPE, final modulation, unpatchify.
//! [`WanTransformer::forward_tokens`] takes earlier frames' keys/values, the building
//! block of block-causal generation with a KV cache.

pub mod block;
pub mod config;
pub mod embed;
pub mod shard;

use std::path::Path;
use std::sync::{Arc, RwLock};

use headroom_tensor::kernels::rope::RopeTable;
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::ops::conv::{Conv3dOptions, TimePad};
use headroom_tensor::{DType, Device, Tensor};

pub use block::{KeyValues, Segment, TextKeyValues};
pub use config::DitConfig;
pub use shard::Sharding;

use crate::error::{ModelError, Result};
use crate::weights::{read_config, Init, WeightStore};
use block::Block;
use embed::{ConditionEmbedder, Linear};

/// The camera adapter's shared part (STEPWISE A9): ray patches → tokens.
#[derive(Debug)]
struct CameraEmbedder {
    /// The rays' fold `s` (the VAE's spatial factor): `6·s²` channels per latent cell.
    fold: usize,
    patch: Linear,
    layer1: Linear,
    layer2: Linear,
}

/// Wan's rotary base.
const ROPE_THETA: f64 = 10_000.0;

/// The Wan transformer; immutable once loaded.
#[derive(Debug)]
pub struct WanTransformer {
    camera: Option<CameraEmbedder>,
    config: DitConfig,
    patch_w: Tensor,
    patch_b: Tensor,
    embedder: ConditionEmbedder,
    blocks: Vec<Block>,
    table_out: Tensor,
    proj_out: Linear,
    /// The rotary tables: `rope_max_seq_len` positions per axis at load, doubled when a
    /// forward's frame index goes beyond (a session streamed past 1024 latent frames).
    rope: RwLock<Arc<RopeTable>>,
    device: Device,
    shard: Option<Sharding>,
}

/// One session's part of a batched forward ([`WanTransformer::forward_batch`]).
#[derive(Debug, Clone, Copy)]
pub struct BatchItem<'a> {
    /// Its tokens `[1, L, dim]` (from [`WanTransformer::embed`]).
    pub tokens: &'a Tensor,
    /// RoPE positions of its tokens.
    pub positions: &'a [[usize; 3]],
    /// Its timestep.
    pub t: f32,
    /// Its cross-attention keys/values.
    pub text: &'a TextKeyValues,
    /// Each block's keys/values of its earlier tokens.
    pub past: Option<&'a [KeyValues]>,
    /// Its camera tokens `[1, L, dim]` (all items or none).
    pub camera: Option<&'a Tensor>,
}

/// Grid of latent tokens: frames × rows × columns after patching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenGrid {
    /// Frames (F / pt).
    pub frames: usize,
    /// Rows (H / ph).
    pub rows: usize,
    /// Columns (W / pw).
    pub cols: usize,
}

impl TokenGrid {
    /// Tokens per frame.
    pub fn per_frame(&self) -> usize {
        self.rows * self.cols
    }

    /// RoPE positions of every token, frames counted from `first_frame`.
    pub fn positions(&self, first_frame: usize) -> Vec<[usize; 3]> {
        let mut out = Vec::with_capacity(self.frames * self.per_frame());
        for f in 0..self.frames {
            for y in 0..self.rows {
                for x in 0..self.cols {
                    out.push([first_frame + f, y, x]);
                }
            }
        }
        out
    }
}

/// The fold of a checkpoint's camera adapter, read from its patch embedding's width
/// `6·s²·pt·ph·pw` (8, LingBot's, where the store has no shapes).
fn camera_fold(w: &WeightStore, config: &DitConfig) -> Result<usize> {
    let key = "patch_embedding_wancamctrl.weight";
    let Some(shape) = w.shape_of(key) else {
        return Ok(8);
    };
    let patch: usize = config.patch_size.iter().product();
    let width = shape.get(1).copied().unwrap_or(0);
    let cells = width / (6 * patch);
    let fold = (1..=64).find(|s| s * s >= cells).unwrap_or(0);
    if shape.len() != 2 || fold * fold != cells || cells * 6 * patch != width {
        return Err(ModelError::config(
            key,
            format!(
                "{shape:?} must be [dim, 6·s²·{patch}] (rays folded s×s, patch {:?})",
                config.patch_size
            ),
        ));
    }
    Ok(fold)
}

impl WanTransformer {
    /// Builds the network from a weight store.
    pub fn from_store(config: DitConfig, w: &WeightStore) -> Result<Self> {
        Self::from_store_sharded(config, w, None)
    }

    /// Builds this rank's part of the network from a weight store (the whole network
    /// when `shard` is `None`); see [`shard`] for what each rank holds.
    pub fn from_store_sharded(
        config: DitConfig,
        w: &WeightStore,
        shard: Option<Sharding>,
    ) -> Result<Self> {
        config.validate()?;
        // ComfyUI's fp8-scaled files mark themselves with an empty tensor.
        w.accept("scaled_fp8");
        if let Some(s) = &shard {
            let (tp, sp) = (s.tp.size(), s.sp.size());
            if !config.num_attention_heads.is_multiple_of(tp * sp)
                || !config.ffn_dim.is_multiple_of(tp)
            {
                return Err(ModelError::input(
                    "sharding",
                    format!(
                        "{} heads must divide by tp·sp = {} and ffn_dim {} by tp = {tp}",
                        config.num_attention_heads,
                        tp * sp,
                        config.ffn_dim
                    ),
                ));
            }
        }
        let dim = config.dim();
        let [pt, ph, pw] = config.patch_size;
        let out = config.out_channels();
        // A checkpoint without camera weights is plain Wan (the adapter's zero init).
        let with_camera = w.has("patch_embedding_wancamctrl.weight");
        let camera = if with_camera {
            let fold = camera_fold(w, &config)?;
            Some(CameraEmbedder {
                fold,
                patch: Linear::load(
                    w,
                    "patch_embedding_wancamctrl",
                    6 * fold * fold * ph * pw * pt,
                    dim,
                    None,
                )?,
                layer1: Linear::load(w, "c2ws_hidden_states_layer1", dim, dim, None)?,
                layer2: Linear::load(w, "c2ws_hidden_states_layer2", dim, dim, None)?,
            })
        } else {
            None
        };
        Ok(Self {
            camera,
            patch_w: w.get(
                "patch_embedding.weight",
                &[dim, config.in_channels, pt, ph, pw],
                Init::FanIn,
            )?,
            patch_b: w.get_as(
                "patch_embedding.bias",
                &[dim],
                Init::Scaled(0.05),
                DType::F32,
            )?,
            embedder: ConditionEmbedder::load(w, &config)?,
            blocks: (0..config.num_layers)
                .map(|i| Block::load(w, i, &config, with_camera, shard.as_ref()))
                .collect::<Result<_>>()?,
            table_out: w.get_as(
                "scale_shift_table",
                &[1, 2, dim],
                Init::Scaled(0.1),
                DType::F32,
            )?,
            proj_out: Linear::load(w, "proj_out", dim, out * pt * ph * pw, None)?,
            rope: RwLock::new(Arc::new(RopeTable::new(
                config.attention_head_dim,
                config.rope_max_seq_len,
                ROPE_THETA,
            ))),
            device: w.device().clone(),
            config,
            shard,
        })
    }

    /// Loads a diffusers transformer folder with weights in `dtype` (the time MLP, norms
    /// and modulation tables stay f32 as diffusers keeps them).
    pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        Self::load_sharded(dir, device, dtype, None)
    }

    /// Loads this rank's part of a diffusers transformer folder.
    pub fn load_sharded(
        dir: &Path,
        device: &Device,
        dtype: DType,
        shard: Option<Sharding>,
    ) -> Result<Self> {
        let config = DitConfig::from_json(&read_config(dir)?)?;
        Self::from_store_sharded(config, &WeightStore::from_dir(dir, device, dtype)?, shard)
    }

    /// Seeded random weights for `config`.
    pub fn seeded(config: DitConfig, seed: u64, device: &Device, dtype: DType) -> Result<Self> {
        Self::seeded_sharded(config, seed, device, dtype, None)
    }

    /// This rank's part of the seeded network (the same values as the whole one).
    pub fn seeded_sharded(
        config: DitConfig,
        seed: u64,
        device: &Device,
        dtype: DType,
        shard: Option<Sharding>,
    ) -> Result<Self> {
        Self::from_store_sharded(config, &WeightStore::seeded(seed, device, dtype), shard)
    }

    /// This rank's sharding, if any.
    pub fn sharding(&self) -> Option<&Sharding> {
        self.shard.as_ref()
    }

    /// Attention heads whose keys/values this rank keeps: all of them, or
    /// `heads / (tp·sp)` sharded.
    pub fn kv_heads(&self) -> usize {
        let (_, tp) = shard::tp_part(self.shard.as_ref());
        let (_, sp) = shard::sp_part(self.shard.as_ref());
        self.config.num_attention_heads / (tp * sp)
    }

    /// The config.
    pub fn config(&self) -> &DitConfig {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The token grid of latents `[1, C, F, H, W]`, checking shape and divisibility.
    pub fn grid(&self, latents: &Tensor) -> Result<TokenGrid> {
        let op = "dit forward";
        let [b, c, f, h, w] = *latents.shape() else {
            return Err(ModelError::input(
                op,
                format!("latents must be [1, C, F, H, W], got {:?}", latents.shape()),
            ));
        };
        let [pt, ph, pw] = self.config.patch_size;
        if b != 1 || c != self.config.in_channels {
            return Err(ModelError::input(
                op,
                format!(
                    "latents {:?} must have batch 1 and {} channels",
                    latents.shape(),
                    self.config.in_channels
                ),
            ));
        }
        if f == 0 || f % pt != 0 || h % ph != 0 || w % pw != 0 || h == 0 || w == 0 {
            return Err(ModelError::input(
                op,
                format!(
                    "latents {:?}: F, H, W must be positive multiples of the patch {:?}",
                    latents.shape(),
                    self.config.patch_size
                ),
            ));
        }
        let grid = TokenGrid {
            frames: f / pt,
            rows: h / ph,
            cols: w / pw,
        };
        let max = self.config.rope_max_seq_len;
        if grid.rows > max || grid.cols > max {
            return Err(ModelError::input(
                op,
                format!(
                    "{}×{}×{} tokens (frames × rows × columns) exceed the rotary table's {max} per side",
                    grid.frames, grid.rows, grid.cols
                ),
            ));
        }
        Ok(grid)
    }

    /// The rotary tables, grown to cover every frame index of `positions`: positions
    /// are absolute (STEPWISE B5.4), so a session streamed past the table's end gets the
    /// same formula's values there, and every position below it keeps its bytes.
    fn rope_covering(&self, positions: &[[usize; 3]]) -> Arc<RopeTable> {
        let needed = positions.iter().map(|p| p[0] + 1).max().unwrap_or(0);
        let current = Arc::clone(&self.rope.read().unwrap_or_else(|p| p.into_inner()));
        if needed <= current.max_positions() {
            return current;
        }
        let mut table = self.rope.write().unwrap_or_else(|p| p.into_inner());
        if needed > table.max_positions() {
            let size = needed.next_power_of_two().max(2 * table.max_positions());
            *table = Arc::new(RopeTable::new(
                self.config.attention_head_dim,
                size,
                ROPE_THETA,
            ));
        }
        Arc::clone(&table)
    }

    /// Cross-attention keys/values of text embeddings `[S, text_dim]` (a single zero token
    /// when `None`: any number of identical zero tokens attends the same).
    pub fn text_key_values(&self, text: Option<&Tensor>) -> Result<TextKeyValues> {
        let zeros;
        let text = match text {
            Some(t) => {
                if t.rank() != 2 || t.shape()[1] != self.config.text_dim || t.shape()[0] == 0 {
                    return Err(ModelError::input(
                        "text embeddings",
                        format!(
                            "must be [L, {}] with L ≥ 1, got {:?}",
                            self.config.text_dim,
                            t.shape()
                        ),
                    ));
                }
                t
            }
            None => {
                zeros = Tensor::zeros(&[1, self.config.text_dim], DType::F32, &self.device)?;
                &zeros
            }
        };
        let ctx = self.embedder.text(text)?;
        Ok(TextKeyValues(
            self.blocks
                .iter()
                .map(|b| b.text_key_values(&ctx, self.shard.as_ref()))
                .collect::<Result<_>>()?,
        ))
    }

    /// Patch-embeds latents into tokens `[1, L, dim]`.
    pub fn embed(&self, latents: &Tensor) -> Result<Tensor> {
        let options = Conv3dOptions {
            stride: self.config.patch_size,
            pad_t_front: 0,
            time_pad: TimePad::Zeros,
            pad_hw: [0, 0],
        };
        let h = latents.conv3d(&self.patch_w, Some(&self.patch_b), options)?;
        let [b, dim, f, y, x] = *h.shape() else {
            unreachable!("conv3d keeps 5 axes")
        };
        Ok(h.reshape(&[b, dim, f * y * x])?
            .transpose(1, 2)?
            .contiguous()?)
    }

    /// Whether the checkpoint has a camera adapter.
    pub fn has_camera(&self) -> bool {
        self.camera.is_some()
    }

    /// The fold `s` the camera adapter's rays take (`[1, 6·s², F, H, W]`, `s` the
    /// spatial factor of the VAE it was trained with), or `None` without an adapter.
    pub fn camera_fold(&self) -> Option<usize> {
        self.camera.as_ref().map(|c| c.fold)
    }

    /// Camera tokens `[1, L, dim]` of a folded ray embedding `[1, 6·s², F, H, W]` (on the
    /// latent grid, `s` = [`WanTransformer::camera_fold`]), or `None` when the model has
    /// no camera adapter. They do not depend on the timestep, so one computation serves
    /// every step of a block.
    pub fn camera_tokens(&self, rays: &Tensor) -> Result<Option<Tensor>> {
        let Some(cam) = &self.camera else {
            return Ok(None);
        };
        let channels = 6 * cam.fold * cam.fold;
        let [_, c, f, h, w] = *rays.shape() else {
            return Err(ModelError::input(
                "camera",
                format!(
                    "rays must be [1, {channels}, F, H, W], got {:?}",
                    rays.shape()
                ),
            ));
        };
        let [pt, ph, pw] = self.config.patch_size;
        if c != channels || f % pt != 0 || h % ph != 0 || w % pw != 0 {
            return Err(ModelError::input(
                "camera",
                format!(
                    "rays {:?} are not {channels} channels that patch by {:?}",
                    rays.shape(),
                    self.config.patch_size
                ),
            ));
        }
        // Token features in (c, pt, ph, pw) order, tokens in (f, y, x) order.
        let patches = rays
            .reshape(&[1, c, f / pt, pt, h / ph, ph, w / pw, pw])?
            .permute(&[0, 2, 4, 6, 1, 3, 5, 7])?
            .reshape(&[1, (f / pt) * (h / ph) * (w / pw), c * pt * ph * pw])?;
        let c0 = cam.patch.forward(&patches)?;
        let c1 = cam.layer2.forward(&cam.layer1.forward(&c0)?.silu()?)?;
        Ok(Some(c0.add(&c1)?))
    }

    /// Runs every block on tokens at `positions`; `past[i]` holds block `i`'s keys/values
    /// of earlier tokens; `camera` tokens (from [`WanTransformer::camera_tokens`])
    /// modulate every block when the model has an adapter. Returns the velocity tokens
    /// `[1, L, out·pt·ph·pw]` and each block's own keys/values.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_tokens(
        &self,
        tokens: &Tensor,
        positions: &[[usize; 3]],
        t: f32,
        text: &TextKeyValues,
        past: Option<&[KeyValues]>,
        mask: Mask,
        camera: Option<&Tensor>,
    ) -> Result<(Tensor, Vec<KeyValues>)> {
        let item = BatchItem {
            tokens,
            positions,
            t,
            text,
            past,
            camera,
        };
        let mut out = self.forward_batch(&[item], mask)?;
        Ok(out.swap_remove(0))
    }

    /// One forward of several sessions' tokens at once: their rows stacked for every
    /// linear layer, each item's rows modulated by its own timestep, self-attending its
    /// own `past` and cross-attending its own text (rows never mix, so each item's
    /// result is the bytes [`WanTransformer::forward_tokens`] gives it alone). Returns,
    /// per item, its velocity tokens and each block's own keys/values of its rows.
    /// Several items need an engine without sequence parallelism (its ranks split one
    /// session's tokens).
    pub fn forward_batch(
        &self,
        items: &[BatchItem<'_>],
        mask: Mask,
    ) -> Result<Vec<(Tensor, Vec<KeyValues>)>> {
        let op = "dit forward";
        let shard = self.shard.as_ref();
        // Sharded, this rank runs its contiguous share of the tokens.
        let (sp_rank, sp) = shard::sp_part(shard);
        if items.is_empty() || (items.len() > 1 && sp > 1) {
            return Err(ModelError::input(
                op,
                format!(
                    "{} items: a batch has at least one, and more than one needs sp = 1 (got sp = {sp})",
                    items.len()
                ),
            ));
        }
        if items.iter().any(|i| i.camera.is_some()) && items.iter().any(|i| i.camera.is_none()) {
            return Err(ModelError::input(
                op,
                "camera tokens for some items of a batch but not for others",
            ));
        }
        let mut times = Vec::with_capacity(items.len());
        let (mut rows, mut cams, mut positions, mut lens) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for item in items {
            let len = item.tokens.shape()[1];
            if !len.is_multiple_of(sp) {
                return Err(ModelError::input(
                    "sequence parallelism",
                    format!("{len} tokens do not split into sp = {sp} equal parts"),
                ));
            }
            if item.positions.len() != len {
                return Err(ModelError::input(
                    op,
                    format!("{} positions for {len} tokens", item.positions.len()),
                ));
            }
            let part = len / sp;
            let range = sp_rank * part..(sp_rank + 1) * part;
            rows.push(item.tokens.narrow(1, range.start, part)?);
            if let Some(c) = item.camera {
                cams.push(c.narrow(1, range.start, part)?);
            }
            positions.extend_from_slice(&item.positions[range]);
            lens.push(part);
            times.push(self.embedder.time(item.t, &self.device)?);
        }
        let stack = |parts: &[Tensor]| -> Result<Tensor> {
            match parts {
                [one] => Ok(one.clone()),
                _ => Ok(Tensor::cat(&parts.iter().collect::<Vec<_>>(), 1)?),
            }
        };
        let mut h = stack(&rows)?;
        drop(rows);
        let camera = if cams.is_empty() {
            None
        } else {
            Some(stack(&cams)?)
        };
        drop(cams);
        let mut own: Vec<Vec<KeyValues>> = vec![Vec::with_capacity(self.blocks.len()); items.len()];
        let rope = self.rope_covering(&positions);
        // On a GPU, the rope tables and positions are uploaded once for all blocks.
        let _rope = rope.device_scope();
        for (i, block) in self.blocks.iter().enumerate() {
            let segments: Vec<Segment<'_>> = items
                .iter()
                .zip(&times)
                .zip(&lens)
                .map(|((item, (_, tproj)), &len)| Segment {
                    len,
                    tproj,
                    past: item.past.map(|p| &p[i]),
                    text: &item.text.0[i],
                })
                .collect();
            let (next, kvs) = block.forward(
                &h,
                &segments,
                (&rope, &positions),
                mask,
                camera.as_ref(),
                shard,
            )?;
            h = next;
            for (mine, kv) in own.iter_mut().zip(kvs) {
                mine.push(kv);
            }
        }
        drop(camera);
        let normed = block::per_segment(&h, &lens, |rows, i, _| {
            let m = self.table_out.add(&times[i].0.unsqueeze(1)?)?;
            let (shift, scale) = (m.narrow(1, 0, 1)?, m.narrow(1, 1, 1)?);
            Ok(rows
                .layer_norm(None, None, self.config.eps as f32)?
                .mul(&scale.add_scalar(1.0)?)?
                .add(&shift)?)
        })?;
        drop(h);
        let v = self.proj_out.forward(&normed)?;
        drop(normed);
        let mut start = 0;
        let mut results = Vec::with_capacity(items.len());
        for (kv, &len) in own.into_iter().zip(&lens) {
            let mine = if let [_] = lens[..] {
                v.clone()
            } else {
                v.narrow(1, start, len)?.contiguous()?
            };
            start += len;
            results.push((shard::gather_tokens(shard, mine)?, kv));
        }
        Ok(results)
    }

    /// Velocity tokens → `[1, out, F, H, W]` (feature order `(pt, ph, pw, C)`, C fastest).
    pub fn unpatchify(&self, v: &Tensor, grid: TokenGrid) -> Result<Tensor> {
        let [pt, ph, pw] = self.config.patch_size;
        let c = self.config.out_channels();
        let (f, y, x) = (grid.frames, grid.rows, grid.cols);
        Ok(v.reshape(&[1, f, y, x, pt, ph, pw, c])?
            .permute(&[0, 7, 1, 4, 2, 5, 3, 6])?
            .reshape(&[1, c, f * pt, y * ph, x * pw])?)
    }

    /// One full-sequence forward at timestep `t`: latents `[1, in, F, H, W]` → velocity
    /// `[1, out, F, H, W]`, optionally under a block-causal mask of `block_frames` frames.
    pub fn forward(
        &self,
        latents: &Tensor,
        t: f32,
        text: Option<&Tensor>,
        block_frames: Option<usize>,
    ) -> Result<Tensor> {
        let grid = self.grid(latents)?;
        let text = self.text_key_values(text)?;
        let tokens = self.embed(latents)?;
        let mask = match block_frames {
            Some(0) => {
                return Err(ModelError::input(
                    "dit forward",
                    "block_frames must be at least 1",
                ))
            }
            Some(n) => Mask::BlockCausal {
                block_len: n * grid.per_frame(),
                q_start: 0,
            },
            None => Mask::None,
        };
        let (v, _) =
            self.forward_tokens(&tokens, &grid.positions(0), t, &text, None, mask, None)?;
        self.unpatchify(&v, grid)
    }
}
