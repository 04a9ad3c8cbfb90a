//! What a decode tells its driver and asks of it: the boundary where the decode proper
//! starts and whether to go on. A leaf: the decoders use it, the engine's phase schedule
//! implements it.

/// What a decode tells, and asks of, whoever drives it. The decoder knows *where* its
/// boundaries are; the driver (the engine's phase schedule) decides what happens there,
/// so no decoder announces a phase itself.
pub trait DecodeControl {
    /// The streams' caches are gathered and nothing of the decode proper is allocated
    /// yet: the point where a reclaim returns the most (the engine's `decode_start`).
    fn started(&self) {}
    /// Asked before each latent frame after the first: `false` stops the decode.
    fn go_on(&self, _frames_done: usize) -> bool {
        true
    }
}

/// A [`DecodeControl`] that marks nothing and never stops: a decode on its own.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunToEnd;

impl DecodeControl for RunToEnd {}
