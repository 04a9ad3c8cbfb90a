//! Ending a chunk while it runs: a [`CancelToken`] that a session checks at its safe
//! points, and the [`Checkpoint`] where it stopped.
//!
//! A token is a shared flag plus an optional deadline. The session reads it between DMD
//! steps, between the KV-commit forward and the decode, and between decoded latent
//! frames; each check is one atomic load (and a clock read when a deadline is set), so
//! checking costs nothing next to a forward. It is not checked inside a transformer
//! forward: a sharded engine's ranks meet at collectives inside every layer, and a rank
//! that left a layer alone would leave the others waiting. A step of the 14B model takes
//! about a fifth of a chunk, so a step bounds how late a stop is seen.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A safe point of the chunk loop where a session looks at its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkpoint {
    /// Before anything of the chunk ran.
    ChunkStart,
    /// Before DMD step `step` (from 0) of the block.
    DenoiseStep {
        /// The step about to run.
        step: usize,
    },
    /// After the DMD steps, before the KV-commit forward.
    Commit,
    /// After the commit forward, before the VAE decode.
    Decode,
    /// After `frames` latent frames of the block were decoded (before the next one).
    DecodedFrames {
        /// Latent frames decoded so far in this block.
        frames: usize,
    },
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Checkpoint::ChunkStart => f.write_str("the chunk's start"),
            Checkpoint::DenoiseStep { step } => write!(f, "DMD step {step}"),
            Checkpoint::Commit => f.write_str("the KV commit"),
            Checkpoint::Decode => f.write_str("the decode"),
            Checkpoint::DecodedFrames { frames } => {
                write!(f, "the decode, after {frames} latent frame(s)")
            }
        }
    }
}

/// Why a token stopped a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// [`CancelToken::cancel`] was called.
    Cancelled,
    /// The token's deadline passed.
    DeadlinePassed,
}

impl fmt::Display for CancelReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CancelReason::Cancelled => "cancelled",
            CancelReason::DeadlinePassed => "deadline passed",
        })
    }
}

/// A cheap, cloneable stop signal for a session; clones share the flag.
#[derive(Debug, Clone, Default)]
pub struct CancelToken {
    flag: Arc<AtomicBool>,
    deadline: Option<Instant>,
}

impl CancelToken {
    /// A token that stops nothing until [`cancel`](Self::cancel) is called.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same token (shared flag) that also stops once `deadline` has passed.
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Asks every session holding this token (or a clone) to stop at its next checkpoint.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Release);
    }

    /// Whether [`cancel`](Self::cancel) was called (the deadline aside).
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Why the chunk must stop now, or `None` to go on.
    pub fn stop_reason(&self) -> Option<CancelReason> {
        if self.is_cancelled() {
            return Some(CancelReason::Cancelled);
        }
        match self.deadline {
            Some(at) if Instant::now() >= at => Some(CancelReason::DeadlinePassed),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn clones_share_the_flag_and_a_past_deadline_stops_at_once() {
        let token = CancelToken::new();
        let clone = token.clone();
        assert_eq!(clone.stop_reason(), None);
        token.cancel();
        assert_eq!(clone.stop_reason(), Some(CancelReason::Cancelled));
        let late = CancelToken::new().with_deadline(Instant::now());
        assert_eq!(late.stop_reason(), Some(CancelReason::DeadlinePassed));
        let far = CancelToken::new().with_deadline(Instant::now() + Duration::from_secs(3600));
        assert_eq!(far.stop_reason(), None);
    }
}
