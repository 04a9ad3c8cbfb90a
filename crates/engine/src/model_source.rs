//! What `--model` names, resolved before any weights load: a built-in preset, a
//! diffusers pipeline folder or an original Wan repo folder; the architecture each one
//! declares; and the rules a request's shape must meet under it, so a size or frame
//! count that cannot work is refused before the weights load.

use std::path::{Path, PathBuf};

use headroom_model::import;
use headroom_model::{DitConfig, VaeConfig};

use crate::blocks::{latent_frames_in_blocks, BLOCK_FRAMES};
use crate::error::{EngineError, Result};
use crate::preset::{ModelPreset, PRESETS};

/// Where a model's weights come from.
#[derive(Debug, Clone)]
pub enum ModelSource {
    /// A built-in preset with seeded weights.
    Preset(Box<ModelPreset>),
    /// A diffusers pipeline folder (`transformer/` + `vae/`).
    Pipeline(PathBuf),
    /// An original Wan repo folder (`config.json`, `Wan2.1_VAE.pth`, DiT safetensors).
    WanRepo(PathBuf),
}

fn refuse(rule: String) -> EngineError {
    EngineError::request("model", rule)
}

fn read_json(file: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| refuse(format!("{}: cannot read it: {e}", file.display())))?;
    serde_json::from_str(&text).map_err(|e| refuse(format!("{}: not JSON: {e}", file.display())))
}

impl ModelSource {
    /// Resolves `model`: a folder on disk, else a preset name. A folder that is neither
    /// layout, a pipeline with a part or its transformer's `config.json` missing, a path
    /// that does not exist and an unknown name are each refused, saying which.
    pub fn resolve(model: &str) -> Result<Self> {
        let path = Path::new(model);
        if path.is_dir() {
            let (transformer, vae) = (path.join("transformer"), path.join("vae"));
            return match (transformer.is_dir(), vae.is_dir()) {
                (true, true) => {
                    if !transformer.join("config.json").is_file() {
                        return Err(refuse(format!(
                            "{model}: transformer/config.json is missing; the head count and widths cannot be read reliably from the weights, so copy the config.json that came with the checkpoint"
                        )));
                    }
                    Ok(ModelSource::Pipeline(path.to_path_buf()))
                }
                (true, false) | (false, true) => Err(refuse(format!(
                    "{model}: a diffusers pipeline folder needs both transformer/ and vae/; {} is missing",
                    if transformer.is_dir() { "vae/" } else { "transformer/" }
                ))),
                (false, false) if import::is_wan_repo(path) => {
                    if !path.join("config.json").is_file() {
                        return Err(refuse(format!(
                            "{model}: an original Wan folder needs its config.json (dim, num_heads, …) beside {}",
                            import::WAN_VAE_FILE
                        )));
                    }
                    Ok(ModelSource::WanRepo(path.to_path_buf()))
                }
                (false, false) => Err(refuse(format!(
                    "{model}: not a model folder; expected a diffusers pipeline (transformer/ and vae/) or an original Wan folder (config.json, {}, the DiT safetensors)",
                    import::WAN_VAE_FILE
                ))),
            };
        }
        if path.exists() {
            return Err(refuse(format!(
                "{model} is a file; --model takes a model folder or a built-in name (a transformer file goes to --transformer)"
            )));
        }
        if PRESETS.contains(&model) {
            return Ok(ModelSource::Preset(Box::new(ModelPreset::named(model)?)));
        }
        if looks_like_path(model) {
            return Err(refuse(format!("{model}: no such folder")));
        }
        Err(refuse(format!(
            "unknown model {model:?}; built-in models are {}",
            PRESETS.join(", ")
        )))
    }

    /// The folder holding real weights, `None` for a preset.
    pub fn folder(&self) -> Option<&Path> {
        match self {
            ModelSource::Preset(_) => None,
            ModelSource::Pipeline(p) | ModelSource::WanRepo(p) => Some(p),
        }
    }

    /// The transformer config the source declares (its `config.json` or the preset).
    pub fn dit_config(&self) -> Result<DitConfig> {
        match self {
            ModelSource::Preset(p) => Ok(p.dit.clone()),
            ModelSource::Pipeline(p) => Ok(import::dit_config_from_json(&read_json(
                &p.join("transformer/config.json"),
            )?)?),
            ModelSource::WanRepo(p) => Ok(import::dit_config_from_json(&read_json(
                &p.join("config.json"),
            )?)?),
        }
    }

    /// The VAE config the source declares (`vae/config.json`; the Wan2.1 VAE for an
    /// original folder, whose `.pth` carries no config).
    pub fn vae_config(&self) -> Result<VaeConfig> {
        match self {
            ModelSource::Preset(p) => Ok(p.vae.clone()),
            ModelSource::Pipeline(p) => Ok(VaeConfig::from_json(&read_json(
                &p.join("vae/config.json"),
            )?)?),
            ModelSource::WanRepo(_) => Ok(VaeConfig::default()),
        }
    }
}

/// The rules a session's size and length must meet under `dit` and `vae` (and, on a
/// mesh, `sp` ranks splitting a block's tokens): checked before the weights load and
/// again at every open. Returns the session's blocks: `None` for `num_frames = 0`, a
/// session that streams until it is stopped.
pub fn check_shape(
    dit: &DitConfig,
    vae: &VaeConfig,
    sp: usize,
    width: usize,
    height: usize,
    num_frames: usize,
) -> Result<Option<usize>> {
    let s = vae.spatial_factor() * dit.patch_size[1];
    if width == 0 || height == 0 || !width.is_multiple_of(s) || !height.is_multiple_of(s) {
        return Err(EngineError::request(
            "width/height",
            format!("must be positive multiples of {s}, got {width}x{height}"),
        ));
    }
    let max = dit.rope_max_seq_len;
    if width / s > max || height / s > max {
        return Err(EngineError::request(
            "width/height",
            format!(
                "{width}x{height} is {}x{} tokens; the model's rotary table covers at most {max} per side (at most {} pixels)",
                width / s,
                height / s,
                max * s
            ),
        ));
    }
    if num_frames != 0 && (num_frames < 9 || !(num_frames + 3).is_multiple_of(12)) {
        return Err(EngineError::request(
            "num_frames",
            format!("must be 12·K − 3 (9, 21, 33, …) for K chunks, or 0 to stream until stopped, got {num_frames}"),
        ));
    }
    let latent = latent_frames(num_frames);
    let tokens = BLOCK_FRAMES / dit.patch_size[0] * (height / s) * (width / s);
    if !tokens.is_multiple_of(sp) {
        return Err(EngineError::request(
            "width/height",
            format!("a block's {tokens} tokens do not split into sp = {sp} equal parts"),
        ));
    }
    Ok((num_frames != 0).then_some(latent / BLOCK_FRAMES))
}

/// Whether `model` is written as a path rather than a name.
fn looks_like_path(model: &str) -> bool {
    model.contains(['/', '\\']) || model.starts_with(['.', '~'])
}

/// Whether `model` names nothing [`ModelSource::resolve`] can take: no file or folder
/// of that name, no preset, and not written as a path (that is a missing folder).
pub fn names_nothing(model: &str) -> bool {
    !Path::new(model).exists() && !PRESETS.contains(&model) && !looks_like_path(model)
}

/// The one rule for camera input, the same for `--actions` and the server's
/// `camera_action_script`: at most one key set per latent frame (`(num_frames + 3) / 4`
/// of them; latent frames past the script's end have no keys), or a pose trajectory of
/// exactly one pose per pixel frame (or a single pose), not both.
pub fn check_camera(num_frames: usize, key_sets: usize, poses: Option<usize>) -> Result<()> {
    let latent = latent_frames(num_frames);
    if key_sets > 0 && poses.is_some() {
        return Err(EngineError::request(
            "actions",
            "give key actions or a pose trajectory, not both",
        ));
    }
    if num_frames == 0 && poses.is_some() {
        return Err(EngineError::request(
            "trajectory",
            "a trajectory has one pose per frame, so the session needs num_frames (it cannot stream until stopped)",
        ));
    }
    // A session streamed until stopped takes any number of key sets, then none.
    if num_frames != 0 && key_sets > latent {
        return Err(EngineError::request(
            "actions",
            format!(
                "{key_sets} key sets for {num_frames} frames, which are {latent} latent frames ((frames + 3) / 4); give at most one key set per latent frame"
            ),
        ));
    }
    if let Some(n) = poses {
        if n != 1 && n != num_frames {
            return Err(EngineError::request(
                "actions",
                format!(
                    "{n} poses for {num_frames} frames; a trajectory has exactly one pose per frame, or a single pose"
                ),
            ));
        }
    }
    Ok(())
}

/// Latent frames of a session of `num_frames` (12·K − 3) pixel frames: 3 per chunk.
pub fn latent_frames(num_frames: usize) -> usize {
    latent_frames_in_blocks(num_frames)
}
