//! LingBot-World: Wan2.2-I2V-A14B-based DiT folders in original names (v1:
//! `high_noise_model/` and `low_noise_model/`, v2: `transformers/`) plus the camera
//! adapter, whose names diffusers' layout keeps as they are:
//! `patch_embedding_wancamctrl`, `c2ws_hidden_states_layer{1,2}`, and per block
//! `cam_injector_layer{1,2}`, `cam_scale_layer`, `cam_shift_layer`. 36 input channels
//! (latents + image condition), no `img_emb`.

use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};

/// Whether `key` (wrappers stripped) belongs to the camera adapter.
pub fn is_camera_key(key: &str) -> bool {
    key.starts_with("patch_embedding_wancamctrl.")
        || key.starts_with("c2ws_hidden_states_layer")
        || key.contains(".cam_injector_layer")
        || key.contains(".cam_scale_layer.")
        || key.contains(".cam_shift_layer.")
}

/// The DiT folder inside a LingBot-World download, if `dir` is one: `transformers/`
/// (v2); for v1 the caller must choose one of the two experts.
pub fn transformer_dir(dir: &Path) -> Result<Option<PathBuf>> {
    if dir.join("transformers").is_dir() {
        return Ok(Some(dir.join("transformers")));
    }
    let (high, low) = (dir.join("high_noise_model"), dir.join("low_noise_model"));
    if high.is_dir() || low.is_dir() {
        return Err(ModelError::input(
            "transformer",
            format!(
                "{} holds the two LingBot-World v1 experts; pass one with --transformer ({} or {})",
                dir.display(),
                high.display(),
                low.display()
            ),
        ));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camera_adapter_keys_are_recognised() {
        for key in [
            "patch_embedding_wancamctrl.weight",
            "c2ws_hidden_states_layer1.bias",
            "blocks.3.cam_injector_layer2.weight",
            "blocks.3.cam_scale_layer.weight",
            "blocks.0.cam_shift_layer.bias",
        ] {
            assert!(is_camera_key(key), "{key}");
        }
        assert!(!is_camera_key("blocks.0.self_attn.q.weight"));
        assert!(!is_camera_key("patch_embedding.weight"));
    }
}
