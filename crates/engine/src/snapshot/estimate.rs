//! What a session's snapshot holds, from the configs alone (no weights, no session):
//! what `headroom plan` reports per session, and `bench snapshot` for models too large
//! to run here. It describes a session in steady state at a chunk boundary — its KV
//! window full, a prompt's 512 tokens of text keys/values, its image condition settled
//! (before that, the condition's encoder cache adds to it) — and a test holds it to the
//! bytes of real snapshots.

use headroom_model::DecoderKind;
use serde::Serialize;

use crate::blocks::BLOCK_FRAMES;
use crate::engine::Engine;
use crate::error::Result;

/// Text tokens a prompt's keys/values hold (the Wan pipelines pad to 512).
const TEXT_TOKENS: usize = 512;

/// A session's snapshot by part, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct SnapshotEstimate {
    /// Committed KV pages: the window less one block (the sink included), every layer.
    pub kv_bytes: u64,
    /// The prompt's text keys/values (512 tokens, every layer).
    pub text_bytes: u64,
    /// The image condition's current block (image-conditioned models).
    pub condition_bytes: u64,
    /// The decoder's streaming state.
    pub decoder_bytes: u64,
    /// A block denoised ahead (`overlap`).
    pub pending_bytes: u64,
    /// The sum: bytes a parked session holds in host memory, and a snapshot file's
    /// tensor data.
    pub total_bytes: u64,
    /// The largest device allocation a snapshot adds while it is written: one layer's
    /// keys (or values) of the whole history, gathered into one tensor for a single
    /// device-to-host copy.
    pub staging_bytes: u64,
}

impl Engine {
    /// The snapshot of a session of `width × height` decoding with `decoder` (the
    /// engine's default if `None`), with `overlap` or not, in steady state.
    pub fn snapshot_estimate(
        &self,
        width: usize,
        height: usize,
        decoder: Option<DecoderKind>,
        overlap: bool,
    ) -> Result<SnapshotEstimate> {
        let c = self.transformer().config();
        let vae = self.vae().config();
        let s = vae.spatial_factor();
        let (h, w) = (height / s, width / s);
        let tokens = (h / c.patch_size[1]) * (w / c.patch_size[2]);
        let heads = self.transformer().kv_heads();
        let d = c.attention_head_dim;
        let history = self.config().window_frames.saturating_sub(BLOCK_FRAMES);
        let layer_side = (history * tokens * heads * d * self.config().weight_dtype.size()) as u64;
        let kv_bytes = 2 * c.num_layers as u64 * layer_side;
        let text_bytes = (2 * c.num_layers * TEXT_TOKENS * heads * d * 4) as u64;
        let cell = (BLOCK_FRAMES * h * w * 4) as u64;
        let condition_bytes = if c.takes_image_condition() {
            (headroom_model::dit::config::IMAGE_MASK_CHANNELS + vae.z_dim) as u64 * cell
        } else {
            0
        };
        let decoder_bytes = self.decoder_for(decoder)?.state_bytes(height, width);
        let pending_bytes = if overlap {
            c.out_channels() as u64 * cell
        } else {
            0
        };
        Ok(SnapshotEstimate {
            kv_bytes,
            text_bytes,
            condition_bytes,
            decoder_bytes,
            pending_bytes,
            total_bytes: kv_bytes + text_bytes + condition_bytes + decoder_bytes + pending_bytes,
            staging_bytes: layer_side,
        })
    }
}
