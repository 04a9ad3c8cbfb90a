//! Block arithmetic: a session generates its latent frames in blocks of
//! [`BLOCK_FRAMES`], and the VAE's 4× temporal compression (the first frame alone) makes
//! `n` blocks `12·n − 3` video frames.

/// Latent frames per autoregressive block.
pub const BLOCK_FRAMES: usize = 3;

/// Video frames of `blocks` whole blocks: `4 · 3 · blocks − 3` (the first latent frame
/// decodes to one frame, every other to four).
pub fn frames_for_blocks(blocks: usize) -> usize {
    (4 * BLOCK_FRAMES * blocks).saturating_sub(3)
}

/// Latent frames of `num_frames` video frames, `(num_frames + 3) / 4`, counted in whole
/// blocks (`num_frames + 3` a multiple of 12 makes them exact).
pub fn latent_frames_in_blocks(num_frames: usize) -> usize {
    (num_frames + 3) / (4 * BLOCK_FRAMES) * BLOCK_FRAMES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_and_frames_convert_both_ways() {
        assert_eq!(frames_for_blocks(1), 9);
        assert_eq!(frames_for_blocks(3), 33);
        assert_eq!(latent_frames_in_blocks(33), 9);
        assert_eq!(
            latent_frames_in_blocks(frames_for_blocks(7)),
            7 * BLOCK_FRAMES
        );
    }
}
