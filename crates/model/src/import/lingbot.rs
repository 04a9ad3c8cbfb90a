//! LingBot-World: Wan2.2-I2V-A14B-based DiT folders in original names (v1:
//! `high_noise_model/` and `low_noise_model/`, v2: `transformers/`) plus the camera
//! adapter, whose names diffusers' layout keeps as they are:
//! `patch_embedding_wancamctrl`, `c2ws_hidden_states_layer{1,2}`, and per block
//! `cam_injector_layer{1,2}`, `cam_scale_layer`, `cam_shift_layer`. 36 input channels
//! (latents + image condition), no `img_emb`.

use std::path::{Path, PathBuf};

use headroom_tensor::io::npy::parse_npy;
use headroom_tensor::{Device, TensorError};

use crate::camera::{Pose, Trajectory};
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

/// LingBot-World's camera input: `dir/poses.npy` `[F, 4, 4]` (OpenCV camera-to-world)
/// and `dir/intrinsics.npy` `[F, 4]` (`fx, fy, cx, cy`, in the 832×480 reference units
/// of [`Trajectory`]), read through `device`.
pub fn trajectory_from_dir(dir: &Path, device: &Device) -> Result<Trajectory> {
    let read = |name: &str| -> Result<Vec<u8>> {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|e| ModelError::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
    };
    trajectory_from_npy(dir, &read("poses.npy")?, &read("intrinsics.npy")?, device)
}

/// [`trajectory_from_dir`] from the bytes of the two `.npy` files (untrusted: every
/// shape and value is checked); `dir` only names the files in errors.
pub fn trajectory_from_npy(
    dir: &Path,
    poses: &[u8],
    intrinsics: &[u8],
    device: &Device,
) -> Result<Trajectory> {
    let parse = |name: &str, bytes: &[u8]| -> Result<(Vec<usize>, Vec<f32>)> {
        let t = parse_npy(bytes, device).map_err(|e| ModelError::Io {
            path: dir.join(name).display().to_string(),
            reason: match e {
                TensorError::Io { reason, .. } => reason,
                other => other.to_string(),
            },
        })?;
        Ok((t.shape().to_vec(), t.to_f32_vec()?))
    };
    let (shape, poses) = parse("poses.npy", poses)?;
    let frames = match shape[..] {
        [f, 4, 4] if f > 0 => f,
        _ => {
            return Err(ModelError::input(
                "camera poses",
                format!(
                    "{}/poses.npy must be [F, 4, 4], got {shape:?}",
                    dir.display()
                ),
            ))
        }
    };
    let (ishape, intr) = parse("intrinsics.npy", intrinsics)?;
    if ishape != [frames, 4] {
        return Err(ModelError::input(
            "camera intrinsics",
            format!(
                "{}/intrinsics.npy must be [F = {frames}, 4], got {ishape:?}",
                dir.display()
            ),
        ));
    }
    let poses: Vec<Pose> = poses
        .chunks_exact(16)
        .map(|m| std::array::from_fn(|r| std::array::from_fn(|c| f64::from(m[4 * r + c]))))
        .collect();
    let intrinsics = intr
        .chunks_exact(4)
        .map(|k| std::array::from_fn(|i| f64::from(k[i])))
        .collect();
    Trajectory::new(poses, intrinsics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poses_and_intrinsics_npy_become_a_trajectory_with_shapes_checked() {
        use headroom_tensor::io::npy::write_npy;
        use headroom_tensor::Tensor;
        let dev = Device::cpu().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut poses = Vec::new();
        for f in 0..3 {
            let mut m = [0f32; 16];
            (0..4).for_each(|i| m[5 * i] = 1.0);
            m[3] = f as f32; // x translation
            poses.extend(m);
        }
        let p = Tensor::from_slice(&poses, &[3, 4, 4], &dev).unwrap();
        write_npy(dir.path().join("poses.npy"), &p).unwrap();
        let k =
            Tensor::from_slice(&[500f32, 500.0, 416.0, 240.0].repeat(3), &[3, 4], &dev).unwrap();
        write_npy(dir.path().join("intrinsics.npy"), &k).unwrap();
        let t = trajectory_from_dir(dir.path(), &dev).unwrap();
        assert_eq!(t.poses.len(), 3);
        assert_eq!(t.poses[2][0][3], 2.0);
        assert_eq!(t.intrinsics[1], [500.0, 500.0, 416.0, 240.0]);
        let k2 = Tensor::from_slice(&[1f32; 8], &[2, 4], &dev).unwrap();
        write_npy(dir.path().join("intrinsics.npy"), &k2).unwrap();
        let err = trajectory_from_dir(dir.path(), &dev)
            .unwrap_err()
            .to_string();
        assert!(err.contains("intrinsics.npy must be [F = 3, 4]"), "{err}");
    }

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
