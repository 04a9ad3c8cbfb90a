//! The session a command describes when the flags leave something out, in one place:
//! `generate` and `bench session` take their frames, size and seed defaults from here,
//! `plan` its frames and size (so `plan --model M` plans the session `generate --model M`
//! runs), `serve` its size, and `bench serve`, `bench models` and `bench batch` their
//! fixed sizes and frames.

use anyhow::Result;
use clap::Args;

/// Frames of a session when `--frames` is absent: 3 chunks (9 + 12 + 12).
pub const DEFAULT_FRAMES: usize = 33;

/// Noise seed when `--seed` is absent.
pub const DEFAULT_SEED: u64 = 42;

/// Video size when neither the command line nor the model gives one.
pub const DEFAULT_SIZE: (usize, usize) = (416, 240);

/// How much video, how large, from which noise.
#[derive(Debug, Args)]
pub struct SessionShape {
    /// Frames: 12·K − 3 for K chunks (`until-stop`, a session without an end, is for
    /// `headroom serve`: a file needs an end).
    #[arg(long, default_value_t = DEFAULT_FRAMES, value_parser = parse_frames)]
    pub frames: usize,
    /// Width in pixels (multiple of 16); default: the model's own size (its
    /// first_frame.png), else 416.
    #[arg(long)]
    pub width: Option<usize>,
    /// Height in pixels (multiple of 16); default: the model's own size, else 240.
    #[arg(long)]
    pub height: Option<usize>,
    /// Noise seed.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
}

impl SessionShape {
    /// `(width, height)`: as given, else the size of the model folder's own first frame,
    /// else [`DEFAULT_SIZE`].
    pub fn size(&self, model: &str) -> (usize, usize) {
        video_size(self.width, self.height, model)
    }
}

/// `(width, height)` from the flags, filling what is missing from the model folder's own
/// first frame, else [`DEFAULT_SIZE`].
pub fn video_size(width: Option<usize>, height: Option<usize>, model: &str) -> (usize, usize) {
    let native = headroom_engine::first_frame::native_size(std::path::Path::new(model))
        .unwrap_or(DEFAULT_SIZE);
    (width.unwrap_or(native.0), height.unwrap_or(native.1))
}

/// A frame count: a number, or `until-stop` (0), a session that streams until stopped.
pub fn parse_frames(value: &str) -> std::result::Result<usize, String> {
    match value.trim() {
        "until-stop" => Ok(0),
        v => v
            .parse()
            .map_err(|_| format!("{v:?} is not a frame count (12·K − 3) or until-stop")),
    }
}

/// Refuses a session without an end where `command` writes a file.
pub fn require_end(command: &str, frames: usize) -> Result<()> {
    if frames == 0 {
        anyhow::bail!(
            "--frames until-stop: {command} needs an end, give 12·K − 3 frames (9, 21, 33, …); a session that streams until stopped runs under `headroom serve` (session.start without num_frames)"
        );
    }
    Ok(())
}
