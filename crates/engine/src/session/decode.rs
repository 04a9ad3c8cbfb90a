//! A chunk's decode: the session's decoder state turns a denoised block into frames,
//! alone or on a second thread while the next block denoises (overlap).

use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_mem::MemoryStats;
use headroom_model::{OutputFormat, StreamingDecodeState, VideoDecoder, WanVae};
use headroom_tensor::Tensor;

use super::step::Denoised;
use super::{cancelled, Chunk, ChunkTimings, Session};
use crate::cancel::{CancelToken, Checkpoint};
use crate::condition::ImageCondition;
use crate::error::{EngineError, Result};
use crate::phases;

/// Decodes clean block latents into u8 frames `[T, H, W, 3]` through the session's
/// decoder state, looking at `cancel` before it starts and between latent frames.
fn decode_block(
    decoder: &dyn VideoDecoder,
    state: &mut StreamingDecodeState,
    x0: &Tensor,
    cancel: &CancelToken,
    id: &str,
) -> Result<(Tensor, Duration)> {
    if let Some(e) = cancelled(cancel, id, Checkpoint::Decode) {
        return Err(e);
    }
    let start = Instant::now();
    let stopped_after = std::cell::Cell::new(None);
    let go_on = |frames| {
        let stop = cancel.stop_reason().is_some();
        if stop {
            stopped_after.set(Some(frames));
        }
        !stop
    };
    let control = phases::DecodeStart::on(x0.device().platform().as_ref()).until(&go_on);
    let pixels = decoder
        .decode_streams(&[x0], &mut [state], OutputFormat::PlanarUint8, &control)?
        .and_then(|mut v| v.pop());
    let Some(pixels) = pixels else {
        let at = Checkpoint::DecodedFrames {
            frames: stopped_after.get().unwrap_or(0),
        };
        return Err(cancelled(cancel, id, at)
            .unwrap_or_else(|| EngineError::Internal("the decode produced no frames".into())));
    };
    Ok((frames_of(pixels)?, start.elapsed()))
}

/// Planar u8 pixels `[3, T, H, W]` as the frames of a chunk, `[T, H, W, 3]`.
pub(crate) fn frames_of(pixels: Tensor) -> Result<Tensor> {
    let pixels = pixels.permute(&[1, 2, 3, 0])?.contiguous()?;
    pixels.device().synchronize()?;
    Ok(pixels)
}

impl Session {
    /// Hands the denoised block `n` to the latent sink, decodes it through the
    /// session's decoder state and makes the chunk (the path without overlap).
    pub(crate) fn decode_chunk(
        &mut self,
        n: usize,
        block: Denoised,
        stats_denoise_end: MemoryStats,
    ) -> Result<Chunk> {
        if let Some(sink) = &self.latent_sink {
            sink.accept(n, &block.x0)?;
        }
        let (frames, decode) = decode_block(
            self.decoder.as_ref(),
            &mut self.decode_state,
            &block.x0,
            &self.cancel,
            &self.id,
        )?;
        Ok(self.delivered(n, &block, frames, decode, stats_denoise_end))
    }

    /// What a batched decode of block `n` takes from this session: the block goes to
    /// the latent sink and the cancel token is looked at.
    pub(crate) fn decode_input(&self, n: usize, block: &Denoised) -> Result<()> {
        if let Some(sink) = &self.latent_sink {
            sink.accept(n, &block.x0)?;
        }
        self.checkpoint(Checkpoint::Decode)
    }

    /// The session's decoder and its state, for a batched decode.
    pub(crate) fn decoder(&mut self) -> (&Arc<dyn VideoDecoder>, &mut StreamingDecodeState) {
        (&self.decoder, &mut self.decode_state)
    }

    /// The session's image condition, VAE and video size, for a batched encode.
    pub(crate) fn condition(&mut self) -> Option<(&mut ImageCondition, &Arc<WanVae>, [usize; 2])> {
        let hw = self.video_hw;
        self.cond.as_mut().map(|c| (c, &self.vae, hw))
    }

    /// Block `n`'s chunk of `frames`, decoded in `decode`; the session moves on.
    pub(crate) fn delivered(
        &mut self,
        n: usize,
        block: &Denoised,
        frames: Tensor,
        decode: Duration,
        stats_denoise_end: MemoryStats,
    ) -> Chunk {
        self.next_block += 1;
        self.mid_block = false;
        Chunk {
            index: n,
            frames,
            timings: ChunkTimings {
                denoise: block.denoise,
                commit: block.commit,
                decode,
            },
            stats_denoise_end,
            stats_decoded: self.device.platform().memory_stats(),
        }
    }

    pub(super) fn try_next_chunk(&mut self) -> Result<Chunk> {
        let n = self.chunk_start()?;
        let platform = self.device.platform().clone();
        let block = match self.pending.take() {
            Some(block) => block,
            None => {
                let block = self.denoise_block(n)?;
                phases::denoise_end(platform.as_ref());
                block
            }
        };
        let stats_denoise_end = platform.memory_stats();
        if !(self.overlap && self.blocks.is_none_or(|b| n + 1 < b)) {
            return self.decode_chunk(n, block, stats_denoise_end);
        }
        if let Some(sink) = &self.latent_sink {
            sink.accept(n, &block.x0)?;
        }
        let (frames, decode) = {
            // Decode block n on a second thread while block n + 1 denoises here; the
            // decoder state moves to that thread and back.
            let placeholder = StreamingDecodeState::new(&self.id)?;
            let mut state = std::mem::replace(&mut self.decode_state, placeholder);
            let decoder = Arc::clone(&self.decoder);
            let x0 = block.x0.clone();
            let (cancel, id) = (self.cancel.clone(), self.id.clone());
            // The decode belongs to this session's planned span on that thread too.
            let (allocator, span) = (self.device.platform().allocator().clone(), self.span);
            let (decoded, next) = std::thread::scope(|scope| {
                let worker = scope.spawn(move || {
                    let _inside = allocator.enter_span(span);
                    let out = decode_block(decoder.as_ref(), &mut state, &x0, &cancel, &id);
                    (out, state)
                });
                let next = self.denoise_block(n + 1);
                (worker.join(), next)
            });
            let (decoded, state) =
                decoded.map_err(|_| EngineError::Internal("the decode thread panicked".into()))?;
            self.decode_state = state;
            self.pending = Some(next?);
            phases::denoise_end(platform.as_ref());
            decoded?
        };
        Ok(self.delivered(n, &block, frames, decode, stats_denoise_end))
    }
}
