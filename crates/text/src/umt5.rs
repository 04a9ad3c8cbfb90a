//! The UMT5 encoder (transformers 5.x `UMT5EncoderModel`, `modeling_umt5.py`) on
//! headroom's tensor runtime, for one sequence, f32 compute over bf16 or f32 weights.
//!
//! Per block: `x += o(attn(rms(x)))` then `x += wo(act(wi_0(rms(x))) · wi_1(rms(x)))`,
//! and a final RMS norm. The RMS norms are T5's (no mean subtraction, no bias, statistics
//! in f32 or wider). Attention scores are `q·kᵀ` without the `1/√d` scale, plus a
//! relative position bias that every block owns (UMT5, unlike T5, does not share block
//! 0's), plus the padding mask (`f32::MIN` on padded keys, as transformers' eager path).
//!
//! Keys are transformers' names (`encoder.block.{i}.layer.0.SelfAttention.q.weight`, …).
//! The token embedding is `encoder.embed_tokens.weight`, or `shared.weight` when a
//! checkpoint stores only the tied copy (what `save_pretrained` writes).

use std::path::Path;

use headroom_model::weights::{Init, WeightStore};
use headroom_tensor::{DType, Device, Element, Tensor};

use crate::config::{Activation, Umt5Config};
use crate::error::{Result, TextError};

/// One encoder block's weights.
#[derive(Debug)]
struct Block {
    attn_norm: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    /// `[num_buckets, num_heads]`, kept on the host as f32: it is gathered per position.
    relative_bias: Vec<f32>,
    ff_norm: Tensor,
    /// `wi_0` (gated) or `wi` (plain).
    wi_0: Tensor,
    /// `wi_1` (gated only).
    wi_1: Option<Tensor>,
    wo: Tensor,
}

/// A loaded UMT5 encoder.
#[derive(Debug)]
pub struct Umt5Encoder {
    config: Umt5Config,
    embed: Tensor,
    blocks: Vec<Block>,
    final_norm: Tensor,
    device: Device,
}

/// The bucket of relative position `memory − query` (transformers'
/// `_relative_position_bucket` with `bidirectional=True`), computed with the same f32
/// operations in the same order so the rounding at bucket edges is the same.
pub fn relative_position_bucket(relative: i64, num_buckets: usize, max_distance: usize) -> usize {
    let half = num_buckets / 2;
    let mut bucket = if relative > 0 { half } else { 0 };
    let distance = relative.unsigned_abs() as usize;
    let max_exact = half / 2;
    if distance < max_exact {
        return bucket + distance;
    }
    // torch: log(rp.float() / max_exact) / math.log(max_distance / max_exact) in f32
    // (the Python float divisor rounded to f32), times (half − max_exact), truncated.
    let denominator = (max_distance as f64 / max_exact as f64).ln() as f32;
    let ratio = (distance as f32 / max_exact as f32).ln() / denominator;
    let large = max_exact + (ratio * (half - max_exact) as f32) as usize;
    bucket += large.min(half - 1);
    bucket
}

impl Umt5Encoder {
    /// The encoder in `dir` (`config.json` + `model.safetensors` or a sharded
    /// `model.safetensors.index.json`), weights stored as `dtype` on `device`.
    pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let config = Umt5Config::from_dir(dir)?;
        let store = WeightStore::from_files(dir, "model", device, dtype)?;
        Self::build(config, &store)
    }

    /// The encoder of Wan's own T5 checkpoint (`models_t5_umt5-xxl-enc-bf16.pth`),
    /// its config read from the shapes, weights stored as `dtype` on `device`.
    pub fn load_wan(path: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let store = crate::wan_t5::open(path, device, dtype)?;
        let config = crate::wan_t5::config_from_shapes(&store, path)?;
        let encoder = Self::build(config, &store)?;
        store.check_all_used(&path.display().to_string())?;
        Ok(encoder)
    }

    /// Seeded random weights of `config` (the built-in presets, tests).
    pub fn seeded(config: Umt5Config, seed: u64, device: &Device, dtype: DType) -> Result<Self> {
        config.validate()?;
        let store = WeightStore::seeded(seed, device, dtype);
        Self::build(config, &store)
    }

    fn build(config: Umt5Config, store: &WeightStore) -> Result<Self> {
        let (d, inner, ff) = (config.d_model, config.inner_dim(), config.d_ff);
        let embed_key = if store.has("encoder.embed_tokens.weight") {
            "encoder.embed_tokens.weight"
        } else {
            "shared.weight"
        };
        let embed = store.get(embed_key, &[config.vocab_size, d], Init::Scaled(1.0))?;
        // Every tensor is stored in the store's dtype (norm scales and position biases
        // too), so loading an f32 checkpoint as bf16 equals loading its bf16 copy.
        let norm = |key: &str| store.get(key, &[d], Init::NearOne);
        let mut blocks = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("encoder.block.{i}.layer");
            let attn = format!("{p}.0.SelfAttention");
            let dense = format!("{p}.1.DenseReluDense");
            let bias = store.get(
                &format!("{attn}.relative_attention_bias.weight"),
                &[config.relative_attention_num_buckets, config.num_heads],
                Init::Scaled(0.5),
            )?;
            // A meta device has no values to gather; its bias is never read as numbers.
            let relative_bias = if store.device().is_meta() {
                vec![0.0; bias.numel()]
            } else {
                bias.to_f32_vec()?
            };
            let (wi_0, wi_1) = if config.is_gated_act {
                (
                    store.get(&format!("{dense}.wi_0.weight"), &[ff, d], Init::FanIn)?,
                    Some(store.get(&format!("{dense}.wi_1.weight"), &[ff, d], Init::FanIn)?),
                )
            } else {
                (
                    store.get(&format!("{dense}.wi.weight"), &[ff, d], Init::FanIn)?,
                    None,
                )
            };
            blocks.push(Block {
                attn_norm: norm(&format!("{p}.0.layer_norm.weight"))?,
                q: store.get(&format!("{attn}.q.weight"), &[inner, d], Init::FanIn)?,
                k: store.get(&format!("{attn}.k.weight"), &[inner, d], Init::FanIn)?,
                v: store.get(&format!("{attn}.v.weight"), &[inner, d], Init::FanIn)?,
                o: store.get(&format!("{attn}.o.weight"), &[d, inner], Init::FanIn)?,
                relative_bias,
                ff_norm: norm(&format!("{p}.1.layer_norm.weight"))?,
                wi_0,
                wi_1,
                wo: store.get(&format!("{dense}.wo.weight"), &[d, ff], Init::FanIn)?,
            });
        }
        let final_norm = norm("encoder.final_layer_norm.weight")?;
        Ok(Self {
            config,
            embed,
            blocks,
            final_norm,
            device: store.device().clone(),
        })
    }

    /// The config.
    pub fn config(&self) -> &Umt5Config {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes of the weights held on the device (the host-side position-bias tables are
    /// not counted).
    pub fn weight_bytes(&self) -> u64 {
        let mut total = self.embed.storage_bytes() + self.final_norm.storage_bytes();
        for b in &self.blocks {
            total += [
                &b.attn_norm,
                &b.q,
                &b.k,
                &b.v,
                &b.o,
                &b.ff_norm,
                &b.wi_0,
                &b.wo,
            ]
            .iter()
            .map(|t| t.storage_bytes())
            .sum::<usize>();
            total += b.wi_1.as_ref().map_or(0, Tensor::storage_bytes);
        }
        total as u64
    }

    /// Rows `ids` of the token embedding, f32 `[L, d_model]`.
    fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        let (vocab, d) = (self.config.vocab_size, self.config.d_model);
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(TextError::input(
                "umt5",
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        fn gather<T: Element>(table: &[T], ids: &[u32], d: usize, out: &mut [f32]) {
            for (row, &id) in out.chunks_exact_mut(d).zip(ids) {
                let src = &table[id as usize * d..][..d];
                for (o, &v) in row.iter_mut().zip(src) {
                    *o = v.to_f32();
                }
            }
        }
        if self.device.launcher().is_some() {
            // One row copy per token on the GPU.
            let rows = ids
                .iter()
                .map(|&id| self.embed.narrow(0, id as usize, 1))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let refs: Vec<&Tensor> = rows.iter().collect();
            return Ok(Tensor::cat(&refs, 0)?.to_dtype(DType::F32)?);
        }
        let table = self.embed.contiguous()?;
        let mut out = Tensor::empty(&[ids.len(), d], DType::F32, &self.device)?;
        if let Some(dst) = out.data_mut::<f32>() {
            match table.dtype() {
                DType::F32 => table.as_slice::<f32>().map(|t| gather(t, ids, d, dst)),
                DType::BF16 => table
                    .as_slice::<half::bf16>()
                    .map(|t| gather(t, ids, d, dst)),
                DType::F16 => table
                    .as_slice::<half::f16>()
                    .map(|t| gather(t, ids, d, dst)),
                other => {
                    return Err(TextError::input(
                        "umt5",
                        format!("token embedding stored as {other}, expected a float dtype"),
                    ))
                }
            };
        }
        Ok(out)
    }

    /// The relative position bias of `block` for `len` tokens, f32 `[H, L, L]`, plus the
    /// padding mask (`f32::MIN` on masked keys) when given.
    fn position_bias(&self, block: &Block, len: usize, mask: Option<&[bool]>) -> Result<Tensor> {
        let heads = self.config.num_heads;
        let (buckets, max_distance) = (
            self.config.relative_attention_num_buckets,
            self.config.relative_attention_max_distance,
        );
        // One bucket per relative position −(L−1) … L−1.
        let by_offset: Vec<usize> = (0..2 * len.max(1) - 1)
            .map(|i| relative_position_bucket(i as i64 - (len as i64 - 1), buckets, max_distance))
            .collect();
        let mut values = vec![0f32; heads * len * len];
        for (h, plane) in values.chunks_exact_mut(len * len).enumerate() {
            for (qi, row) in plane.chunks_exact_mut(len).enumerate() {
                for (ki, v) in row.iter_mut().enumerate() {
                    let bucket = by_offset[ki + len - 1 - qi];
                    *v = block.relative_bias[bucket * heads + h];
                    if mask.is_some_and(|m| !m[ki]) {
                        *v += f32::MIN;
                    }
                }
            }
        }
        Ok(Tensor::from_slice(
            &values,
            &[heads, len, len],
            &self.device,
        )?)
    }

    /// RMS layer norm without mean subtraction or bias, in f32.
    fn rms(&self, x: &Tensor, weight: &Tensor) -> Result<Tensor> {
        Ok(x.rms_norm(Some(weight), self.config.layer_norm_epsilon)?)
    }

    fn activation(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self.config.activation {
            Activation::GeluTanh => x.gelu_tanh()?,
            Activation::GeluErf => x.gelu_erf()?,
            Activation::Relu => x.clamp(0.0, f32::INFINITY)?,
        })
    }

    fn attention(&self, block: &Block, x: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let (len, heads, dk) = (x.shape()[0], self.config.num_heads, self.config.d_kv);
        let h = self.rms(x, &block.attn_norm)?;
        let split = |w: &Tensor| -> Result<Tensor> {
            // [L, inner] → [H, L, dk]
            Ok(h.linear(w, None)?
                .reshape(&[len, heads, dk])?
                .permute(&[1, 0, 2])?)
        };
        let (q, k, v) = (split(&block.q)?, split(&block.k)?, split(&block.v)?);
        drop(h);
        // No 1/√d scaling: T5 folds it into the initialisation.
        let scores = q.matmul(&k.transpose(1, 2)?)?.add(bias)?;
        drop((q, k));
        let probs = scores.softmax()?;
        drop(scores);
        let out = probs
            .matmul(&v)?
            .permute(&[1, 0, 2])?
            .reshape(&[len, heads * dk])?;
        Ok(out.linear(&block.o, None)?)
    }

    fn feed_forward(&self, block: &Block, x: &Tensor) -> Result<Tensor> {
        let h = self.rms(x, &block.ff_norm)?;
        let mut hidden = self.activation(&h.linear(&block.wi_0, None)?)?;
        if let Some(wi_1) = &block.wi_1 {
            hidden = hidden.mul(&h.linear(wi_1, None)?)?;
        }
        drop(h);
        Ok(hidden.linear(&block.wo, None)?)
    }

    /// `last_hidden_state` of one sequence: f32 `[L, d_model]` for token `ids`, with an
    /// attention `mask` over them (`false` = padding, never attended to) or none.
    pub fn forward(&self, ids: &[u32], mask: Option<&[bool]>) -> Result<Tensor> {
        if ids.is_empty() {
            return Err(TextError::input("umt5", "no tokens to encode"));
        }
        if let Some(m) = mask {
            if m.len() != ids.len() {
                return Err(TextError::input(
                    "umt5",
                    format!("attention mask of {} for {} tokens", m.len(), ids.len()),
                ));
            }
            if !m.iter().any(|&keep| keep) {
                return Err(TextError::input(
                    "umt5",
                    "the attention mask hides every token",
                ));
            }
        }
        let mut x = self.embed(ids)?;
        for block in &self.blocks {
            let bias = self.position_bias(block, ids.len(), mask)?;
            let attn = self.attention(block, &x, &bias)?;
            drop(bias);
            x = x.add(&attn)?;
            drop(attn);
            let ff = self.feed_forward(block, &x)?;
            x = x.add(&ff)?;
        }
        self.rms(&x, &self.final_norm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_split_directions_and_saturate() {
        // 32 buckets: 16 per direction, 8 exact, the rest logarithmic up to 128.
        assert_eq!(relative_position_bucket(0, 32, 128), 0);
        assert_eq!(relative_position_bucket(-3, 32, 128), 3);
        assert_eq!(relative_position_bucket(3, 32, 128), 19);
        assert_eq!(relative_position_bucket(16, 32, 128), 16 + 10);
        assert_eq!(relative_position_bucket(-1000, 32, 128), 15);
        assert_eq!(relative_position_bucket(1000, 32, 128), 31);
    }
}
