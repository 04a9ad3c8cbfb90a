//! The original Wan 2.1 VAE layout (`Wan2.1_VAE.pth`, `wan/modules/vae.py`, and the
//! ComfyUI `wan_2.1_vae.safetensors` that keeps its names), turned into diffusers'
//! `AutoencoderKLWan` names, after the mapping diffusers' `convert_wan_vae_to_diffusers`
//! performs. The trap is the decoder: the original keeps one flat list
//! `decoder.upsamples.K` (per stage `num_res_blocks + 1` residual blocks, then a
//! resample), diffusers groups it as `decoder.up_blocks.i.{resnets.r, upsamplers.0}`.
//! The grouping here follows the config rather than a fixed table, so any stage count
//! works. The files carry no config: it comes from the tensor shapes.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{ModelError, Result};
use crate::vae::VaeConfig;

/// Whether `names` use the original Wan VAE key names.
pub fn has_original_names<'a>(mut names: impl Iterator<Item = &'a String>) -> bool {
    names.any(|k| k.starts_with("decoder.upsamples.") || k.starts_with("encoder.downsamples."))
}

/// The residual block's `residual.N` sequence → diffusers names.
fn residual(rest: &str) -> Option<String> {
    const PARTS: [(&str, &str); 5] = [
        ("residual.0.", "norm1."),
        ("residual.2.", "conv1."),
        ("residual.3.", "norm2."),
        ("residual.6.", "conv2."),
        ("shortcut.", "conv_shortcut."),
    ];
    PARTS
        .iter()
        .find_map(|(from, to)| rest.strip_prefix(from).map(|tail| format!("{to}{tail}")))
}

/// The middle block `middle.{0,1,2}` → `mid_block.{resnets.0, attentions.0, resnets.1}`.
fn middle(rest: &str) -> Option<String> {
    let (index, tail) = rest.split_once('.')?;
    Some(match index {
        "0" => format!("mid_block.resnets.0.{}", residual(tail)?),
        "1" => format!("mid_block.attentions.0.{tail}"),
        "2" => format!("mid_block.resnets.1.{}", residual(tail)?),
        _ => return None,
    })
}

/// Our (diffusers) name of original VAE tensor `key`, for a decoder with
/// `num_res_blocks`; `None` for a key the layout does not know.
pub fn rename(key: &str, num_res_blocks: usize) -> Option<String> {
    match key {
        k if k.starts_with("conv1.") => return Some(k.replacen("conv1.", "quant_conv.", 1)),
        k if k.starts_with("conv2.") => return Some(k.replacen("conv2.", "post_quant_conv.", 1)),
        _ => {}
    }
    let (coder, rest) = key.split_once('.')?;
    if coder != "encoder" && coder != "decoder" {
        return None;
    }
    let inner = if let Some(tail) = rest.strip_prefix("conv1.") {
        format!("conv_in.{tail}")
    } else if let Some(tail) = rest.strip_prefix("head.0.") {
        format!("norm_out.{tail}")
    } else if let Some(tail) = rest.strip_prefix("head.2.") {
        format!("conv_out.{tail}")
    } else if let Some(tail) = rest.strip_prefix("middle.") {
        middle(tail)?
    } else if let Some(tail) = rest.strip_prefix("downsamples.") {
        // The encoder's list stays flat in diffusers.
        let (index, part) = tail.split_once('.')?;
        let part = residual(part).unwrap_or_else(|| part.to_string());
        format!("down_blocks.{index}.{part}")
    } else if let Some(tail) = rest.strip_prefix("upsamples.") {
        let (index, part) = tail.split_once('.')?;
        let k: usize = index.parse().ok()?;
        // Per stage: num_res_blocks + 1 residual blocks, then one resample.
        let per_stage = num_res_blocks + 2;
        let (stage, pos) = (k / per_stage, k % per_stage);
        if pos == per_stage - 1 {
            format!("up_blocks.{stage}.upsamplers.0.{part}")
        } else {
            format!("up_blocks.{stage}.resnets.{pos}.{}", residual(part)?)
        }
    } else {
        return None;
    };
    Some(format!("{coder}.{inner}"))
}

/// Wan 2.1's latent statistics (the pipeline's constants for its 16-channel VAE).
fn wan21_latent_stats() -> (Vec<f32>, Vec<f32>) {
    let d = VaeConfig::default();
    (d.latents_mean, d.latents_std)
}

/// The VAE config implied by original-layout tensor shapes (`shapes`: stored name →
/// shape). Attention inside the encoder or decoder stages is not supported.
pub fn config_from_shapes(shapes: &BTreeMap<String, Vec<usize>>) -> Result<VaeConfig> {
    let need = |key: &str, dim: usize| -> Result<usize> {
        shapes
            .get(key)
            .and_then(|s| s.get(dim).copied())
            .ok_or_else(|| {
                ModelError::config(
                    "vae",
                    format!("cannot infer the config from shapes: no tensor {key:?} (is this a Wan 2.1 VAE?)"),
                )
            })
    };
    let base_dim = need("encoder.conv1.weight", 0)?;
    let in_channels = need("encoder.conv1.weight", 1)?;
    let z_dim = need("conv2.weight", 0)?;
    let out_channels = need("decoder.head.2.weight", 0)?;
    // The encoder's flat list, in order: which indices are residual blocks, resamples.
    let indices: BTreeSet<usize> = shapes
        .keys()
        .filter_map(|k| {
            k.strip_prefix("encoder.downsamples.")?
                .split_once('.')?
                .0
                .parse()
                .ok()
        })
        .collect();
    let mut dim_mult = Vec::new();
    let mut temporal = Vec::new();
    let mut res_in_stage = 0;
    let mut num_res_blocks = None;
    let mut last_width = base_dim;
    for k in indices {
        let p = format!("encoder.downsamples.{k}");
        if shapes.contains_key(&format!("{p}.residual.6.weight")) {
            last_width = need(&format!("{p}.residual.6.weight"), 0)?;
            res_in_stage += 1;
        } else if shapes.contains_key(&format!("{p}.resample.1.weight")) {
            num_res_blocks.get_or_insert(res_in_stage);
            dim_mult.push(last_width / base_dim.max(1));
            temporal.push(shapes.contains_key(&format!("{p}.time_conv.weight")));
            res_in_stage = 0;
        } else {
            return Err(ModelError::config(
                "attn_scales",
                format!("{p} is neither a residual block nor a resample: attention inside the encoder stages is not supported"),
            ));
        }
    }
    dim_mult.push(last_width / base_dim.max(1));
    let num_res_blocks = num_res_blocks.unwrap_or(res_in_stage);
    let (latents_mean, latents_std) = if z_dim == 16 {
        wan21_latent_stats()
    } else {
        (Vec::new(), Vec::new())
    };
    let config = VaeConfig {
        base_dim,
        z_dim,
        dim_mult,
        num_res_blocks,
        attn_scales: Vec::new(),
        temperal_downsample: temporal,
        in_channels,
        out_channels,
        latents_mean,
        latents_std,
        ..VaeConfig::default()
    };
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoder_upsamples_regroup_into_up_blocks() {
        // Wan 2.1: num_res_blocks = 2, so 3 resnets + 1 resample per stage.
        for (from, to) in [
            (
                "decoder.upsamples.0.residual.0.gamma",
                "decoder.up_blocks.0.resnets.0.norm1.gamma",
            ),
            (
                "decoder.upsamples.2.residual.6.bias",
                "decoder.up_blocks.0.resnets.2.conv2.bias",
            ),
            (
                "decoder.upsamples.3.resample.1.weight",
                "decoder.up_blocks.0.upsamplers.0.resample.1.weight",
            ),
            (
                "decoder.upsamples.4.shortcut.weight",
                "decoder.up_blocks.1.resnets.0.conv_shortcut.weight",
            ),
            (
                "decoder.upsamples.7.time_conv.bias",
                "decoder.up_blocks.1.upsamplers.0.time_conv.bias",
            ),
            (
                "decoder.upsamples.14.residual.3.gamma",
                "decoder.up_blocks.3.resnets.2.norm2.gamma",
            ),
            (
                "encoder.downsamples.5.residual.2.weight",
                "encoder.down_blocks.5.conv1.weight",
            ),
            (
                "encoder.downsamples.2.resample.1.bias",
                "encoder.down_blocks.2.resample.1.bias",
            ),
            (
                "encoder.middle.1.to_qkv.weight",
                "encoder.mid_block.attentions.0.to_qkv.weight",
            ),
            (
                "decoder.middle.2.residual.3.gamma",
                "decoder.mid_block.resnets.1.norm2.gamma",
            ),
            ("encoder.head.2.weight", "encoder.conv_out.weight"),
            ("decoder.head.0.gamma", "decoder.norm_out.gamma"),
            ("decoder.conv1.bias", "decoder.conv_in.bias"),
            ("conv1.weight", "quant_conv.weight"),
            ("conv2.bias", "post_quant_conv.bias"),
        ] {
            assert_eq!(rename(from, 2).as_deref(), Some(to), "{from}");
        }
        assert_eq!(rename("model.unknown", 2), None);
    }
}
