//! The checkpoints users download, in whatever layout: one module per layout, each
//! turning its keys into our (diffusers) parameter names, and the detection that picks
//! the layout from what is in the path.
//!
//! | path | layout |
//! |---|---|
//! | folder with `transformer/` + `vae/` | diffusers pipeline ([`diffusers`]) |
//! | folder with a diffusers `config.json` | diffusers model folder |
//! | folder with an original `config.json` (`dim`, `num_heads`, …) | original Wan ([`wan`]); VAE `Wan2.1_VAE.pth` ([`wan_vae`]) |
//! | folder with `transformers/` or `high_noise_model/` | LingBot-World ([`lingbot`]) |
//! | `.pt` / `.pth` with `generator_ema.` / `generator.` | Self-Forcing ([`self_forcing`]) |
//! | `.safetensors` with `model.diffusion_model.` | ComfyUI single file ([`comfy`]) |
//!
//! The architecture comes from `--config FILE` (diffusers or original keys) if given,
//! else from the checkpoint's `config.json`, else from a base model's config when the
//! shapes agree with it (a Self-Forcing `.pt` over the Wan2.1 folder it was tuned from),
//! else from the tensor shapes, with `num_heads = dim / 128` as in every Wan model.

pub mod comfy;
pub mod diffusers;
pub mod lingbot;
pub mod self_forcing;
pub mod wan;
pub mod wan_vae;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use headroom_tensor::{DType, Device};

use crate::checkpoint::{io_err, Tensors};
use crate::dit::{DitConfig, Sharding, WanTransformer};
use crate::error::{ModelError, Result};
use crate::vae::{VaeConfig, WanVae};
use crate::weights::{read_config, read_json, WeightFormat, WeightStore};

/// Where the architecture may come from besides the checkpoint itself.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// `--config FILE`: a diffusers or original config that overrides everything else.
    pub config: Option<PathBuf>,
    /// The base model's transformer config, used when the checkpoint has none and its
    /// shapes agree with it.
    pub base: Option<DitConfig>,
    /// How the transformer's large linear weights are held (`--weights`).
    pub weights: WeightFormat,
}

/// The names of the original Wan VAE and T5 files in a Wan2.1 repo folder.
pub const WAN_VAE_FILE: &str = "Wan2.1_VAE.pth";

/// Whether `dir` is an original Wan repo folder (not a diffusers pipeline).
pub fn is_wan_repo(dir: &Path) -> bool {
    dir.join(WAN_VAE_FILE).is_file() || read_config(dir).is_ok_and(|c| wan::is_original_config(&c))
}

/// Loads a transformer from any supported layout (see the module doc).
pub fn load_transformer(
    path: &Path,
    options: &ImportOptions,
    device: &Device,
    dtype: DType,
    shard: Option<Sharding>,
) -> Result<WanTransformer> {
    let (config, store) = open_transformer(path, options, device, dtype)?;
    let store = store.with_format(options.weights);
    let model = WanTransformer::from_store_sharded(config, &store, shard)?;
    if store.layout() != "diffusers" {
        store.check_all_used(&path.display().to_string())?;
    }
    Ok(model)
}

/// The transformer config and weights of `path`, in any supported layout.
pub fn open_transformer(
    path: &Path,
    options: &ImportOptions,
    device: &Device,
    dtype: DType,
) -> Result<(DitConfig, WeightStore)> {
    let (tensors, folder_config) = if path.is_dir() {
        let mut dir = path.to_path_buf();
        if dir.join("transformer").is_dir() {
            dir = dir.join("transformer");
        } else if let Some(inner) = lingbot::transformer_dir(&dir)? {
            dir = inner;
        }
        let config = dir
            .join("config.json")
            .is_file()
            .then(|| read_config(&dir))
            .transpose()?;
        (Tensors::stem(&dir, "diffusion_pytorch_model")?, config)
    } else if path.is_file() {
        (Tensors::single(path)?, None)
    } else {
        return Err(io_err(path, "no such file or folder"));
    };
    let names: Vec<String> = tensors.names.keys().cloned().collect();
    // Wrappers first, then the names under them.
    let wrapper = self_forcing::prefix(names.iter())
        .map(|p| (p, "Self-Forcing"))
        .or_else(|| comfy::prefix(names.iter()).map(|p| (p, "ComfyUI")));
    let unwrap = |k: &str| -> Option<String> {
        match wrapper {
            Some((p, "Self-Forcing")) => self_forcing::unwrap(k, p),
            Some((p, _)) => comfy::unwrap(k, p),
            None => Some(k.to_string()),
        }
    };
    let inner: Vec<String> = names.iter().filter_map(|k| unwrap(k)).collect();
    let original = wan::has_original_names(inner.iter());
    if !original && !diffusers::has_dit_names(inner.iter()) {
        return Err(io_err(
            path,
            format!(
                "no Wan transformer tensors found (neither original Wan nor diffusers names); first keys: {}",
                crate::weights::first_few(names.iter(), 5)
            ),
        ));
    }
    let mut layout = match (wrapper, original) {
        (Some((p, who)), true) => format!("{who} ({p} + original Wan names)"),
        (Some((p, who)), false) => format!("{who} ({p} + diffusers names)"),
        (None, true) => "original Wan".to_string(),
        (None, false) => "diffusers".to_string(),
    };
    if inner.iter().any(|k| lingbot::is_camera_key(k)) && original {
        layout.push_str(" + LingBot camera adapter");
    }
    let store = WeightStore::renamed(
        tensors,
        |k| {
            let k = unwrap(k)?;
            Some(if original { wan::rename(&k) } else { k })
        },
        &layout,
        device,
        dtype,
    );
    let config = if let Some(file) = &options.config {
        dit_config_from_json(&read_json(file)?)?
    } else if let Some(value) = folder_config {
        dit_config_from_json(&value)?
    } else {
        match &options.base {
            Some(base) if same_shapes(base, &shape_facts(&store)?) => base.clone(),
            _ => dit_config_from_shapes(&store)?,
        }
    };
    Ok((config, store))
}

/// A transformer config in diffusers or original keys.
pub fn dit_config_from_json(value: &serde_json::Value) -> Result<DitConfig> {
    if wan::is_original_config(value) {
        wan::config_from_original(value)
    } else {
        DitConfig::from_json(value)
    }
}

/// Whether two configs describe tensors of the same shapes (heads may differ).
fn same_shapes(a: &DitConfig, b: &DitConfig) -> bool {
    a.dim() == b.dim()
        && a.num_layers == b.num_layers
        && a.ffn_dim == b.ffn_dim
        && a.in_channels == b.in_channels
        && a.out_channels() == b.out_channels()
        && a.text_dim == b.text_dim
        && a.freq_dim == b.freq_dim
        && a.patch_size == b.patch_size
        && a.cross_attn_norm == b.cross_attn_norm
}

/// The transformer config implied by the tensor shapes of `store` (our names), with
/// `num_heads = dim / 128` as in every Wan model.
pub fn dit_config_from_shapes(store: &WeightStore) -> Result<DitConfig> {
    let facts = shape_facts(store)?;
    let dim = facts.dim();
    if !dim.is_multiple_of(128) {
        return Err(ModelError::config(
            "num_attention_heads",
            format!("dim {dim} is not a multiple of 128, so the head count cannot be inferred (Wan heads are 128 wide); pass --config"),
        ));
    }
    let config = DitConfig {
        num_attention_heads: dim / 128,
        attention_head_dim: 128,
        ..facts
    };
    config.validate()?;
    Ok(config)
}

/// What the shapes say, with one head as wide as `dim` (not validated).
fn shape_facts(store: &WeightStore) -> Result<DitConfig> {
    let need = |key: &str| -> Result<Vec<usize>> {
        store.shape_of(key).ok_or_else(|| {
            ModelError::config(
                "transformer",
                format!(
                    "cannot infer the config from shapes without tensor {key:?} (layout {}); pass --config",
                    store.layout()
                ),
            )
        })
    };
    let patch = need("patch_embedding.weight")?;
    let [dim, in_channels, pt, ph, pw] = patch[..] else {
        return Err(ModelError::config(
            "patch_embedding.weight",
            format!("must be 5-D [dim, in, pt, ph, pw], got {patch:?}"),
        ));
    };
    let keys = store.keys();
    let num_layers = keys
        .iter()
        .filter_map(|k| {
            k.strip_prefix("blocks.")?
                .split_once('.')?
                .0
                .parse::<usize>()
                .ok()
        })
        .max()
        .map_or(0, |m| m + 1);
    let ffn_dim = need("blocks.0.ffn.net.0.proj.weight")?[0];
    let text_dim = need("condition_embedder.text_embedder.linear_1.weight")?[1];
    let freq_dim = need("condition_embedder.time_embedder.linear_1.weight")?[1];
    let out = need("proj_out.weight")?[0] / (pt * ph * pw).max(1);
    let has = |k: &str| keys.iter().any(|key| key == k);
    let image = keys
        .iter()
        .any(|k| k.starts_with("condition_embedder.image_embedder."));
    let config = DitConfig {
        patch_size: [pt, ph, pw],
        num_attention_heads: 1,
        attention_head_dim: dim,
        in_channels,
        out_channels: Some(out),
        text_dim,
        freq_dim,
        ffn_dim,
        num_layers,
        cross_attn_norm: has("blocks.0.norm2.weight"),
        qk_norm: has("blocks.0.attn1.norm_q.weight").then(|| "rms_norm_across_heads".to_string()),
        image_dim: image.then(|| serde_json::json!(1280)),
        ..DitConfig::default()
    };
    Ok(config)
}

/// The VAE file or folder of `path`: a diffusers pipeline's `vae/`, a diffusers VAE
/// folder, a Wan repo folder's `Wan2.1_VAE.pth`, or a checkpoint file.
fn vae_path(path: &Path) -> PathBuf {
    if path.join("vae").is_dir() {
        path.join("vae")
    } else if path.join(WAN_VAE_FILE).is_file() {
        path.join(WAN_VAE_FILE)
    } else {
        path.to_path_buf()
    }
}

/// Loads a VAE from any supported layout.
pub fn load_vae(
    path: &Path,
    options: &ImportOptions,
    device: &Device,
    dtype: DType,
) -> Result<WanVae> {
    let (config, store) = open_vae(path, options, device, dtype)?;
    let vae = WanVae::from_store(config, &store)?;
    if store.layout() != "diffusers" {
        store.check_all_used(&path.display().to_string())?;
    }
    Ok(vae)
}

/// The VAE config and weights of `path`, in any supported layout.
pub fn open_vae(
    path: &Path,
    options: &ImportOptions,
    device: &Device,
    dtype: DType,
) -> Result<(VaeConfig, WeightStore)> {
    let path = vae_path(path);
    let overridden = options
        .config
        .as_ref()
        .map(|f| VaeConfig::from_json(&read_json(f)?))
        .transpose()?;
    if path.is_dir() {
        let config = match overridden {
            Some(c) => c,
            None => VaeConfig::from_json(&read_config(&path)?)?,
        };
        return Ok((config, WeightStore::from_dir(&path, device, dtype)?));
    }
    if !path.is_file() {
        return Err(io_err(&path, "no such file or folder"));
    }
    let tensors = Tensors::single(&path)?;
    let names: Vec<String> = tensors.names.keys().cloned().collect();
    if !wan_vae::has_original_names(names.iter()) {
        let Some(config) = overridden else {
            return Err(io_err(
                &path,
                "a VAE file in diffusers names carries no config: pass --config (a diffusers vae/config.json)",
            ));
        };
        return Ok((
            config,
            WeightStore::renamed(tensors, |k| Some(k.to_string()), "diffusers", device, dtype),
        ));
    }
    let config = match overridden {
        Some(c) => c,
        None => {
            let mut shapes = BTreeMap::new();
            for (name, &file) in &tensors.names {
                shapes.insert(name.clone(), tensors.files[file].info(name)?.0);
            }
            wan_vae::config_from_shapes(&shapes)?
        }
    };
    let blocks = config.num_res_blocks;
    let store = WeightStore::renamed(
        tensors,
        |k| Some(wan_vae::rename(k, blocks).unwrap_or_else(|| k.to_string())),
        "original Wan VAE",
        device,
        dtype,
    );
    Ok((config, store))
}
