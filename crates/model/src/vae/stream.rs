//! The session-owned streaming decoder (REFERENCE.md §5).
//!
//! A [`StreamingDecodeState`] belongs to one session and holds one slot per causal conv
//! of the decoder (the last two frames of that conv's input) plus counters; the shared
//! [`WanVae`] is never mutated. Decoding runs one latent frame at a time, so peak memory
//! per frame does not grow with the session, and the state has a fixed size after the
//! first chunk: chunking is neutral, bit for bit.

use std::fmt;
use std::str::FromStr;

use headroom_tensor::{DType, Tensor};

use super::blocks::Slots;
use super::WanVae;
use crate::decode_control::{DecodeControl, RunToEnd};
use crate::error::{ModelError, Result};
use crate::state::{StateReader, StateWriter};

/// What `decode_chunk` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// f32 `[1, 3, T', H, W]` clamped to [−1, 1].
    Video,
    /// u8 `[3, T', H, W]`, `round(clamp((x + 1)/2, 0, 1) · 255)`.
    PlanarUint8,
}

impl FromStr for OutputFormat {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "video" => Ok(OutputFormat::Video),
            "planar_uint8" => Ok(OutputFormat::PlanarUint8),
            other => Err(ModelError::input(
                "decode_chunk",
                format!("unknown output format {other:?}; use video or planar_uint8"),
            )),
        }
    }
}

impl fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutputFormat::Video => "video",
            OutputFormat::PlanarUint8 => "planar_uint8",
        })
    }
}

/// One session's decoder cache and progress.
#[derive(Debug)]
pub struct StreamingDecodeState {
    session_id: String,
    pub(crate) vae_id: Option<u64>,
    pub(crate) slots: Vec<Option<Tensor>>,
    pub(crate) latent_frames: usize,
    /// Chunks decoded since creation or the last release.
    pub chunks_decoded: usize,
    /// Video frames produced since creation or the last release.
    pub frames_decoded: usize,
}

impl StreamingDecodeState {
    /// A fresh state for `session_id` (must not be blank).
    pub fn new(session_id: &str) -> Result<Self> {
        if session_id.trim().is_empty() {
            return Err(ModelError::input(
                "StreamingDecodeState",
                "session id must not be blank",
            ));
        }
        Ok(Self {
            session_id: session_id.to_string(),
            vae_id: None,
            slots: Vec::new(),
            latent_frames: 0,
            chunks_decoded: 0,
            frames_decoded: 0,
        })
    }

    /// The session this state belongs to.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Bytes held by the cache slots.
    pub fn nbytes(&self) -> u64 {
        self.slots
            .iter()
            .flatten()
            .map(|t| (t.numel() * t.dtype().size()) as u64)
            .sum()
    }

    /// Counts a decoded chunk of `latent_frames` latent frames and `frames` video frames.
    pub(crate) fn advance(&mut self, latent_frames: usize, frames: usize) {
        self.latent_frames += latent_frames;
        self.chunks_decoded += 1;
        self.frames_decoded += frames;
    }

    /// Saves the cache slots and counters (the decoder's id is not saved: a restored
    /// state is bound to the decoder it is restored for).
    pub fn save(&self, w: &mut StateWriter<'_>) -> Result<()> {
        w.field("bound", &self.vae_id.is_some())?;
        w.field("latent_frames", &self.latent_frames)?;
        w.field("chunks_decoded", &self.chunks_decoded)?;
        w.field("frames_decoded", &self.frames_decoded)?;
        w.slots("slot", &self.slots)
    }

    /// A state for `session_id` holding what [`Self::save`] saved, bound to the decoder
    /// of id `decoder_id` if it was bound to one.
    pub fn restore(session_id: &str, decoder_id: u64, r: &StateReader<'_>) -> Result<Self> {
        let mut state = Self::new(session_id)?;
        state.slots = r.slots("slot")?;
        state.vae_id = r.field::<bool>("bound")?.then_some(decoder_id);
        state.latent_frames = r.field("latent_frames")?;
        state.chunks_decoded = r.field("chunks_decoded")?;
        state.frames_decoded = r.field("frames_decoded")?;
        Ok(state)
    }

    /// Gives every cached frame back and resets the counters: the next chunk decodes as
    /// the first of a stream.
    pub fn release(&mut self) {
        self.slots.clear();
        self.vae_id = None;
        self.latent_frames = 0;
        self.chunks_decoded = 0;
        self.frames_decoded = 0;
    }
}

/// Decodes a session's latents chunk by chunk against its [`StreamingDecodeState`].
#[derive(Debug, Clone, Copy)]
pub struct StreamingDecoder<'a> {
    vae: &'a WanVae,
    state_dtype: DType,
}

impl<'a> StreamingDecoder<'a> {
    /// A decoder over `vae` keeping cached frames in `state_dtype` (f32 if `None`).
    pub fn new(vae: &'a WanVae, state_dtype: Option<DType>) -> Self {
        Self {
            vae,
            state_dtype: state_dtype.unwrap_or(DType::F32),
        }
    }

    /// Bytes a state holds after its first chunk for video of `height × width`, from the
    /// config alone.
    pub fn declared_state_bytes(&self, height: usize, width: usize, dtype: DType) -> u64 {
        let s = self.vae.config().spatial_factor();
        let (h, w) = (height / s, width / s);
        self.vae
            .decoder()
            .slot_layout()
            .into_iter()
            .map(|(frames, channels, scale)| {
                (frames * channels * h * scale * w * scale * dtype.size()) as u64
            })
            .sum()
    }

    /// Decodes `latent [1, z_dim, T, h, w]` (denormalised) as the next chunk of the
    /// session. The first thing it does is cross the platform's `decode_start` boundary
    /// (its reclaim policy may release cached memory). With `produce_output` false the
    /// state and counters still advance and `None` is returned.
    pub fn decode_chunk(
        &self,
        latent: &Tensor,
        state: &mut StreamingDecodeState,
        format: OutputFormat,
        produce_output: bool,
    ) -> Result<Option<Tensor>> {
        self.decode_chunk_with(latent, state, format, produce_output, &RunToEnd)
    }

    /// [`decode_chunk`](Self::decode_chunk) under `control`: it hears `started` first,
    /// before any of the decode's allocations, and is asked before each latent frame
    /// after the first; when it says stop this returns `None` and the state is part-way
    /// through the chunk, fit only to be released.
    pub fn decode_chunk_with(
        &self,
        latent: &Tensor,
        state: &mut StreamingDecodeState,
        format: OutputFormat,
        produce_output: bool,
        control: &dyn DecodeControl,
    ) -> Result<Option<Tensor>> {
        control.started();
        self.check(latent, state)?;
        self.adopt(state);
        let x = self.vae.post_quant(latent)?;
        let t = x.shape()[2];
        let Some((outs, frames)) =
            self.run_frames(&x, &mut state.slots, produce_output, control)?
        else {
            return Ok(None);
        };
        state.advance(t, frames);
        if !produce_output {
            return Ok(None);
        }
        let refs: Vec<&Tensor> = outs.iter().collect();
        let video = Tensor::cat(&refs, 2)?;
        drop(outs);
        Ok(Some(match format {
            OutputFormat::Video => video,
            OutputFormat::PlanarUint8 => video.squeeze(0)?.to_pixels()?,
        }))
    }

    /// Decodes the next chunk of several sessions at once: `latents[k]` (each
    /// `[1, z_dim, T, h, w]`, one shape for all) against `states[k]`, their cache slots
    /// stacked along the batch axis for the chunk and handed back after it. Rows of
    /// different sessions never mix, so each gets the bytes [`Self::decode_chunk`]
    /// gives it alone. The states must be at the same point of a stream: all fresh, or
    /// all past their first chunk. Returns each session's frames in `format`.
    pub fn decode_batch(
        &self,
        latents: &[&Tensor],
        states: &mut [&mut StreamingDecodeState],
        format: OutputFormat,
    ) -> Result<Vec<Tensor>> {
        self.decode_batch_with(latents, states, format, &RunToEnd)
    }

    /// [`decode_batch`](Self::decode_batch) under `control`: it hears `started` once the
    /// sessions' caches are stacked (so a reclaim then returns those too) and is never
    /// asked to stop (a batch runs whole).
    pub fn decode_batch_with(
        &self,
        latents: &[&Tensor],
        states: &mut [&mut StreamingDecodeState],
        format: OutputFormat,
        control: &dyn DecodeControl,
    ) -> Result<Vec<Tensor>> {
        let op = "decode_batch";
        crate::vae::batch::check_batch(op, latents, states.len())?;
        for (latent, state) in latents.iter().zip(states.iter()) {
            self.check(latent, state)?;
        }
        for state in states.iter_mut() {
            self.adopt(state);
        }
        let mut lists: Vec<&mut Vec<Option<Tensor>>> =
            states.iter_mut().map(|s| &mut s.slots).collect();
        let mut slots = super::batch::take_stacked(&mut lists)?;
        drop(lists);
        // After the sessions' own caches went into the stack: a reclaim here returns
        // them too.
        control.started();
        let refs: Vec<&Tensor> = latents.to_vec();
        let x = self.vae.post_quant(&Tensor::cat(&refs, 0)?)?;
        let t = x.shape()[2];
        let (outs, frames) = self
            .run_frames(&x, &mut slots, true, &RunToEnd)?
            .ok_or_else(|| ModelError::input(op, "no frames produced"))?;
        drop(x);
        for (state, own) in states
            .iter_mut()
            .zip(super::batch::unstack_slots(slots, latents.len())?)
        {
            state.slots = own;
            state.advance(t, frames);
        }
        let video = Tensor::cat(&outs.iter().collect::<Vec<_>>(), 2)?;
        drop(outs);
        (0..latents.len())
            .map(|k| {
                let mine = video.narrow(0, k, 1)?;
                Ok(match format {
                    OutputFormat::Video => mine.contiguous()?,
                    OutputFormat::PlanarUint8 => mine.squeeze(0)?.to_pixels()?,
                })
            })
            .collect()
    }

    /// Sizes `state`'s slot list for this decoder and marks the state as its own.
    fn adopt(&self, state: &mut StreamingDecodeState) {
        let slot_count = self.vae.decoder().slot_count();
        if state.slots.len() != slot_count {
            state.slots = (0..slot_count).map(|_| None).collect();
        }
        state.vae_id = Some(self.vae.id());
    }

    /// The decoder over each latent frame of post-quant `x` against `slots`: each
    /// frame's clamped output when `keep` (else none) and the video frames made, or
    /// `None` when `control` said stop before a frame after the first.
    fn run_frames(
        &self,
        x: &Tensor,
        slots: &mut [Option<Tensor>],
        keep: bool,
        control: &dyn DecodeControl,
    ) -> Result<Option<(Vec<Tensor>, usize)>> {
        let t = x.shape()[2];
        let mut outs = Vec::with_capacity(if keep { t } else { 0 });
        let mut frames = 0;
        for i in 0..t {
            if i > 0 && !control.go_on(i) {
                return Ok(None);
            }
            let mut cache = Slots {
                slots: &mut *slots,
                dtype: self.state_dtype,
            };
            let y = self
                .vae
                .decoder()
                .forward(&x.narrow(2, i, 1)?, &mut cache)?;
            frames += y.shape()[2];
            if keep {
                outs.push(y.clamp(-1.0, 1.0)?);
            }
        }
        Ok(Some((outs, frames)))
    }

    /// Refuses a latent that is not `[1, z_dim, T ≥ 1, h, w]` or a state of another
    /// decoder.
    fn check(&self, latent: &Tensor, state: &StreamingDecodeState) -> Result<()> {
        let op = "decode_chunk";
        let z = self.vae.config().z_dim;
        let [b, c, t, h, w] = *latent.shape() else {
            return Err(ModelError::input(
                op,
                format!(
                    "latent must be 5-D [B, C, T, H, W], got {:?}",
                    latent.shape()
                ),
            ));
        };
        if b != 1 {
            return Err(ModelError::input(
                op,
                format!("batch must be 1, got {b} (shape {:?})", latent.shape()),
            ));
        }
        if t == 0 {
            return Err(ModelError::input(
                op,
                format!("latent has no frames (T = 0, shape {:?})", latent.shape()),
            ));
        }
        if c != z {
            return Err(ModelError::input(
                op,
                format!("latent has {c} channels, the VAE's z_dim is {z}"),
            ));
        }
        if h == 0 || w == 0 {
            return Err(ModelError::input(
                op,
                format!("latent {:?} has an empty spatial axis", latent.shape()),
            ));
        }
        latent.require_float(op)?;
        match state.vae_id {
            Some(id) if id != self.vae.id() => {
                return Err(ModelError::input(
                    op,
                    format!("state of session {:?} belongs to another decoder; release it or make a new one", state.session_id),
                ));
            }
            _ => {}
        }
        Ok(())
    }
}
