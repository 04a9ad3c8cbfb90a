//! `image_reference`: a `data:` URL (PNG or JPEG, base64) decoded into a session's first
//! frame. The server fetches nothing: an `http(s)` URL is refused.
//!
//! Resize rule: the image is scaled, keeping its aspect ratio, until it covers the
//! requested `width × height` (the smaller scale that makes both sides at least as large;
//! Catmull-Rom filter), then the centre `width × height` is cropped. Nothing is
//! stretched; the longer side loses equal margins on both ends.

use base64::Engine as _;
use headroom_tensor::{Device, Tensor};
use image::imageops::{self, FilterType};

use crate::error::{Result, ServerError};

const FIELD: &str = "image_reference.image_url";
/// Largest decoded side: far above any video size, small enough that a hostile PNG
/// header cannot make the decoder allocate gigabytes.
const MAX_SIDE: u32 = 8192;

/// Decodes a `data:image/png|jpeg;base64,…` URL into `[3, height, width]` in [−1, 1] on
/// `device`, by the module's cover-and-centre-crop rule.
pub fn decode_image_url(url: &str, width: usize, height: usize, device: &Device) -> Result<Tensor> {
    let rgb = decode_rgb(url)?;
    let rgb = cover_crop(&rgb, width as u32, height as u32);
    let n = width * height;
    let mut planar = vec![0f32; 3 * n];
    for (i, px) in rgb.pixels().enumerate() {
        for c in 0..3 {
            planar[c * n + i] = f32::from(px.0[c]) / 127.5 - 1.0;
        }
    }
    Tensor::from_slice(&planar, &[3, height, width], device)
        .map_err(|e| ServerError::Generation(format!("first frame: {e}")))
}

/// The image of a data URL as RGB8.
fn decode_rgb(url: &str) -> Result<image::RgbImage> {
    let lower = url
        .get(..url.len().min(16))
        .unwrap_or_default()
        .to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return Err(ServerError::request(
            FIELD,
            "http(s) URLs are not fetched by this server; send the image inline as a data:image/png;base64,… or data:image/jpeg;base64,… URL",
        ));
    }
    let Some(rest) = url.strip_prefix("data:") else {
        return Err(ServerError::request(
            FIELD,
            "must be a data: URL (data:image/png;base64,… or data:image/jpeg;base64,…)",
        ));
    };
    let (header, payload) = rest.split_once(',').ok_or_else(|| {
        ServerError::request(FIELD, "a data: URL needs a comma before its payload")
    })?;
    let mut parts = header.split(';');
    let mime = parts.next().unwrap_or_default().to_ascii_lowercase();
    // The declared type only gates what is accepted; the bytes say which it is.
    match mime.as_str() {
        "image/png" | "image/jpeg" | "image/jpg" => {}
        other => {
            return Err(ServerError::request(
                FIELD,
                format!("media type must be image/png or image/jpeg, got {other:?}"),
            ))
        }
    };
    if !parts.any(|p| p.eq_ignore_ascii_case("base64")) {
        return Err(ServerError::request(
            FIELD,
            "the data: URL must be base64 encoded (data:image/png;base64,…)",
        ));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(payload.trim())
        .map_err(|e| ServerError::request(FIELD, format!("payload is not valid base64: {e}")))?;
    headroom_media::decode_image(&bytes, MAX_SIDE)
        .map_err(|e| ServerError::request(FIELD, format!("the {mime} image: {e}")))
}

/// Scales `rgb` to cover `width × height` keeping its aspect ratio, then crops the centre.
///
/// The crop is taken in the source's pixels first and only it is scaled: scaling the
/// whole image would make a thin one (1 × 8192, a few hundred bytes of PNG) as long as
/// `8192 × width` pixels, gigabytes for one small request. This way the work and memory
/// are bounded by the source and the `width × height` output.
fn cover_crop(rgb: &image::RgbImage, width: u32, height: u32) -> image::RgbImage {
    let (w, h) = rgb.dimensions();
    if (w, h) == (width, height) {
        return rgb.clone();
    }
    let scale = (f64::from(width) / f64::from(w)).max(f64::from(height) / f64::from(h));
    // The source region that covers the output at that scale, centred.
    let cw = ((f64::from(width) / scale).round() as u32).clamp(1, w);
    let ch = ((f64::from(height) / scale).round() as u32).clamp(1, h);
    let region = imageops::crop_imm(rgb, (w - cw) / 2, (h - ch) / 2, cw, ch).to_image();
    imageops::resize(&region, width, height, FilterType::CatmullRom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::ImageFormat;
    use std::io::Cursor;

    fn png_url(w: u32, h: u32, f: impl Fn(u32, u32) -> [u8; 3]) -> String {
        let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb(f(x, y)));
        let mut bytes = Vec::new();
        img.write_to(&mut Cursor::new(&mut bytes), ImageFormat::Png)
            .unwrap();
        format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    }

    #[test]
    fn a_png_data_url_becomes_a_planar_frame_in_minus_one_to_one() {
        let dev = Device::cpu().unwrap();
        let t = decode_image_url(&png_url(4, 2, |_, _| [255, 0, 128]), 4, 2, &dev).unwrap();
        assert_eq!(t.shape(), [3, 2, 4]);
        let v = t.to_vec::<f32>().unwrap();
        assert_eq!(v[0], 1.0);
        assert_eq!(v[8], -1.0);
        assert!((v[16] - (128.0 / 127.5 - 1.0)).abs() < 1e-6);
    }

    #[test]
    fn a_wider_image_is_scaled_to_cover_and_centre_cropped() {
        // Left third red, middle third green, right third blue; a square crop keeps green.
        let url = png_url(30, 10, |x, _| match x / 10 {
            0 => [255, 0, 0],
            1 => [0, 255, 0],
            _ => [0, 0, 255],
        });
        let rgb = cover_crop(&decode_rgb(&url).unwrap(), 10, 10);
        assert_eq!(rgb.dimensions(), (10, 10));
        assert_eq!(rgb.get_pixel(5, 5).0, [0, 255, 0]);
    }

    #[test]
    fn a_thin_image_is_cropped_before_it_is_scaled_so_memory_stays_bounded() {
        // Found with fuzz/fuzz_targets/image_url.rs: a 1 × 64 PNG (70 bytes) covering
        // 3840 × 16 was first scaled whole to 3840 × 245760 pixels, a 2.8 GB allocation.
        let thin = image::RgbImage::from_pixel(1, 4096, image::Rgb([10, 20, 30]));
        let rgb = cover_crop(&thin, 3840, 16);
        assert_eq!(rgb.dimensions(), (3840, 16));
        assert!(rgb.pixels().all(|p| p.0 == [10, 20, 30]));
        let wide = image::RgbImage::from_pixel(4096, 1, image::Rgb([1, 2, 3]));
        assert_eq!(cover_crop(&wide, 16, 3840).dimensions(), (16, 3840));
    }

    #[test]
    fn urls_the_server_will_not_use_are_refused_with_the_rule() {
        let dev = Device::cpu().unwrap();
        for (url, says) in [
            ("https://example.com/a.png", "not fetched"),
            ("HTTP://example.com/a.png", "not fetched"),
            ("file:///etc/passwd", "must be a data: URL"),
            ("data:image/gif;base64,AAAA", "image/png or image/jpeg"),
            ("data:image/png,rawbytes", "base64 encoded"),
            ("data:image/png;base64,!!!", "not valid base64"),
            ("data:image/png;base64,AAAA", "not a PNG or JPEG"),
        ] {
            let err = decode_image_url(url, 16, 16, &dev).unwrap_err();
            assert_eq!(err.code(), "invalid_request");
            assert!(err.to_string().contains(says), "{url}: {err}");
            assert!(err.to_string().contains(FIELD), "{err}");
        }
    }
}
