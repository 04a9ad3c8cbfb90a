//! A model folder's own first frame (`first_frame.png`): what an image-conditioned model
//! starts from when a session brings no image, and the size it was trained at.

use std::path::Path;

use headroom_media::decode_image;
use headroom_tensor::{Device, Tensor};
use image::RgbImage;

use crate::error::{EngineError, Result};

/// File name of a model folder's default first frame.
pub const FIRST_FRAME: &str = "first_frame.png";

/// Largest side a first frame may have (the file is untrusted input).
pub const MAX_SIDE: u32 = 4096;

/// Decodes `folder/first_frame.png`, if the folder has one.
pub fn load(folder: &Path) -> Result<Option<RgbImage>> {
    let path = folder.join(FIRST_FRAME);
    if !path.is_file() {
        return Ok(None);
    }
    let bad = |why: String| EngineError::request("model", format!("{}: {why}", path.display()));
    let bytes = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
    decode_image(&bytes, MAX_SIDE)
        .map(Some)
        .map_err(|e| bad(e.to_string()))
}

/// `(width, height)` of `folder/first_frame.png` without decoding it, if present: the
/// model's native video size.
pub fn native_size(folder: &Path) -> Option<(usize, usize)> {
    let (w, h) = image::image_dimensions(folder.join(FIRST_FRAME)).ok()?;
    Some((w as usize, h as usize))
}

/// `rgb` resized (bicubic) to `width × height` as `[3, H, W]` in [−1, 1].
pub fn to_tensor(rgb: &RgbImage, width: usize, height: usize, device: &Device) -> Result<Tensor> {
    let resized;
    let rgb = if rgb.dimensions() == (width as u32, height as u32) {
        rgb
    } else {
        resized = image::imageops::resize(
            rgb,
            width as u32,
            height as u32,
            image::imageops::FilterType::CatmullRom,
        );
        &resized
    };
    let n = width * height;
    let mut planar = vec![0f32; 3 * n];
    for (i, px) in rgb.pixels().enumerate() {
        for (c, &v) in px.0.iter().enumerate() {
            planar[c * n + i] = f32::from(v) / 127.5 - 1.0;
        }
    }
    Ok(Tensor::from_slice(&planar, &[3, height, width], device)?)
}
