//! Reading frames in (PNG and JPEG from untrusted bytes, [`image`]) and writing
//! them out: YUV4MPEG2 (`.y4m`, playable by ffplay/mpv, 4:4:4), PNG
//! sequences, and H.264 in MP4 or fragmented MP4 ([`mp4`]). Frames are RGB u8,
//! `height × width × 3`, row-major.
//!
//! The trade-off: what a stream needs and no more (OpenH264 built from source, our own
//! fragmented-MP4 writer, PNG/JPEG decoding under limits) instead of an FFmpeg
//! dependency, so it builds offline and reads untrusted bytes with stated bounds.
#![warn(missing_docs, missing_debug_implementations)]

mod h264;
pub mod image;
pub mod mp4;

pub use self::image::{decode_image, ImageError};
pub use h264::check_h264_size;
pub use mp4::{FragmentedMp4, Mp4Writer};

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Errors of the writers.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// A frame does not have the writer's size.
    #[error("frame of {got} bytes does not match {width}x{height} RGB ({expected} bytes)")]
    FrameSize {
        /// Width.
        width: usize,
        /// Height.
        height: usize,
        /// Bytes expected.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// Writing failed.
    #[error("{path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The video size or frame rate cannot be encoded as H.264.
    #[error("cannot encode {width}x{height} video at {fps} fps: {reason}")]
    VideoFormat {
        /// Width.
        width: usize,
        /// Height.
        height: usize,
        /// Frames per second.
        fps: u32,
        /// Why.
        reason: &'static str,
    },
    /// The H.264 encoder failed.
    #[error("H.264 encoder: {0}")]
    Encode(String),
    /// Building the MP4 container failed.
    #[error("MP4 muxer: {0}")]
    Mux(String),
}

/// Result alias of the writers.
pub type Result<T> = std::result::Result<T, MediaError>;

fn io(path: &Path, e: impl std::fmt::Display) -> MediaError {
    MediaError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

fn check(width: usize, height: usize, frame: &[u8]) -> Result<()> {
    let expected = width * height * 3;
    if frame.len() != expected {
        return Err(MediaError::FrameSize {
            width,
            height,
            expected,
            got: frame.len(),
        });
    }
    Ok(())
}

/// A YUV4MPEG2 writer (full-range BT.601, 4:4:4, progressive).
#[derive(Debug)]
pub struct Y4mWriter {
    out: BufWriter<File>,
    path: PathBuf,
    width: usize,
    height: usize,
    frames: usize,
}

impl Y4mWriter {
    /// Creates `path` for `width × height` video at `fps` frames per second.
    pub fn create(path: &Path, width: usize, height: usize, fps: u32) -> Result<Self> {
        let file = File::create(path).map_err(|e| io(path, e))?;
        let mut out = BufWriter::new(file);
        writeln!(
            out,
            "YUV4MPEG2 W{width} H{height} F{fps}:1 Ip A1:1 C444 XCOLORRANGE=FULL"
        )
        .map_err(|e| io(path, e))?;
        Ok(Self {
            out,
            path: path.to_path_buf(),
            width,
            height,
            frames: 0,
        })
    }

    /// Appends one RGB frame.
    pub fn write_frame(&mut self, rgb: &[u8]) -> Result<()> {
        check(self.width, self.height, rgb)?;
        let n = self.width * self.height;
        let mut planes = vec![0u8; 3 * n];
        for (i, px) in rgb.chunks_exact(3).enumerate() {
            let (r, g, b) = (f32::from(px[0]), f32::from(px[1]), f32::from(px[2]));
            let y = 0.299 * r + 0.587 * g + 0.114 * b;
            planes[i] = y.round().clamp(0.0, 255.0) as u8;
            planes[n + i] = (128.0 + 0.564 * (b - y)).round().clamp(0.0, 255.0) as u8;
            planes[2 * n + i] = (128.0 + 0.713 * (r - y)).round().clamp(0.0, 255.0) as u8;
        }
        self.out
            .write_all(b"FRAME\n")
            .map_err(|e| io(&self.path, e))?;
        self.out.write_all(&planes).map_err(|e| io(&self.path, e))?;
        self.frames += 1;
        Ok(())
    }

    /// Frames written.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Flushes the file.
    pub fn finish(mut self) -> Result<usize> {
        self.out.flush().map_err(|e| io(&self.path, e))?;
        Ok(self.frames)
    }
}

/// Where [`write_png`] puts frame `index`: `dir/frame_NNNNN.png`.
pub fn png_frame_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("frame_{index:05}.png"))
}

/// Writes one RGB frame as `dir/frame_NNNNN.png`.
pub fn write_png(
    dir: &Path,
    index: usize,
    width: usize,
    height: usize,
    rgb: &[u8],
) -> Result<PathBuf> {
    check(width, height, rgb)?;
    let path = png_frame_path(dir, index);
    let file = File::create(&path).map_err(|e| io(&path, e))?;
    let mut encoder = png::Encoder::new(BufWriter::new(file), width as u32, height as u32);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(|e| io(&path, e))?;
    writer.write_image_data(rgb).map_err(|e| io(&path, e))?;
    writer.finish().map_err(|e| io(&path, e))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn y4m_has_a_header_and_one_plane_set_per_frame() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.y4m");
        let mut w = Y4mWriter::create(&path, 4, 2, 16).unwrap();
        let white = vec![255u8; 4 * 2 * 3];
        w.write_frame(&white).unwrap();
        w.write_frame(&[0u8; 24]).unwrap();
        assert!(w
            .write_frame(&[0u8; 5])
            .unwrap_err()
            .to_string()
            .contains("4x2"));
        assert_eq!(w.finish().unwrap(), 2);
        let bytes = std::fs::read(&path).unwrap();
        let header = b"YUV4MPEG2 W4 H2 F16:1 Ip A1:1 C444 XCOLORRANGE=FULL\n";
        assert!(bytes.starts_with(header));
        assert_eq!(bytes.len(), header.len() + 2 * (6 + 3 * 8));
        let first = &bytes[header.len() + 6..header.len() + 6 + 24];
        assert!(first[..8].iter().all(|&y| y == 255) && first[8..].iter().all(|&c| c == 128));
    }

    #[test]
    fn png_frames_decode_back_to_the_same_pixels() {
        let dir = tempfile::tempdir().unwrap();
        let rgb: Vec<u8> = (0..3 * 5 * 3).map(|i| (i * 7) as u8).collect();
        let path = write_png(dir.path(), 3, 5, 3, &rgb).unwrap();
        assert!(path.ends_with("frame_00003.png"));
        let decoder = png::Decoder::new(std::io::BufReader::new(File::open(&path).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (5, 3));
        assert_eq!(&buf[..info.buffer_size()], &rgb[..]);
    }
}
