//! A session's camera: each block's camera tokens from its action script, file
//! trajectory or live updates, and the still camera of camera guidance.

use headroom_model::camera::{
    default_intrinsics, framewise_deltas, identity, ray_embedding, CameraUpdate,
    InteractionHandler, STEP,
};
use headroom_tensor::Tensor;

use crate::error::{EngineError, Result};

use super::Session;
use crate::blocks::BLOCK_FRAMES;

impl Session {
    /// This block's camera tokens: the keys of its 3 latent frames integrated from the
    /// previous block's last pose, relative deltas normalised over the block (anchor
    /// dropped), rays on the pixel grid folded onto the latent grid (STEPWISE A4–A10).
    pub(super) fn camera_tokens(&mut self, first_frame: usize) -> Result<Option<Tensor>> {
        if !self.dit.has_camera() {
            return Ok(None);
        }
        let [h, w] = self.video_hw;
        let fold = self.vae.config().spatial_factor();
        if let Some((deltas, ks)) = &self.trajectory {
            // A file trajectory is embedded whole (normalised by its global maximum) and
            // sliced per block (STEPWISE A5).
            let range = first_frame..first_frame + BLOCK_FRAMES;
            let rays = ray_embedding(&deltas[range.clone()], h, w, &ks[range], fold, &self.device)?;
            return Ok(self.dit.camera_tokens(&rays)?);
        }
        let (poses, scale) = match self.interaction.as_mut() {
            // Interaction: the server cannot see future motion, so translations use the
            // fixed scale of one W step (STEPWISE A7).
            Some(handler) => {
                let anchor = handler.pose();
                (
                    std::iter::once(anchor)
                        .chain(handler.step_chunk(BLOCK_FRAMES))
                        .collect::<Vec<_>>(),
                    Some(STEP),
                )
            }
            None => {
                let mut poses = vec![self.controller.pose];
                for f in first_frame..first_frame + BLOCK_FRAMES {
                    let keys = self.actions.get(f).copied().unwrap_or_default();
                    poses.push(self.controller.step(keys));
                }
                (poses, None)
            }
        };
        let deltas = framewise_deltas(&poses, scale);
        let rays = ray_embedding(
            &deltas[1..],
            h,
            w,
            &[default_intrinsics(w, h)],
            fold,
            &self.device,
        )?;
        Ok(self.dit.camera_tokens(&rays)?)
    }

    /// The tokens of a camera that stands still over the block (the negative of camera
    /// guidance): identity deltas with the block's intrinsics.
    pub(super) fn still_camera_tokens(&self, first_frame: usize) -> Result<Option<Tensor>> {
        let [h, w] = self.video_hw;
        let ks = match &self.trajectory {
            Some((_, ks)) => ks[first_frame..first_frame + BLOCK_FRAMES].to_vec(),
            None => vec![default_intrinsics(w, h)],
        };
        let deltas = [identity(); BLOCK_FRAMES];
        let fold = self.vae.config().spatial_factor();
        let rays = ray_embedding(&deltas, h, w, &ks, fold, &self.device)?;
        Ok(self.dit.camera_tokens(&rays)?)
    }

    /// Queues a camera update (`target` or `velocity`); it takes effect at the next chunk
    /// boundary. A session driven by an action script refuses updates, as vllm-omni does.
    pub fn interact(&mut self, update: CameraUpdate) -> Result<()> {
        self.interact_at(update, 0)
    }

    /// Queues a camera update that starts at video frame `frame` of the next chunk (0
    /// to 8 of the first chunk, 0 to 11 of the others; past the end, its last frame):
    /// from the latent frame that frame decodes from, since a block's camera is one
    /// pose per latent frame (the first chunk's frame 0 alone is latent frame 0, then
    /// four frames a latent frame).
    pub fn interact_at(&mut self, update: CameraUpdate, frame: usize) -> Result<()> {
        let latent = if self.next_block == 0 {
            frame.div_ceil(4)
        } else {
            frame / 4
        };
        self.queue_update(update, latent.min(BLOCK_FRAMES - 1))
    }

    fn queue_update(&mut self, update: CameraUpdate, latent: usize) -> Result<()> {
        if !self.actions.is_empty() || self.trajectory.is_some() {
            return Err(EngineError::request(
                "interaction",
                "this session follows an action script; camera updates cannot be mixed with it",
            ));
        }
        self.interaction
            .get_or_insert_with(InteractionHandler::default)
            .queue_at(update, latent)?;
        Ok(())
    }
}
