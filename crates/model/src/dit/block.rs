//! `WanTransformerBlock` and `WanAttention` (WAN.md §3.6–3.7): modulated self-attention
//! with q/k RMS norm across heads and 3-axis RoPE, cross-attention to text, gated FFN.

use headroom_tensor::kernels::rope::RopeTable;
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::{DType, Tensor};

use super::config::DitConfig;
use super::embed::{Linear, Split};
use super::shard::{self, Sharding};
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

/// One attention layer's projections and q/k norms (this rank's heads when sharded).
#[derive(Debug)]
struct Attention {
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    to_out: Linear,
    norm_q: Tensor,
    norm_k: Tensor,
    /// Heads held here: all of them, or `heads / tp` on a tensor-parallel rank.
    heads: usize,
    head_dim: usize,
    /// Features the q/k norms span (all heads).
    dim: usize,
    eps: f32,
}

impl Attention {
    fn load(w: &WeightStore, prefix: &str, c: &DitConfig, tp: (usize, usize)) -> Result<Self> {
        let dim = c.dim();
        let norm = |name: &str| {
            w.get_part(
                &format!("{prefix}.{name}.weight"),
                &[dim],
                Init::NearOne,
                DType::F32,
                0,
                tp,
            )
        };
        let rows = |name: &str| {
            Linear::load_split(w, &format!("{prefix}.{name}"), dim, dim, Split::Rows(tp))
        };
        Ok(Self {
            to_q: rows("to_q")?,
            to_k: rows("to_k")?,
            to_v: rows("to_v")?,
            to_out: Linear::load_split(
                w,
                &format!("{prefix}.to_out.0"),
                dim,
                dim,
                Split::Cols(tp),
            )?,
            norm_q: norm("norm_q")?,
            norm_k: norm("norm_k")?,
            heads: c.num_attention_heads / tp.1,
            head_dim: c.attention_head_dim,
            dim,
            eps: c.eps as f32,
        })
    }

    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let [b, l, _] = *x.shape() else {
            unreachable!("tokens are [B, L, dim]")
        };
        Ok(x.reshape(&[b, l, self.heads, self.head_dim])?)
    }

    /// Projection `proj` of `src`, RMS-normed by `norm` across all heads, split into
    /// heads and RoPE'd when positions are given.
    fn project_normed(
        &self,
        proj: &Linear,
        norm: &Tensor,
        src: &Tensor,
        rope: Option<(&RopeTable, &[[usize; 3]])>,
        shard: Option<&Sharding>,
    ) -> Result<Tensor> {
        let x = shard::rms_norm(shard, &proj.forward(src)?, norm, self.dim, self.eps)?;
        let x = self.split_heads(&x)?;
        match rope {
            Some((table, positions)) => Ok(x.rope(table, positions)?),
            None => Ok(x),
        }
    }

    /// Keys and values of `src` tokens (RoPE'd when positions are given). With
    /// `ulysses`, the SP group's tokens are exchanged for heads: the result covers every
    /// rank's tokens with this rank's share of the heads.
    fn key_values(
        &self,
        src: &Tensor,
        rope: Option<(&RopeTable, &[[usize; 3]])>,
        shard: Option<&Sharding>,
        ulysses: bool,
    ) -> Result<KeyValues> {
        let k = self.project_normed(&self.to_k, &self.norm_k, src, rope, shard)?;
        let v = self.split_heads(&self.to_v.forward(src)?)?;
        if ulysses {
            return Ok(KeyValues {
                k: shard::seq_to_heads(shard, k)?,
                v: shard::seq_to_heads(shard, v)?,
            });
        }
        Ok(KeyValues { k, v })
    }

    /// Attention of the tokens `a` over keys/values: segment `i`'s rows (`lens[i]` of
    /// them, in order) over `kvs[i]` (exchanged as in [`Attention::key_values`] with
    /// `ulysses`), projected out and summed across the TP group. Only the products
    /// with keys are per segment; the projections run on every row at once.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        a: &Tensor,
        rope: Option<(&RopeTable, &[[usize; 3]])>,
        kvs: &[&KeyValues],
        lens: &[usize],
        mask: Mask,
        shard: Option<&Sharding>,
        ulysses: bool,
    ) -> Result<Tensor> {
        let mut q = self.project_normed(&self.to_q, &self.norm_q, a, rope, shard)?;
        if ulysses {
            q = shard::seq_to_heads(shard, q)?;
        }
        let compute = crate::compute_for(self.to_q.weight.dtype());
        let mut o = per_segment(&q, lens, |q, i, _| {
            let kv = kvs[i];
            Ok(Tensor::scaled_dot_product_attention_in(
                q, &kv.k, &kv.v, mask, None, compute,
            )?)
        })?;
        drop(q);
        if ulysses {
            o = shard::heads_to_seq(shard, o)?;
        }
        let [b, l, _, _] = *o.shape() else {
            unreachable!("attention keeps [B, L, H, D]")
        };
        let o = o.reshape(&[b, l, self.heads * self.head_dim])?;
        shard::col_split_forward(shard, &self.to_out, &o)
    }
}

/// `op` on each segment's rows of `x` (`[1, ΣL, …]`, `lens[i]` rows for segment `i`, in
/// order) with the segment's index and first row, the results stacked back along the
/// rows; one segment is `op` on `x` itself, with no copy. Rows never mix, so a segment's
/// result is what `op` gives its rows alone.
pub(crate) fn per_segment<F>(x: &Tensor, lens: &[usize], mut op: F) -> Result<Tensor>
where
    F: FnMut(&Tensor, usize, usize) -> Result<Tensor>,
{
    if let [_] = lens {
        return op(x, 0, 0);
    }
    let mut parts = Vec::with_capacity(lens.len());
    let mut start = 0;
    for (i, &len) in lens.iter().enumerate() {
        parts.push(op(&x.narrow(1, start, len)?, i, start)?);
        start += len;
    }
    Ok(Tensor::cat(&parts.iter().collect::<Vec<_>>(), 1)?)
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

/// `LN(x)·(1 + scale) + shift` with a no-affine LayerNorm, for the products of `readers`
/// only: in bf16 where all of them round their input to bf16 anyway (the same bits of
/// theirs, half the bytes), else in `x`'s dtype.
fn modulate(
    x: &Tensor,
    shift: &Tensor,
    scale: &Tensor,
    eps: f32,
    readers: &[&Linear],
) -> Result<Tensor> {
    let dtype = if readers.iter().all(|l| l.reads_bf16()) {
        DType::BF16
    } else {
        x.dtype()
    };
    Ok(x.layer_norm_modulate_as(shift, scale, eps, dtype)?)
}

impl Block {
    /// Loads `blocks.{i}` (with its camera injection when `camera` is set), this rank's
    /// part of it when `shard` is given.
    pub fn load(
        w: &WeightStore,
        i: usize,
        c: &DitConfig,
        camera: bool,
        shard: Option<&Sharding>,
    ) -> Result<Self> {
        let p = format!("blocks.{i}");
        let tp = shard::tp_part(shard);
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
            attn1: Attention::load(w, &format!("{p}.attn1"), c, tp)?,
            attn2: Attention::load(w, &format!("{p}.attn2"), c, tp)?,
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
            ffn_in: Linear::load_split(
                w,
                &format!("{p}.ffn.net.0.proj"),
                dim,
                c.ffn_dim,
                Split::Rows(tp),
            )?,
            ffn_out: Linear::load_split(
                w,
                &format!("{p}.ffn.net.2"),
                c.ffn_dim,
                dim,
                Split::Cols(tp),
            )?,
            eps: c.eps as f32,
        })
    }

    /// The cross-attention keys/values of context tokens `[1, S, dim]` (this rank's TP
    /// heads when sharded).
    pub fn text_key_values(&self, ctx: &Tensor, shard: Option<&Sharding>) -> Result<KeyValues> {
        self.attn2.key_values(ctx, None, shard, false)
    }

    fn modulation(&self, tproj: &Tensor) -> Result<Vec<Tensor>> {
        let m = self.table.add(tproj)?;
        (0..6).map(|i| Ok(m.narrow(1, i, 1)?)).collect()
    }

    /// Runs the block on the stacked tokens `h [1, ΣL, dim]` of one or more segments
    /// (sessions), `positions` and `camera` tokens covering every row. Segment `i`'s
    /// rows are modulated by its own timestep and self-attend its `past` keys/values
    /// (earlier frames) followed by its own under `mask`, and cross-attend its own
    /// text; the linear layers run on every row at once. `camera` tokens modulate the
    /// result when the block has an adapter. Returns the new hidden states (stacked) and
    /// each segment's own keys/values (for its KV cache). Sharded, `h`,
    /// `positions` and `camera` are this rank's tokens (one segment), and the
    /// keys/values (past and own) cover the SP group's tokens with this rank's heads.
    pub fn forward(
        &self,
        h: &Tensor,
        segments: &[Segment<'_>],
        rope: (&RopeTable, &[[usize; 3]]),
        mask: Mask,
        camera: Option<&Tensor>,
        shard: Option<&Sharding>,
    ) -> Result<(Tensor, Vec<KeyValues>)> {
        let lens: Vec<usize> = segments.iter().map(|s| s.len).collect();
        let m: Vec<Vec<Tensor>> = segments
            .iter()
            .map(|s| self.modulation(s.tproj))
            .collect::<Result<_>>()?;
        let qkv = [&self.attn1.to_q, &self.attn1.to_k, &self.attn1.to_v];
        let a = per_segment(h, &lens, |x, i, _| {
            modulate(x, &m[i][0], &m[i][1], self.eps, &qkv)
        })?;
        let stacked = self.attn1.key_values(&a, Some(rope), shard, true)?;
        // Each segment's own keys/values (one segment: all of them, which after the
        // Ulysses exchange cover the whole SP group), then its past followed by them.
        let own: Vec<KeyValues> = if let [_] = lens[..] {
            vec![stacked]
        } else {
            let mut start = 0;
            lens.iter()
                .map(|&len| {
                    let kv = KeyValues {
                        k: stacked.k.narrow(1, start, len)?,
                        v: stacked.v.narrow(1, start, len)?,
                    };
                    start += len;
                    Ok(kv)
                })
                .collect::<Result<_>>()?
        };
        let all = own
            .iter()
            .zip(segments)
            .map(|(kv, seg)| match seg.past {
                Some(p) => Ok(KeyValues {
                    k: Tensor::cat(&[&p.k, &kv.k], 1)?,
                    v: Tensor::cat(&[&p.v, &kv.v], 1)?,
                }),
                None => Ok(kv.clone()),
            })
            .collect::<Result<Vec<_>>>()?;
        let o = self.attn1.attend(
            &a,
            Some(rope),
            &all.iter().collect::<Vec<_>>(),
            &lens,
            mask,
            shard,
            true,
        )?;
        drop(all);
        let mut h = per_segment(h, &lens, |x, i, start| {
            Ok(x.add_mul(&o.narrow(1, start, lens[i])?, &m[i][2])?)
        })?;
        drop(o);
        if let (Some(injection), Some(cam)) = (&self.camera, camera) {
            h = injection.apply(&h, cam)?;
        }
        let a = match &self.norm2 {
            // Only the cross-attention's query product reads it.
            Some((w, b)) => {
                let dtype = if self.attn2.to_q.reads_bf16() {
                    DType::BF16
                } else {
                    h.dtype()
                };
                h.layer_norm_as(Some(w), Some(b), self.eps, dtype)?
            }
            None => h.clone(),
        };
        let texts: Vec<&KeyValues> = segments.iter().map(|s| s.text).collect();
        let h = h.add(
            &self
                .attn2
                .attend(&a, None, &texts, &lens, Mask::None, shard, false)?,
        )?;
        let a = per_segment(&h, &lens, |x, i, _| {
            modulate(x, &m[i][3], &m[i][4], self.eps, &[&self.ffn_in])
        })?;
        let hidden = self
            .ffn_in
            .forward_gelu_tanh_into(&a, Some(&self.ffn_out))?;
        let f = shard::col_split_forward(shard, &self.ffn_out, &hidden)?;
        let h = per_segment(&h, &lens, |x, i, start| {
            Ok(x.add_mul(&f.narrow(1, start, lens[i])?, &m[i][5])?)
        })?;
        Ok((h, own))
    }
}

/// One session's rows of a stacked block forward.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    /// Rows (tokens) of the segment on this rank.
    pub len: usize,
    /// The projection of its timestep, `[1, 6, dim]`.
    pub tproj: &'a Tensor,
    /// Keys/values of its earlier tokens, if any.
    pub past: Option<&'a KeyValues>,
    /// Its cross-attention keys/values.
    pub text: &'a KeyValues,
}
