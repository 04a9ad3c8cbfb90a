//! `WanTransformerBlock` and `WanAttention` (WAN.md §3.6–3.7): modulated self-attention
//! with q/k RMS norm across heads and 3-axis RoPE, cross-attention to text, gated FFN.

use headroom_tensor::kernels::rope::RopeTable;
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::{DType, Tensor};

use super::config::DitConfig;
use super::embed::Linear;
use crate::error::Result;
use crate::weights::{Init, WeightStore};

/// Keys and values of some tokens, `[1, L, heads, head_dim]`, after norm and RoPE.
#[derive(Debug, Clone)]
pub struct KeyValues {
    /// Keys.
    pub k: Tensor,
    /// Values.
    pub v: Tensor,
}

/// One attention layer's projections and q/k norms.
#[derive(Debug)]
struct Attention {
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    to_out: Linear,
    norm_q: Tensor,
    norm_k: Tensor,
    heads: usize,
    head_dim: usize,
    eps: f32,
}

impl Attention {
    fn load(w: &WeightStore, prefix: &str, c: &DitConfig) -> Result<Self> {
        let dim = c.dim();
        Ok(Self {
            to_q: Linear::load(w, &format!("{prefix}.to_q"), dim, dim, None)?,
            to_k: Linear::load(w, &format!("{prefix}.to_k"), dim, dim, None)?,
            to_v: Linear::load(w, &format!("{prefix}.to_v"), dim, dim, None)?,
            to_out: Linear::load(w, &format!("{prefix}.to_out.0"), dim, dim, None)?,
            norm_q: w.get_as(
                &format!("{prefix}.norm_q.weight"),
                &[dim],
                Init::NearOne,
                DType::F32,
            )?,
            norm_k: w.get_as(
                &format!("{prefix}.norm_k.weight"),
                &[dim],
                Init::NearOne,
                DType::F32,
            )?,
            heads: c.num_attention_heads,
            head_dim: c.attention_head_dim,
            eps: c.eps as f32,
        })
    }

    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let [b, l, _] = *x.shape() else {
            unreachable!("tokens are [B, L, dim]")
        };
        Ok(x.reshape(&[b, l, self.heads, self.head_dim])?)
    }

    /// Keys and values of `src` tokens (RoPE'd when positions are given).
    fn key_values(
        &self,
        src: &Tensor,
        rope: Option<(&RopeTable, &[[usize; 3]])>,
    ) -> Result<KeyValues> {
        let k = self.split_heads(
            &self
                .to_k
                .forward(src)?
                .rms_norm(Some(&self.norm_k), self.eps)?,
        )?;
        let k = match rope {
            Some((table, positions)) => k.rope(table, positions)?,
            None => k,
        };
        let v = self.split_heads(&self.to_v.forward(src)?)?;
        Ok(KeyValues { k, v })
    }

    /// Attention of the tokens `a` over `past` keys/values followed by `own`.
    fn attend(
        &self,
        a: &Tensor,
        rope: Option<(&RopeTable, &[[usize; 3]])>,
        kv: &KeyValues,
        mask: Mask,
    ) -> Result<Tensor> {
        let q = self.split_heads(
            &self
                .to_q
                .forward(a)?
                .rms_norm(Some(&self.norm_q), self.eps)?,
        )?;
        let q = match rope {
            Some((table, positions)) => q.rope(table, positions)?,
            None => q,
        };
        let o = Tensor::scaled_dot_product_attention(&q, &kv.k, &kv.v, mask, None)?;
        let [b, l, _, _] = *o.shape() else {
            unreachable!("attention keeps [B, L, H, D]")
        };
        self.to_out
            .forward(&o.reshape(&[b, l, self.heads * self.head_dim])?)
    }
}

/// Cross-attention keys and values of a session's text, computed once per block.
#[derive(Debug, Clone)]
pub struct TextKeyValues(pub Vec<KeyValues>);

/// A block's camera injection (STEPWISE A9): `G = inj2(silu(inj1(C))) + C`, then
/// `x = (1 + scale(G))·x + shift(G)` after the self-attention residual.
#[derive(Debug)]
struct CameraInjection {
    inj1: Linear,
    inj2: Linear,
    scale: Linear,
    shift: Linear,
}

impl CameraInjection {
    fn load(w: &WeightStore, prefix: &str, dim: usize) -> Result<Self> {
        Ok(Self {
            inj1: Linear::load(w, &format!("{prefix}.cam_injector_layer1"), dim, dim, None)?,
            inj2: Linear::load(w, &format!("{prefix}.cam_injector_layer2"), dim, dim, None)?,
            scale: Linear::load(w, &format!("{prefix}.cam_scale_layer"), dim, dim, None)?,
            shift: Linear::load(w, &format!("{prefix}.cam_shift_layer"), dim, dim, None)?,
        })
    }

    fn apply(&self, h: &Tensor, cam: &Tensor) -> Result<Tensor> {
        let g = self
            .inj2
            .forward(&self.inj1.forward(cam)?.silu()?)?
            .add(cam)?;
        let scale = self.scale.forward(&g)?.add_scalar(1.0)?;
        Ok(h.mul(&scale)?.add(&self.shift.forward(&g)?)?)
    }
}

/// One transformer block.
#[derive(Debug)]
pub struct Block {
    camera: Option<CameraInjection>,
    table: Tensor,
    attn1: Attention,
    attn2: Attention,
    norm2: Option<(Tensor, Tensor)>,
    ffn_in: Linear,
    ffn_out: Linear,
    eps: f32,
}

/// `LN(x)·(1 + scale) + shift` with a no-affine LayerNorm.
fn modulate(x: &Tensor, shift: &Tensor, scale: &Tensor, eps: f32) -> Result<Tensor> {
    Ok(x.layer_norm(None, None, eps)?
        .mul(&scale.add_scalar(1.0)?)?
        .add(shift)?)
}

impl Block {
    /// Loads `blocks.{i}` (with its camera injection when `camera` is set).
    pub fn load(w: &WeightStore, i: usize, c: &DitConfig, camera: bool) -> Result<Self> {
        let p = format!("blocks.{i}");
        let dim = c.dim();
        Ok(Self {
            camera: camera
                .then(|| CameraInjection::load(w, &p, dim))
                .transpose()?,
            table: w.get_as(
                &format!("{p}.scale_shift_table"),
                &[1, 6, dim],
                Init::Scaled(0.1),
                DType::F32,
            )?,
            attn1: Attention::load(w, &format!("{p}.attn1"), c)?,
            attn2: Attention::load(w, &format!("{p}.attn2"), c)?,
            norm2: if c.cross_attn_norm {
                Some((
                    w.get_as(
                        &format!("{p}.norm2.weight"),
                        &[dim],
                        Init::NearOne,
                        DType::F32,
                    )?,
                    w.get_as(
                        &format!("{p}.norm2.bias"),
                        &[dim],
                        Init::Scaled(0.05),
                        DType::F32,
                    )?,
                ))
            } else {
                None
            },
            ffn_in: Linear::load(w, &format!("{p}.ffn.net.0.proj"), dim, c.ffn_dim, None)?,
            ffn_out: Linear::load(w, &format!("{p}.ffn.net.2"), c.ffn_dim, dim, None)?,
            eps: c.eps as f32,
        })
    }

    /// The cross-attention keys/values of context tokens `[1, S, dim]`.
    pub fn text_key_values(&self, ctx: &Tensor) -> Result<KeyValues> {
        self.attn2.key_values(ctx, None)
    }

    /// The self-attention input of `h` under modulation `tproj`, and its keys/values.
    fn self_input(
        &self,
        h: &Tensor,
        m: &[Tensor],
        rope: (&RopeTable, &[[usize; 3]]),
    ) -> Result<(Tensor, KeyValues)> {
        let a = modulate(h, &m[0], &m[1], self.eps)?;
        let kv = self.attn1.key_values(&a, Some(rope))?;
        Ok((a, kv))
    }

    fn modulation(&self, tproj: &Tensor) -> Result<Vec<Tensor>> {
        let m = self.table.add(tproj)?;
        (0..6).map(|i| Ok(m.narrow(1, i, 1)?)).collect()
    }

    /// Runs the block on tokens `h [1, L, dim]` at `positions`. Self-attention sees
    /// `past` keys/values (earlier frames) followed by the tokens' own, under `mask`;
    /// `camera` tokens `[1, L, dim]` modulate the result when the block has an adapter.
    /// Returns the new hidden states and the tokens' own keys/values (for a KV cache).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        h: &Tensor,
        tproj: &Tensor,
        rope: (&RopeTable, &[[usize; 3]]),
        past: Option<&KeyValues>,
        mask: Mask,
        text: &KeyValues,
        camera: Option<&Tensor>,
    ) -> Result<(Tensor, KeyValues)> {
        let m = self.modulation(tproj)?;
        let (a, own) = self.self_input(h, &m, rope)?;
        let all = match past {
            Some(p) => KeyValues {
                k: Tensor::cat(&[&p.k, &own.k], 1)?,
                v: Tensor::cat(&[&p.v, &own.v], 1)?,
            },
            None => own.clone(),
        };
        let o = self.attn1.attend(&a, Some(rope), &all, mask)?;
        drop(all);
        let mut h = h.add(&o.mul(&m[2])?)?;
        if let (Some(injection), Some(cam)) = (&self.camera, camera) {
            h = injection.apply(&h, cam)?;
        }
        let a = match &self.norm2 {
            Some((w, b)) => h.layer_norm(Some(w), Some(b), self.eps)?,
            None => h.clone(),
        };
        let h = h.add(&self.attn2.attend(&a, None, text, Mask::None)?)?;
        let a = modulate(&h, &m[3], &m[4], self.eps)?;
        let f = self
            .ffn_out
            .forward(&self.ffn_in.forward(&a)?.gelu_tanh()?)?;
        Ok((h.add(&f.mul(&m[5])?)?, own))
    }
}
