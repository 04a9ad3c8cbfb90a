//! A stream's chunks through the tiny decoder: latents in the DiT's space, the state one
//! frame per memory block, sessions of one shape and one point of their stream batched
//! along the batch axis.

use headroom_tensor::Tensor;

use super::TinyDecoder;
use crate::decode_control::{DecodeControl, RunToEnd};
use crate::error::{ModelError, Result};
use crate::vae::{OutputFormat, StreamingDecodeState};

impl TinyDecoder {
    /// Decodes `latents[k]` (each `[1, C, T, h, w]` in the DiT's space, one shape for
    /// all) as the next chunk of the stream of `states[k]`: each stream's frames in
    /// `format` (`Video` is `[1, 3, T′, H, W]` in [−1, 1]). `control` hears `started`
    /// once the streams' caches are stacked and is asked before each latent frame after
    /// the first; `None` when it said stop (the states are then part-way through the
    /// chunk, fit only to be released).
    pub fn decode_streams(
        &self,
        latents: &[&Tensor],
        states: &mut [&mut StreamingDecodeState],
        format: OutputFormat,
        control: &dyn DecodeControl,
    ) -> Result<Option<Vec<Tensor>>> {
        self.check(latents, states)?;
        for state in states.iter_mut() {
            if state.slots.len() != self.slot_count() {
                state.slots = (0..self.slot_count()).map(|_| None).collect();
            }
            state.vae_id = Some(self.id);
        }
        let fresh = states[0].latent_frames == 0;
        let mut lists: Vec<&mut Vec<Option<Tensor>>> =
            states.iter_mut().map(|s| &mut s.slots).collect();
        let mut slots = crate::vae::batch::take_stacked(&mut lists)?;
        drop(lists);
        // After the streams' own caches went into the stack: a reclaim here returns
        // them too.
        control.started();
        let z = Tensor::cat(latents, 0)?;
        let [b, _, t, _, _] = *z.shape() else {
            unreachable!("checked 5-D")
        };
        let up = self.config.t_upscale();
        let mut outs = Vec::with_capacity(t);
        for i in 0..t {
            if i > 0 && !control.go_on(i) {
                return Ok(None);
            }
            let frame = z.narrow(2, i, 1)?.squeeze(2)?.contiguous()?;
            // A stream's first `up − 1` frames only align it with the full VAE.
            let skip = if fresh && i == 0 { up - 1 } else { 0 };
            let y = self.forward_frame(&frame, &mut slots, skip)?;
            let [_, c, h, w] = *y.shape() else {
                unreachable!("frames are 4-D")
            };
            outs.push(y.reshape(&[b, up - skip, c, h, w])?);
        }
        drop(z);
        let frames: usize = outs.iter().map(|o| o.shape()[1]).sum();
        let video = Tensor::cat(&outs.iter().collect::<Vec<_>>(), 1)?;
        drop(outs);
        let video = video.permute(&[0, 2, 1, 3, 4])?.affine(2.0, -1.0)?;
        for (state, own) in states
            .iter_mut()
            .zip(crate::vae::batch::unstack_slots(slots, b)?)
        {
            state.slots = own;
            state.advance(t, frames);
        }
        (0..b)
            .map(|k| {
                let mine = video.narrow(0, k, 1)?;
                Ok(match format {
                    OutputFormat::Video => mine.contiguous()?,
                    OutputFormat::PlanarUint8 => mine.squeeze(0)?.to_pixels()?,
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// Decodes latents `[1, C, T, h, w]` (the DiT's space) in one call: `[1, 3, T′, H, W]`
    /// in [−1, 1], `T′ = 1 + 4·(T − 1)`.
    pub fn decode(&self, z: &Tensor) -> Result<Tensor> {
        let mut state = StreamingDecodeState::new("decode")?;
        self.decode_streams(&[z], &mut [&mut state], OutputFormat::Video, &RunToEnd)?
            .and_then(|mut v| v.pop())
            .ok_or_else(|| ModelError::input("tiny decode", "no output produced"))
    }

    /// Refuses latents that are not `[1, C, T ≥ 1, h ≥ 1, w ≥ 1]` of one shape, states
    /// of another decoder, and states at different points of their streams.
    fn check(&self, latents: &[&Tensor], states: &[&mut StreamingDecodeState]) -> Result<()> {
        let op = "tiny decode";
        crate::vae::batch::check_batch(op, latents, states.len())?;
        let c = self.config.latent_channels;
        for (latent, state) in latents.iter().zip(states) {
            let [1, lc, t, h, w] = *latent.shape() else {
                return Err(ModelError::input(
                    op,
                    format!("latent must be [1, {c}, T, h, w], got {:?}", latent.shape()),
                ));
            };
            if lc != c || t == 0 || h == 0 || w == 0 {
                return Err(ModelError::input(
                    op,
                    format!(
                        "latent {:?} must have {c} channels (the decoder's), T ≥ 1 and a non-empty h, w",
                        latent.shape()
                    ),
                ));
            }
            latent.require_float(op)?;
            if state.vae_id.is_some_and(|id| id != self.id) {
                return Err(ModelError::input(
                    op,
                    format!(
                        "state of session {:?} belongs to another decoder; release it or make a new one",
                        state.session_id()
                    ),
                ));
            }
            if (state.latent_frames == 0) != (states[0].latent_frames == 0) {
                return Err(ModelError::input(
                    op,
                    "a batch needs streams at the same point: all fresh or all past their first chunk",
                ));
            }
        }
        Ok(())
    }
}
