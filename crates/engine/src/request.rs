//! What a client asks a session for.

use std::sync::Arc;

use headroom_model::camera::{Keys, Trajectory};
use headroom_model::DecoderKind;
use headroom_tensor::Tensor;

use crate::loop_io::{LatentSink, NoiseSource};

/// What a client asks for.
#[derive(Debug, Clone)]
pub struct SessionRequest {
    /// Video width in pixels (multiple of 16).
    pub width: usize,
    /// Video height in pixels (multiple of 16).
    pub height: usize,
    /// Frames: 12·K − 3 for K chunks (9, 21, 33, …), or 0 for a session that streams
    /// until it is stopped (closed, cancelled or dropped).
    pub num_frames: usize,
    /// Seed of the session's noise.
    pub seed: u64,
    /// DMD steps per block.
    pub steps: usize,
    /// Timestep shift of the DMD steps (`None`: the model's `flow_shift`, 5 unless its
    /// config says otherwise).
    pub flow_shift: Option<f64>,
    /// Text embeddings `[L, text_dim]`, or none.
    pub text_embeds: Option<Tensor>,
    /// A prompt, encoded by the model's text encoder (instead of `text_embeds`).
    pub prompt: Option<String>,
    /// First frame `[3, H, W]` in [−1, 1] for image-conditioned models (black if none).
    pub image: Option<Tensor>,
    /// Camera keys, one set per latent frame (missing frames: no key).
    pub actions: Vec<Keys>,
    /// An explicit camera trajectory (instead of actions).
    pub trajectory: Option<Trajectory>,
    /// Decode block N on a second thread while block N + 1 denoises (same output).
    pub overlap: bool,
    /// Commit the last DMD step's keys/values instead of running the commit forward
    /// (one forward fewer per block; changes the output).
    pub reuse_last_step_kv: bool,
    /// Camera guidance scale (`None`: the model's `camera_guidance`, 1 = off): each DMD
    /// step's velocity pushed away from a still camera's, two forwards a step.
    pub camera_guidance: Option<f64>,
    /// The decoder the session's blocks go through (`None`: the engine's default). A
    /// tiny decoder needs the engine to have one loaded.
    pub decoder: Option<DecoderKind>,
    /// Where the loop's noise comes from (the seeded generator by default).
    pub noise: NoiseSource,
    /// Receives each block's clean latents before its decode, if set.
    pub latent_sink: Option<Arc<dyn LatentSink>>,
}

impl SessionRequest {
    /// A request with the defaults: 4 steps, the model's shift, seed 42, no text, no image.
    pub fn new(width: usize, height: usize, num_frames: usize) -> Self {
        Self {
            width,
            height,
            num_frames,
            seed: 42,
            steps: 4,
            flow_shift: None,
            text_embeds: None,
            prompt: None,
            image: None,
            actions: Vec::new(),
            trajectory: None,
            overlap: false,
            reuse_last_step_kv: false,
            camera_guidance: None,
            decoder: None,
            noise: NoiseSource::Generator,
            latent_sink: None,
        }
    }
}
