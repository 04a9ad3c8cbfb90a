//! A session's prompt changes: at once, or blended over chunks (vLLM-Omni's
//! `transition_chunks`).
//!
//! A prompt conditions the model through its embeddings `[512, text_dim]` (zero-padded,
//! as the Wan pipelines feed them), turned into each layer's cross-attention keys and
//! values. A blended change moves the embeddings from the ones in effect to the new
//! prompt's over `max(1, round(3·transition_chunks))` latent frames, one block (3
//! latent frames, one chunk) at a time: block `j` after the change conditions on
//! `lerp(from, to, min(1, 3j / frames))`, and the last block of the transition on the
//! new prompt exactly. The keys/values are linear in the embeddings only up to the
//! keys' RMS norm, so it is the embeddings that blend, as vLLM-Omni blends them.
//!
//! The embeddings in effect are kept on the host (outside every allocator, a few
//! hundred KiB for `world`), so a change can start from them; a snapshot saves them
//! with the text keys/values.

use headroom_model::camera::transition_frames;
use headroom_model::{SavedTensor, StateReader, StateWriter};
use headroom_tensor::{DType, Tensor};

use super::Session;
use crate::blocks::BLOCK_FRAMES;
use crate::error::{EngineError, Result};

/// Rows of a padded prompt embedding.
const TOKENS: usize = 512;

/// Text embeddings `[512, text_dim]` in f32 on the host.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostText(Vec<f32>);

impl HostText {
    /// The host copy of padded embeddings (`None`: no text, the zeros a session
    /// without a prompt conditions on).
    /// On a meta device (a plan's twin) the values are not there: zeros stand in, the
    /// twin's allocations do not depend on them.
    pub(crate) fn of(padded: Option<&Tensor>, text_dim: usize) -> Result<Self> {
        match padded {
            Some(t) if !t.device().is_meta() => Ok(Self(t.to_dtype(DType::F32)?.to_vec::<f32>()?)),
            Some(t) => Ok(Self(vec![0.0; t.numel()])),
            None => Ok(Self(vec![0.0; TOKENS * text_dim])),
        }
    }

    /// `(1 − a)·self + a·to`, element by element.
    fn lerp(&self, to: &Self, a: f32) -> Self {
        Self(
            self.0
                .iter()
                .zip(&to.0)
                .map(|(&x, &y)| (1.0 - a) * x + a * y)
                .collect(),
        )
    }

    fn saved(&self, text_dim: usize) -> SavedTensor {
        SavedTensor {
            dtype: DType::F32,
            shape: vec![self.0.len() / text_dim.max(1), text_dim],
            bytes: self.0.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    fn from_saved(t: &SavedTensor) -> Result<Self> {
        if t.dtype != DType::F32 || !t.bytes.len().is_multiple_of(4) {
            return Err(EngineError::request(
                "text.embeds",
                "must be f32 embeddings",
            ));
        }
        Ok(Self(
            t.bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ))
    }
}

/// A blended prompt change in progress.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Blend {
    /// Latent frames the transition spans.
    frames: usize,
    /// Blocks conditioned on it so far.
    blocks: usize,
}

/// Where a session's text stands beside its keys/values: the embeddings in effect,
/// the embeddings of a change waiting for the next block, a blend in progress.
#[derive(Debug, Default)]
pub(crate) struct PromptState {
    /// The embeddings the current keys/values came from (`None` only for a session
    /// resumed from a snapshot that did not save them: its changes cannot blend).
    current: Option<HostText>,
    /// The embeddings of an at-once change (its keys/values are `pending_text`).
    pending: Option<HostText>,
    /// A blend: from, to, progress.
    blend: Option<(HostText, HostText, Blend)>,
}

impl PromptState {
    /// A session conditioned on `current` from the start.
    pub(crate) fn new(current: HostText) -> Self {
        Self {
            current: Some(current),
            ..Self::default()
        }
    }
}

impl Session {
    /// Records the padded embeddings the session opened with (`None`: no text), so
    /// that a later change can blend from them.
    pub(crate) fn with_text_embeds(mut self, padded: Option<&Tensor>) -> Result<Self> {
        self.prompt = PromptState::new(HostText::of(padded, self.dit.config().text_dim)?);
        Ok(self)
    }

    /// Whether a blended prompt change is still under way (its last block not yet
    /// begun).
    pub fn prompt_blending(&self) -> bool {
        self.prompt.blend.is_some()
    }

    /// Changes the prompt: it is encoded now (errors surface here) and conditions every
    /// block from the next chunk boundary on. With `overlap`, the block already denoised
    /// ahead keeps the old prompt, so the change shows one chunk later.
    pub fn set_prompt(&mut self, prompt: &str) -> Result<()> {
        self.set_prompt_over(prompt, 0.0)
    }

    /// Changes the prompt over `transition_chunks` chunks: its embeddings blend from
    /// the ones in effect into the new prompt's over `max(1, round(3·transition_chunks))`
    /// latent frames, one block at a time (see the module docs); `0` changes it at once,
    /// as [`Session::set_prompt`]. A change during a blend starts from where the blend
    /// stands; the last change before a boundary wins.
    pub fn set_prompt_over(&mut self, prompt: &str, transition_chunks: f64) -> Result<()> {
        check_transition(transition_chunks)?;
        let embeds = match &self.prompts {
            Some(prompts) => prompts.encode(prompt)?,
            None => {
                return Err(EngineError::request(
                    "prompt",
                    "this session was not opened by an engine with a text encoder",
                ))
            }
        };
        let padded =
            crate::text::pad_text(embeds.as_ref(), self.dit.config().text_dim, &self.device)?;
        self.change_text(padded.as_ref(), transition_frames(transition_chunks))
    }

    /// Changes the text to embeddings `[L, text_dim]` (zero-padded to 512 tokens, as
    /// at the start): like [`Session::set_prompt`], from the next block denoised on.
    pub fn set_text_embeds(&mut self, embeds: &Tensor) -> Result<()> {
        self.set_text_embeds_over(embeds, 0.0)
    }

    /// [`Session::set_text_embeds`] over `transition_chunks` chunks, blended as
    /// [`Session::set_prompt_over`] blends.
    pub fn set_text_embeds_over(&mut self, embeds: &Tensor, transition_chunks: f64) -> Result<()> {
        check_transition(transition_chunks)?;
        let text = crate::text::pad_text(Some(embeds), self.dit.config().text_dim, &self.device)?;
        self.change_text(text.as_ref(), transition_frames(transition_chunks))
    }

    /// Queues the change to padded embeddings `text` over `frames` latent frames.
    fn change_text(&mut self, text: Option<&Tensor>, frames: usize) -> Result<()> {
        let to = HostText::of(text, self.dit.config().text_dim)?;
        let p = &mut self.prompt;
        // What the next block would condition on without this change.
        let from = match (p.pending.take(), p.blend.take()) {
            (Some(pending), _) => Some(pending),
            (None, Some((from, to, blend))) => {
                // Where the blend stands after its last block.
                Some(from.lerp(&to, blend_weight(&blend)))
            }
            (None, None) => p.current.clone(),
        };
        self.pending_text = None;
        match from {
            Some(from) if frames > 0 => {
                p.blend = Some((from, to, Blend { frames, blocks: 0 }));
            }
            _ => {
                self.pending_text = Some(self.dit.text_key_values(text)?);
                p.pending = Some(to);
            }
        }
        Ok(())
    }

    /// At the start of a block: a change waiting takes effect, or a blend takes its
    /// next step.
    pub(crate) fn advance_text(&mut self) -> Result<()> {
        if let Some(text) = self.pending_text.take() {
            // A prompt change takes effect at the first block denoised after it.
            self.text = text;
            if let Some(embeds) = self.prompt.pending.take() {
                self.prompt.current = Some(embeds);
            }
            return Ok(());
        }
        let Some((from, to, mut blend)) = self.prompt.blend.take() else {
            return Ok(());
        };
        blend.blocks += 1;
        let a = blend_weight(&blend);
        let now = if a >= 1.0 {
            to.clone()
        } else {
            from.lerp(&to, a)
        };
        let dim = self.dit.config().text_dim;
        let t = Tensor::from_f32(&now.0, &[now.0.len() / dim, dim], DType::F32, &self.device)?;
        self.text = self.dit.text_key_values(Some(&t))?;
        self.prompt.current = Some(now);
        if a < 1.0 {
            self.prompt.blend = Some((from, to, blend));
        }
        Ok(())
    }

    /// Saves the prompt state under `w` (the `text` scope, beside the keys/values).
    pub(crate) fn save_prompt(&self, w: &mut StateWriter<'_>) -> Result<()> {
        let dim = self.dit.config().text_dim;
        let p = &self.prompt;
        if let Some(current) = &p.current {
            w.saved("embeds", current.saved(dim));
        }
        if let Some(pending) = &p.pending {
            w.saved("pending_embeds", pending.saved(dim));
        }
        if let Some((from, to, blend)) = &p.blend {
            w.saved("blend_from", from.saved(dim));
            w.saved("blend_to", to.saved(dim));
            w.field("blend", blend)?;
        }
        Ok(())
    }

    /// Reads back what [`Session::save_prompt`] wrote (absent parts stay absent).
    pub(crate) fn restore_prompt(&mut self, r: &StateReader<'_>) -> Result<()> {
        let host = |name: &str| -> Result<Option<HostText>> {
            if r.has_tensor(name) {
                Ok(Some(HostText::from_saved(r.saved(name)?)?))
            } else {
                Ok(None)
            }
        };
        self.prompt = PromptState {
            current: host("embeds")?,
            pending: host("pending_embeds")?,
            blend: match (host("blend_from")?, host("blend_to")?) {
                (Some(from), Some(to)) => Some((from, to, r.field("blend")?)),
                _ => None,
            },
        };
        Ok(())
    }
}

/// `transition_chunks` must be a finite number ≥ 0.
fn check_transition(chunks: f64) -> Result<()> {
    if chunks.is_finite() && chunks >= 0.0 {
        Ok(())
    } else {
        Err(EngineError::request(
            "transition_chunks",
            format!("must be a finite number ≥ 0, got {chunks}"),
        ))
    }
}

/// The blend's weight on the new prompt after its blocks so far.
fn blend_weight(b: &Blend) -> f32 {
    ((b.blocks * BLOCK_FRAMES) as f32 / b.frames.max(1) as f32).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transition_spans_round_three_per_chunk_latent_frames() {
        assert_eq!(transition_frames(0.0), 0);
        assert_eq!(transition_frames(-1.0), 0);
        assert_eq!(transition_frames(1.0), 3);
        assert_eq!(transition_frames(3.0), 9);
        assert_eq!(transition_frames(0.1), 1);
        assert_eq!(transition_frames(1.5), 5);
        let w = |blocks, frames| blend_weight(&Blend { frames, blocks });
        // Three chunks: a third, two thirds, all.
        assert_eq!([w(1, 9), w(2, 9), w(3, 9)], [1.0 / 3.0, 2.0 / 3.0, 1.0]);
        // Shorter than a chunk: done at the first block.
        assert_eq!(w(1, 1), 1.0);
    }

    #[test]
    fn host_text_lerps_and_saves_exactly() {
        let a = HostText(vec![0.0, 2.0, -4.0, 1.0]);
        let b = HostText(vec![4.0, 2.0, 0.0, 1.0]);
        assert_eq!(a.lerp(&b, 0.25).0, vec![1.0, 2.0, -3.0, 1.0]);
        let saved = a.saved(2);
        assert_eq!(saved.shape, vec![2, 2]);
        assert_eq!(HostText::from_saved(&saved).unwrap(), a);
    }
}
