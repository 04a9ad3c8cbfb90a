//! What a session's snapshot will hold, from the engine's configs alone
//! ([`SnapshotEstimate`]).

use headroom_model::DecoderKind;

use super::Engine;
use crate::blocks::BLOCK_FRAMES;
use crate::error::Result;
use crate::snapshot::SnapshotEstimate;

/// Text tokens a prompt's keys/values hold (the Wan pipelines pad to 512).
const TEXT_TOKENS: usize = 512;

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
        // Each layer's keys/values, and the embeddings they came from (kept on the
        // host so that a prompt change can blend from them).
        let text_bytes =
            (2 * c.num_layers * TEXT_TOKENS * heads * d * 4 + TEXT_TOKENS * c.text_dim * 4) as u64;
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
