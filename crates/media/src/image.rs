//! Reading frames in: PNG and JPEG images from untrusted bytes (a server's `data:` URL,
//! a model folder's `first_frame.png`, a `--image` file), decoded under limits and
//! refused with an error that names the rule they broke.

use image::{ImageFormat, ImageReader, Limits, RgbImage};

/// Largest allocation a decode may make (the file is untrusted input).
const MAX_ALLOC: u64 = 256 << 20;

/// Bytes a decode holds per pixel at its peak, at most: a progressive JPEG keeps 16-bit
/// coefficients of three components (6) beside its 8-bit output (3); a 16-bit RGBA PNG
/// decodes to 8 and converts to 3. The decoders' own limit counts the output alone.
const PEAK_BYTES_PER_PIXEL: u64 = 12;

/// Most pixels an image may have: its decode stays within `MAX_ALLOC` (256 MiB) all told
/// (22.4 million, e.g. 5464 × 4096), however few bytes the file is.
pub const MAX_PIXELS: u64 = MAX_ALLOC / PEAK_BYTES_PER_PIXEL;

/// Why untrusted bytes were not decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    /// The content is neither a PNG nor a JPEG, whatever the name says.
    #[error("not a PNG or JPEG image (by its content)")]
    NotAnImage,
    /// The file stops before its end-of-image marker.
    #[error("the {format} is truncated (it has no end-of-image marker)")]
    Truncated {
        /// `PNG` or `JPEG`.
        format: &'static str,
    },
    /// The header declares more pixels than a decode may hold in memory.
    #[error("the {format} is {width}×{height}, more than {max_pixels} pixels: decoding it would take more than 256 MiB")]
    TooManyPixels {
        /// `PNG` or `JPEG`.
        format: &'static str,
        /// Width its header declares.
        width: u32,
        /// Height its header declares.
        height: u32,
        /// The pixel limit ([`MAX_PIXELS`]).
        max_pixels: u64,
    },
    /// The decoder refused it: corrupt, over the side limit or over the allocation
    /// limit.
    #[error("cannot decode the {format} (at most {max_side}×{max_side}): {reason}")]
    Decode {
        /// `PNG` or `JPEG`.
        format: &'static str,
        /// The largest side allowed.
        max_side: u32,
        /// What the decoder said.
        reason: String,
    },
}

/// Decodes a PNG or JPEG from untrusted bytes, whatever its name says: the format is
/// read from the content, a file cut short (no PNG `IEND`, no JPEG end-of-image marker)
/// is refused instead of decoding with a grey remainder, and sides past `max_side` or an
/// allocation past 256 MiB are refused before decoding.
pub fn decode_image(bytes: &[u8], max_side: u32) -> Result<RgbImage, ImageError> {
    let format = image::guess_format(bytes)
        .ok()
        .filter(|f| matches!(f, ImageFormat::Png | ImageFormat::Jpeg))
        .ok_or(ImageError::NotAnImage)?;
    let (name, complete) = match format {
        ImageFormat::Png => ("PNG", bytes.windows(4).rev().take(64).any(|w| w == b"IEND")),
        // The end-of-image marker, possibly followed by padding.
        _ => {
            let end = bytes.iter().rposition(|&b| b != 0).unwrap_or(0);
            (
                "JPEG",
                end >= 1 && bytes[end - 1] == 0xFF && bytes[end] == 0xD9,
            )
        }
    };
    if !complete {
        return Err(ImageError::Truncated { format: name });
    }
    let decode_error = |e: image::ImageError| ImageError::Decode {
        format: name,
        max_side,
        reason: e.to_string(),
    };
    let reader = || {
        let mut reader = ImageReader::new(std::io::Cursor::new(bytes));
        reader.set_format(format);
        let mut limits = Limits::default();
        limits.max_image_width = Some(max_side);
        limits.max_image_height = Some(max_side);
        limits.max_alloc = Some(MAX_ALLOC);
        reader.limits(limits);
        reader
    };
    // The header first: a few KiB of progressive JPEG can declare 8192 × 8192, whose
    // coefficients alone are 400 MB.
    let (width, height) = reader().into_dimensions().map_err(decode_error)?;
    if u64::from(width) * u64::from(height) > MAX_PIXELS {
        return Err(ImageError::TooManyPixels {
            format: name,
            width,
            height,
            max_pixels: MAX_PIXELS,
        });
    }
    // A decoder bug must not take the caller down with it: zune-jpeg 0.5.15 panics
    // (`unwrap` on `None` in its AVX2 IDCT) on some corrupt JPEGs that
    // fuzz/fuzz_targets/image.rs found; a panic is one more way to be undecodable.
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader().decode()));
    let image = decoded
        .map_err(|_| ImageError::Decode {
            format: name,
            max_side,
            reason: "the decoder failed on its data (it panicked)".to_string(),
        })?
        .map_err(decode_error)?;
    // `into_rgb8` keeps an RGB decode as it is instead of copying it.
    Ok(image.into_rgb8())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Png).unwrap();
        out.into_inner()
    }

    #[test]
    fn a_png_decodes_to_its_pixels() {
        let rgb = decode_image(&png(5, 3), 16).unwrap();
        assert_eq!(rgb.dimensions(), (5, 3));
        assert_eq!(rgb.get_pixel(4, 2).0, [4, 2, 7]);
    }

    #[test]
    fn bytes_that_are_not_an_image_are_refused_by_content() {
        assert_eq!(decode_image(b"GIF89a....", 16), Err(ImageError::NotAnImage));
        assert_eq!(
            decode_image(b"", 16).unwrap_err().to_string(),
            "not a PNG or JPEG image (by its content)"
        );
    }

    #[test]
    fn a_png_cut_short_is_refused_as_truncated() {
        let bytes = png(8, 8);
        let cut = &bytes[..bytes.len() - 20];
        assert_eq!(
            decode_image(cut, 16),
            Err(ImageError::Truncated { format: "PNG" })
        );
    }

    /// CRC-32 of PNG chunks (the IEEE polynomial), for patching a header.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn more_pixels_than_a_decode_may_hold_are_refused_from_the_header() {
        // Found by fuzz/fuzz_targets/image.rs: a 4 KiB progressive JPEG declaring
        // 3840 × 4119 took 122 MB (its coefficients), and at 8192 × 8192 it would take
        // over 400 MB; the decoder's limit counts only its output. A PNG whose header
        // says 6000 × 4000 is refused the same way, before any pixel is decoded.
        let mut bytes = png(1, 1);
        bytes[16..20].copy_from_slice(&6000u32.to_be_bytes());
        bytes[20..24].copy_from_slice(&4000u32.to_be_bytes());
        let crc = crc32(&bytes[12..29]);
        bytes[29..33].copy_from_slice(&crc.to_be_bytes());
        let err = decode_image(&bytes, 8192).unwrap_err();
        assert_eq!(
            err,
            ImageError::TooManyPixels {
                format: "PNG",
                width: 6000,
                height: 4000,
                max_pixels: MAX_PIXELS,
            }
        );
        assert!(err.to_string().contains("more than 256 MiB"), "{err}");
        assert!(decode_image(&png(64, 48), 8192).is_ok());
    }

    #[test]
    fn a_side_over_the_limit_is_refused_before_decoding() {
        let err = decode_image(&png(40, 2), 32).unwrap_err();
        assert!(
            matches!(
                err,
                ImageError::Decode {
                    format: "PNG",
                    max_side: 32,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("at most 32×32"), "{err}");
    }
}
