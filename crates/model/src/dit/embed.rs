//! The condition embedder (WAN.md §3.5): sinusoidal timestep → `temb` and the 6-way
//! modulation `tproj`; text → context tokens.

use headroom_tensor::kernels::activation::Activation;
use headroom_tensor::ops::int8::Int8Linear;
use headroom_tensor::ops::packed::PackedLinear;
use headroom_tensor::{DType, Device, Tensor};

use super::config::DitConfig;
use crate::error::Result;
use crate::weights::{Init, WeightFormat, WeightStore};

/// `Timesteps(freq_dim, flip_sin_to_cos=True, shift=0)` in f32 arithmetic as PyTorch does
/// it: `[cos(t·f_k), sin(t·f_k)]` with `f_k = exp(−ln(10000)·k / half)`.
pub fn timestep_sinusoid(t: f32, freq_dim: usize) -> Vec<f32> {
    let half = freq_dim / 2;
    let scale = -(10000f64.ln() as f32);
    let args: Vec<f32> = (0..half)
        .map(|k| t * ((scale * k as f32) / half as f32).exp())
        .collect();
    args.iter()
        .map(|a| a.cos())
        .chain(args.iter().map(|a| a.sin()))
        .collect()
}

/// A `Linear` with its bias.
#[derive(Debug)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: LinearWeight,
    /// `[out]`.
    pub bias: Tensor,
}

/// A linear layer's weight as the products read it.
#[derive(Debug)]
pub enum LinearWeight {
    /// The `[out, in]` tensor as loaded.
    Plain(Tensor),
    /// Packed once for the AMX tiles (bf16 weights where the CPU path has them): the
    /// plain tensor is dropped, so the packed one costs no extra memory.
    Packed(PackedLinear),
    /// Quantized to int8 per output channel (`--weights int8`): the products quantize
    /// their input per token. `dtype` is the one it was loaded in, which the layer's
    /// other products (attention) keep computing in.
    Int8 {
        /// The quantized, packed weight.
        weight: Int8Linear,
        /// The load dtype.
        dtype: DType,
    },
    /// 8-bit float codes `[out, in]` and their scale (`[1]` or `[out]`), as an fp8 file
    /// ships them or `--weights fp8` makes them: widened to bf16 while each product
    /// packs them.
    Fp8 {
        /// The codes (`F8E4M3` or `F8E5M2`).
        weight: Tensor,
        /// One scale, or one per output channel.
        scale: Tensor,
        /// The load dtype.
        dtype: DType,
    },
}

impl LinearWeight {
    /// `weight` packed where the products would pack it on every call, else as it is.
    pub fn new(weight: Tensor) -> Result<Self> {
        Ok(match weight.pack_linear()? {
            Some(p) => LinearWeight::Packed(p),
            None => LinearWeight::Plain(weight),
        })
    }

    /// `weight` held as `format` asks: int8, or as [`LinearWeight::new`] holds it.
    pub fn with_format(weight: Tensor, format: WeightFormat) -> Result<Self> {
        Ok(match format {
            WeightFormat::Native => Self::new(weight)?,
            WeightFormat::Int8 => LinearWeight::Int8 {
                weight: weight.quantize_linear_int8()?,
                dtype: weight.dtype(),
            },
            WeightFormat::Fp8 => {
                let (codes, scale) = weight.quantize_fp8()?;
                LinearWeight::Fp8 {
                    weight: codes,
                    scale,
                    dtype: weight.dtype(),
                }
            }
        })
    }

    /// An 8-bit weight as the file ships it (`codes` and their `scale`), held as `format`
    /// asks: kept (native), or dequantized in `dtype` and quantized again.
    pub fn from_codes(
        codes: Tensor,
        scale: Tensor,
        dtype: DType,
        format: WeightFormat,
    ) -> Result<Self> {
        let stored = codes.dtype();
        Ok(match (format, stored) {
            (WeightFormat::Native | WeightFormat::Int8, DType::I8) => LinearWeight::Int8 {
                weight: Int8Linear::from_codes(&codes, &scale)?,
                dtype,
            },
            (WeightFormat::Native | WeightFormat::Fp8, DType::F8E4M3 | DType::F8E5M2) => {
                LinearWeight::Fp8 {
                    weight: codes,
                    scale,
                    dtype,
                }
            }
            _ => Self::with_format(
                crate::weights::dequantize(&codes, &scale)?.to_dtype(dtype)?,
                format,
            )?,
        })
    }

    /// The dtype the products compute in follows: bf16 for a packed weight, the load
    /// dtype for an int8 one.
    pub fn dtype(&self) -> DType {
        match self {
            LinearWeight::Plain(t) => t.dtype(),
            LinearWeight::Packed(_) => DType::BF16,
            LinearWeight::Int8 { dtype, .. } | LinearWeight::Fp8 { dtype, .. } => *dtype,
        }
    }
}

impl Linear {
    fn new(weight: Tensor, bias: Tensor) -> Result<Self> {
        Ok(Self {
            weight: LinearWeight::new(weight)?,
            bias,
        })
    }

    /// Loads `{prefix}.weight` `[out, in]` and `{prefix}.bias`, in `dtype`.
    pub fn load(
        w: &WeightStore,
        prefix: &str,
        input: usize,
        output: usize,
        dtype: Option<DType>,
    ) -> Result<Self> {
        let weight_key = format!("{prefix}.weight");
        let bias_key = format!("{prefix}.bias");
        match dtype {
            Some(d) => Self::new(
                w.get_as(&weight_key, &[output, input], Init::FanIn, d)?,
                w.get_as(&bias_key, &[output], Init::Scaled(0.05), d)?,
            ),
            None => Self::new(
                w.get(&weight_key, &[output, input], Init::FanIn)?,
                w.get_as(&bias_key, &[output], Init::Scaled(0.05), DType::F32)?,
            ),
        }
    }

    /// This rank's part of a tensor-parallel `Linear` in the store's dtype: `Split::Rows`
    /// keeps a slice of the outputs (and of the bias), `Split::Cols` a slice of the
    /// inputs (and the whole bias, added once after the all-reduce).
    pub fn load_split(
        w: &WeightStore,
        prefix: &str,
        input: usize,
        output: usize,
        split: Split,
    ) -> Result<Self> {
        let weight_key = format!("{prefix}.weight");
        let bias_key = format!("{prefix}.bias");
        let dtype = w.dtype();
        let (weight_axis, part) = match split {
            Split::Rows(part) => (0, part),
            Split::Cols(part) => (1, part),
        };
        let bias_part = match split {
            Split::Rows(part) => part,
            Split::Cols(_) => (0, 1),
        };
        let shape = [output, input];
        let weight = match w.quantized_part(&weight_key, &shape, weight_axis, part)? {
            Some((codes, scale)) => LinearWeight::from_codes(codes, scale, dtype, w.format())?,
            None => {
                let weight =
                    w.get_part(&weight_key, &shape, Init::FanIn, dtype, weight_axis, part)?;
                LinearWeight::with_format(weight, w.format())?
            }
        };
        Ok(Self {
            weight,
            bias: w.get_part(
                &bias_key,
                &[output],
                Init::Scaled(0.05),
                DType::F32,
                0,
                bias_part,
            )?,
        })
    }

    /// Whether the products take their input in bf16 at no cost: a packed or fp8 weight
    /// rounds it to bf16 anyway (the same bits), and an int8 weight of a bf16 model quantizes it
    /// (half the bytes to read, an error far inside the quantization's).
    pub fn reads_bf16(&self) -> bool {
        match self.weight {
            LinearWeight::Plain(_) => false,
            LinearWeight::Packed(_) => true,
            LinearWeight::Int8 { dtype, .. } => dtype == DType::BF16,
            // Its products round their input to bf16 (the same bits either way).
            LinearWeight::Fp8 { .. } => true,
        }
    }

    /// `x · Wᵀ + b`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.product(x, Some(&self.bias))
    }

    /// `x · Wᵀ` without the bias (a column shard, before its all-reduce).
    pub fn forward_no_bias(&self, x: &Tensor) -> Result<Tensor> {
        self.product(x, None)
    }

    /// `gelu_tanh(x · Wᵀ + b)`, fused into the product where the weight is packed (the
    /// same bits either way) and into cuBLASLt's epilogue on a GPU.
    pub fn forward_gelu_tanh(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_gelu_tanh_into(x, None)
    }

    /// [`Linear::forward_gelu_tanh`] for a result that only `next` reads: where both
    /// weights are packed, `next` rounds its input to bf16 anyway, so the result is
    /// rounded while each block is in cache and stored in half the bytes (the same bits
    /// of `next`'s output).
    pub fn forward_gelu_tanh_into(&self, x: &Tensor, next: Option<&Linear>) -> Result<Tensor> {
        Ok(match &self.weight {
            LinearWeight::Plain(w) => x.linear_gelu_tanh(w, &self.bias)?,
            LinearWeight::Packed(w) => {
                let dtype = match next {
                    Some(n) if n.reads_bf16() => DType::BF16,
                    _ => DType::F32,
                };
                x.linear_packed_as(w, Some(&self.bias), Some(Activation::GeluTanh), dtype)?
            }
            LinearWeight::Int8 { weight, .. } => {
                let dtype = match next {
                    Some(n) if n.reads_bf16() => DType::BF16,
                    _ => DType::F32,
                };
                x.linear_int8_as(weight, Some(&self.bias), Some(Activation::GeluTanh), dtype)?
            }
            LinearWeight::Fp8 { weight, scale, .. } => {
                x.linear_fp8_then(weight, scale, Some(&self.bias), Some(Activation::GeluTanh))?
            }
        })
    }

    fn product(&self, x: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        Ok(match &self.weight {
            LinearWeight::Plain(w) => x.linear(w, bias)?,
            LinearWeight::Packed(w) => x.linear_packed(w, bias)?,
            LinearWeight::Int8 { weight, .. } => x.linear_int8(weight, bias)?,
            LinearWeight::Fp8 { weight, scale, .. } => x.linear_fp8(weight, scale, bias)?,
        })
    }
}

/// Which part of a `Linear` a tensor-parallel rank holds: `(index, parts)` of its
/// output rows or of its input columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// A slice of the outputs.
    Rows((usize, usize)),
    /// A slice of the inputs.
    Cols((usize, usize)),
}

/// `WanTimeTextImageEmbedding` without the image branch.
#[derive(Debug)]
pub struct ConditionEmbedder {
    freq_dim: usize,
    time_1: Linear,
    time_2: Linear,
    time_proj: Linear,
    text_1: Linear,
    text_2: Linear,
}

impl ConditionEmbedder {
    /// Loads `condition_embedder.*` (the time MLP stays f32, as diffusers keeps it).
    pub fn load(w: &WeightStore, c: &DitConfig) -> Result<Self> {
        let dim = c.dim();
        let p = "condition_embedder";
        Ok(Self {
            freq_dim: c.freq_dim,
            time_1: Linear::load(
                w,
                &format!("{p}.time_embedder.linear_1"),
                c.freq_dim,
                dim,
                Some(DType::F32),
            )?,
            time_2: Linear::load(
                w,
                &format!("{p}.time_embedder.linear_2"),
                dim,
                dim,
                Some(DType::F32),
            )?,
            time_proj: Linear::load(w, &format!("{p}.time_proj"), dim, 6 * dim, None)?,
            text_1: Linear::load(
                w,
                &format!("{p}.text_embedder.linear_1"),
                c.text_dim,
                dim,
                None,
            )?,
            text_2: Linear::load(w, &format!("{p}.text_embedder.linear_2"), dim, dim, None)?,
        })
    }

    /// `(temb [1, dim], tproj [1, 6, dim])` for timestep `t`.
    pub fn time(&self, t: f32, device: &Device) -> Result<(Tensor, Tensor)> {
        let emb = Tensor::from_slice(
            &timestep_sinusoid(t, self.freq_dim),
            &[1, self.freq_dim],
            device,
        )?;
        let temb = self.time_2.forward(&self.time_1.forward(&emb)?.silu()?)?;
        let tproj = self.time_proj.forward(&temb.silu()?)?;
        let dim = temb.shape()[1];
        Ok((temb, tproj.reshape(&[1, 6, dim])?))
    }

    /// Text tokens `[S, text_dim]` → context `[1, S, dim]`.
    pub fn text(&self, text: &Tensor) -> Result<Tensor> {
        let h = self
            .text_2
            .forward(&self.text_1.forward(text)?.gelu_tanh()?)?;
        Ok(h.unsqueeze(0)?)
    }
}
