//! The video `generate` writes and the files beside it: which writer `--out` names, and
//! every output checked (and reserved under a partial name) before any weights load.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use headroom_media::{write_png, Mp4Writer, Y4mWriter};

use super::args::GenerateArgs;
use crate::outputs::Output;

/// Frames per second of the written video.
pub const FPS: u32 = 16;

/// The kind of video `--out` names, from its extension.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VideoKind {
    /// An H.264 `.mp4` file.
    Mp4,
    /// A `.y4m` file.
    Y4m,
    /// A folder of numbered PNG frames.
    PngFrames,
}

impl VideoKind {
    /// The kind `out` names, refused when its extension is none of them.
    fn of(out: &Path) -> Result<Self> {
        use crate::outputs::has_extension;
        if has_extension(out, "mp4") {
            Ok(VideoKind::Mp4)
        } else if has_extension(out, "y4m") {
            Ok(VideoKind::Y4m)
        } else if out.extension().is_none() {
            Ok(VideoKind::PngFrames)
        } else {
            bail!(
                "--out {}: use a .mp4 or .y4m file (any case), or a folder (no extension) for PNG frames",
                out.display()
            )
        }
    }
}

/// The writer of the video's frames.
pub enum Sink {
    /// H.264 in an MP4 file.
    Mp4(Box<Mp4Writer>),
    /// A Y4M file.
    Y4m(Y4mWriter),
    /// PNG frames in a folder: the folder and the next frame's number.
    Png(PathBuf, usize),
}

impl Sink {
    /// A writer of `kind` at `path` (the output's partial name).
    pub fn create(kind: VideoKind, path: &Path, width: usize, height: usize) -> Result<Self> {
        Ok(match kind {
            VideoKind::Mp4 => Sink::Mp4(Box::new(Mp4Writer::create(path, width, height, FPS)?)),
            VideoKind::Y4m => Sink::Y4m(Y4mWriter::create(path, width, height, FPS)?),
            VideoKind::PngFrames => {
                std::fs::create_dir_all(path).with_context(|| {
                    format!("--out {}: cannot create the folder", path.display())
                })?;
                Sink::Png(path.to_path_buf(), 0)
            }
        })
    }

    /// Writes one RGB frame of `width × height`.
    pub fn write(&mut self, frame: &[u8], width: usize, height: usize) -> Result<()> {
        match self {
            Sink::Mp4(writer) => writer.write_frame(frame)?,
            Sink::Y4m(writer) => writer.write_frame(frame)?,
            Sink::Png(dir, index) => {
                write_png(dir, *index, width, height, frame)?;
                *index += 1;
            }
        }
        Ok(())
    }

    /// Completes the file (the MP4's index, the Y4M's last bytes).
    pub fn finish(self) -> Result<()> {
        match self {
            Sink::Mp4(writer) => {
                writer.finish()?;
            }
            Sink::Y4m(writer) => {
                writer.finish()?;
            }
            Sink::Png(..) => {}
        }
        Ok(())
    }
}

/// Every file the run writes, checked before any weights load.
pub struct Outputs {
    /// What `--out` is.
    pub kind: VideoKind,
    /// `--out`.
    pub video: Output,
    /// `--dump-latents`.
    pub latents: Option<Output>,
    /// `--trace`.
    pub trace: Option<Output>,
}

impl Outputs {
    /// Checks every output path `args` names for a `width × height` video.
    pub fn check(args: &GenerateArgs, width: usize, height: usize) -> Result<Self> {
        let kind = VideoKind::of(&args.out)?;
        let video = match kind {
            VideoKind::Mp4 => {
                headroom_media::check_h264_size(width, height, FPS)
                    .with_context(|| format!("--out {}", args.out.display()))?;
                Output::file("--out", &args.out)?
            }
            VideoKind::Y4m => Output::file("--out", &args.out)?,
            VideoKind::PngFrames => Output::dir("--out", &args.out)?,
        };
        let file = |field, path: &Option<PathBuf>| {
            path.as_deref().map(|p| Output::file(field, p)).transpose()
        };
        Ok(Self {
            kind,
            video,
            latents: file("--dump-latents", &args.dump_latents)?,
            trace: file("--trace", &args.trace)?,
        })
    }
}
