//! Reading frames in: PNG and JPEG images from untrusted bytes (a server's `data:` URL,
//! a model folder's `first_frame.png`, a `--image` file), decoded under limits and
//! refused with an error that names the rule they broke.

use image::{ImageFormat, ImageReader, Limits, RgbImage};

/// Largest allocation a decode may make (the file is untrusted input).
const MAX_ALLOC: u64 = 256 << 20;

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
            ("JPEG", end >= 1 && bytes[end - 1] == 0xFF && bytes[end] == 0xD9)
        }
    };
    if !complete {
        return Err(ImageError::Truncated { format: name });
    }
    let mut reader = ImageReader::new(std::io::Cursor::new(bytes));
    reader.set_format(format);
    let mut limits = Limits::default();
    limits.max_image_width = Some(max_side);
    limits.max_image_height = Some(max_side);
    limits.max_alloc = Some(MAX_ALLOC);
    reader.limits(limits);
    let image = reader.decode().map_err(|e| ImageError::Decode {
        format: name,
        max_side,
        reason: e.to_string(),
    })?;
    Ok(image.to_rgb8())
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

    #[test]
    fn a_side_over_the_limit_is_refused_before_decoding() {
        let err = decode_image(&png(40, 2), 32).unwrap_err();
        assert!(
            matches!(err, ImageError::Decode { format: "PNG", max_side: 32, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("at most 32×32"), "{err}");
    }
}
