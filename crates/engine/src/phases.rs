//! The phase schedule: the boundaries a session crosses, in order, and the one place
//! they are announced to the platform, whose reclaim policy acts on them
//! (`headroom_mem::ReclaimPolicy`).
//!
//! | phase | crossed | a reclaim there gives back |
//! |---|---|---|
//! | `text_end` | an on-demand prompt encode released its weights, before the embedding is copied back | the text encoder's weights |
//! | `denoise_end` | a block's denoise finished (a session's, or a scheduler round's) | the denoise's activations |
//! | `decode_start` | inside the decode, once the streams' caches are gathered and before its first allocation | what the denoise left cached, and the stacked caches |
//! | `session_end` | a session closed, was cancelled or dropped | everything it held |
//! | `error` | a session's chunk failed | the same, at once |
//! | `sleep` | [`Engine::sleep`](crate::Engine::sleep) | the allocator's whole cache |
//!
//! The text encoder and the decoders only mark *where* their boundary lies inside
//! their work (a callback; a [`DecodeControl`]); they never name a phase, so changing
//! the schedule changes this file alone.

use headroom_mem::{Phase, Platform, Reclaim};
use headroom_model::DecodeControl;

/// A prompt encode released its weights.
pub fn text_end(platform: &dyn Platform) {
    platform.phase(Phase::TextEnd);
}

/// A block's denoise finished.
pub(crate) fn denoise_end(platform: &dyn Platform) {
    platform.phase(Phase::DenoiseEnd);
}

/// A session ended (closed, cancelled or dropped).
pub(crate) fn session_end(platform: &dyn Platform) {
    platform.phase(Phase::SessionEnd);
}

/// A session's chunk failed.
pub(crate) fn error(platform: &dyn Platform) {
    platform.phase(Phase::Error);
}

/// The engine goes to sleep: what the reclaim did, if anything.
pub(crate) fn sleep(platform: &dyn Platform) -> Option<Reclaim> {
    platform.phase(Phase::Sleep)
}

/// The [`DecodeControl`] every decode runs under: `decode_start` where the decoder says
/// its decode proper starts, and an optional stop asked before each latent frame after
/// the first.
pub struct DecodeStart<'a> {
    platform: &'a dyn Platform,
    go_on: Option<&'a dyn Fn(usize) -> bool>,
}

impl<'a> DecodeStart<'a> {
    /// Crosses `decode_start` on `platform` and never stops the decode.
    pub fn on(platform: &'a dyn Platform) -> Self {
        Self {
            platform,
            go_on: None,
        }
    }

    /// Also asks `go_on(frames_done)` before each latent frame after the first.
    pub fn until(mut self, go_on: &'a dyn Fn(usize) -> bool) -> Self {
        self.go_on = Some(go_on);
        self
    }
}

impl std::fmt::Debug for DecodeStart<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeStart")
            .field("stops", &self.go_on.is_some())
            .finish_non_exhaustive()
    }
}

impl DecodeControl for DecodeStart<'_> {
    fn started(&self) {
        self.platform.phase(Phase::DecodeStart);
    }
    fn go_on(&self, frames_done: usize) -> bool {
        self.go_on.is_none_or(|go_on| go_on(frames_done))
    }
}
