//! One interface over the decoders a session may have: the Wan causal VAE's
//! ([`WanVae`]) and TAEHV's tiny one ([`TinyDecoder`]). Both take a block's latents in
//! the DiT's space, keep the session's streaming state in a [`StreamingDecodeState`],
//! batch sessions at the same point of their streams, and say what their state holds,
//! so the engine, the scheduler and the plan never ask which one a session has.

use std::fmt;
use std::str::FromStr;

use headroom_tensor::{DType, Tensor};

use crate::decode_control::DecodeControl;
use crate::error::{ModelError, Result};
use crate::taehv::TinyDecoder;
use crate::vae::{OutputFormat, StreamingDecodeState, StreamingDecoder, WanVae};

/// Which decoder a session decodes with.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum DecoderKind {
    /// The model's own causal VAE decoder.
    #[default]
    Full,
    /// A TAEHV tiny decoder.
    Tiny,
}

impl DecoderKind {
    /// The name used on the command line and in the protocol.
    pub fn as_str(self) -> &'static str {
        match self {
            DecoderKind::Full => "full",
            DecoderKind::Tiny => "tiny",
        }
    }
}

impl FromStr for DecoderKind {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "full" => Ok(DecoderKind::Full),
            "tiny" => Ok(DecoderKind::Tiny),
            other => Err(ModelError::input(
                "decoder",
                format!("{other:?} is not a decoder: use \"full\" or \"tiny\""),
            )),
        }
    }
}

impl fmt::Display for DecoderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A session decoder: latents in the DiT's space in, frames out, state kept by the
/// session.
pub trait VideoDecoder: fmt::Debug + Send + Sync {
    /// Which kind it is (for reports only: nothing decides on it).
    fn kind(&self) -> DecoderKind;
    /// A process-unique id: sessions with one id may share a batch.
    fn id(&self) -> u64;
    /// Latent channels it decodes.
    fn latent_channels(&self) -> usize;
    /// Pixels per latent cell along each side.
    fn spatial_factor(&self) -> usize;
    /// Bytes a session's state holds for video of `height × width`.
    fn state_bytes(&self, height: usize, width: usize) -> u64;
    /// Decodes `latents[k]` (`[1, C, T, h, w]`, one shape) as the next chunk of the
    /// session of `states[k]` (all at one point of their streams), telling `control`
    /// when the decode proper starts and asking it before each latent frame after the
    /// first: each session's frames in `format`, or `None` when it said stop.
    fn decode_streams(
        &self,
        latents: &[&Tensor],
        states: &mut [&mut StreamingDecodeState],
        format: OutputFormat,
        control: &dyn DecodeControl,
    ) -> Result<Option<Vec<Tensor>>>;
}

impl VideoDecoder for WanVae {
    fn kind(&self) -> DecoderKind {
        DecoderKind::Full
    }
    fn id(&self) -> u64 {
        WanVae::id(self)
    }
    fn latent_channels(&self) -> usize {
        self.config().z_dim
    }
    fn spatial_factor(&self) -> usize {
        self.config().spatial_factor()
    }
    fn state_bytes(&self, height: usize, width: usize) -> u64 {
        StreamingDecoder::new(self, None).declared_state_bytes(height, width, DType::F32)
    }
    fn decode_streams(
        &self,
        latents: &[&Tensor],
        states: &mut [&mut StreamingDecodeState],
        format: OutputFormat,
        control: &dyn DecodeControl,
    ) -> Result<Option<Vec<Tensor>>> {
        let decoder = StreamingDecoder::new(self, None);
        if let ([latent], [state]) = (latents, &mut *states) {
            let z = self.denormalize(latent)?;
            return Ok(decoder
                .decode_chunk_with(&z, state, format, true, control)?
                .map(|out| vec![out]));
        }
        let zs = latents
            .iter()
            .map(|l| self.denormalize(l))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = zs.iter().collect();
        decoder
            .decode_batch_with(&refs, states, format, control)
            .map(Some)
    }
}

impl VideoDecoder for TinyDecoder {
    fn kind(&self) -> DecoderKind {
        DecoderKind::Tiny
    }
    fn id(&self) -> u64 {
        TinyDecoder::id(self)
    }
    fn latent_channels(&self) -> usize {
        self.config().latent_channels
    }
    fn spatial_factor(&self) -> usize {
        self.config().spatial_factor()
    }
    fn state_bytes(&self, height: usize, width: usize) -> u64 {
        self.config().state_bytes(height, width, self.state_dtype())
    }
    fn decode_streams(
        &self,
        latents: &[&Tensor],
        states: &mut [&mut StreamingDecodeState],
        format: OutputFormat,
        control: &dyn DecodeControl,
    ) -> Result<Option<Vec<Tensor>>> {
        TinyDecoder::decode_streams(self, latents, states, format, control)
    }
}
