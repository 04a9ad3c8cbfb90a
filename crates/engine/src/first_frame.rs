//! A model folder's own first frame (`first_frame.png`): what an image-conditioned model
//! starts from when a session brings no image, and the size it was trained at.

use std::path::Path;

use headroom_tensor::{Device, Tensor};
use image::{ImageFormat, ImageReader, Limits, RgbImage};

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
    decode_image(&bytes, MAX_SIDE).map(Some).map_err(bad)
}

/// Decodes a PNG or JPEG from untrusted bytes, whatever its name says: the format is read
/// from the content, a file cut short (no PNG `IEND`, no JPEG end-of-image marker) is
/// refused instead of decoding with a grey remainder, and sides past `max_side` or an
/// allocation past 256 MiB are refused before decoding. The error names the rule.
pub fn decode_image(bytes: &[u8], max_side: u32) -> std::result::Result<RgbImage, String> {
    let format = image::guess_format(bytes)
        .ok()
        .filter(|f| matches!(f, ImageFormat::Png | ImageFormat::Jpeg))
        .ok_or("not a PNG or JPEG image (by its content)")?;
    let complete = match format {
        ImageFormat::Png => bytes.windows(4).rev().take(64).any(|w| w == b"IEND"),
        // The end-of-image marker, possibly followed by padding.
        _ => {
            let end = bytes.iter().rposition(|&b| b != 0).unwrap_or(0);
            end >= 1 && bytes[end - 1] == 0xFF && bytes[end] == 0xD9
        }
    };
    let name = if format == ImageFormat::Png {
        "PNG"
    } else {
        "JPEG"
    };
    if !complete {
        return Err(format!(
            "the {name} is truncated (it has no end-of-image marker)"
        ));
    }
    let mut reader = ImageReader::new(std::io::Cursor::new(bytes));
    reader.set_format(format);
    let mut limits = Limits::default();
    limits.max_image_width = Some(max_side);
    limits.max_image_height = Some(max_side);
    limits.max_alloc = Some(256 << 20);
    reader.limits(limits);
    let image = reader
        .decode()
        .map_err(|e| format!("cannot decode the {name} (at most {max_side}×{max_side}): {e}"))?;
    Ok(image.to_rgb8())
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
