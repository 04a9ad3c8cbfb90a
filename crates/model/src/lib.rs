//! Wan-family networks on headroom's tensor runtime: weights by diffusers key, the Wan
//! 2.1 causal VAE and its session-owned streaming decoder, TAEHV's tiny decoder, and the
//! one decoder interface over both.
//!
//! The trade-off: the networks are written layer by layer against diffusers' names and
//! checked against its outputs, so a new checkpoint layout is an import, not a new
//! model; what diffusers does not have (streaming caches, KV pages) is ours to prove.
#![warn(missing_docs, missing_debug_implementations)]

pub mod camera;
pub mod checkpoint;
pub mod decode_control;
pub mod decoder;
pub mod dit;
pub mod dmd;
pub mod error;
pub mod import;
pub mod kv;
pub mod state;
pub mod taehv;
pub mod vae;
pub mod weights;

pub use decode_control::{DecodeControl, RunToEnd};
pub use decoder::{DecoderKind, VideoDecoder};
pub use dit::{DitConfig, WanTransformer};
pub use error::{ModelError, Result};
pub use state::{SavedState, SavedTensor, StateReader, StateWriter};
pub use taehv::{TinyConfig, TinyDecoder};
pub use vae::{OutputFormat, StreamingDecodeState, StreamingDecoder, VaeConfig, WanVae};
pub use weights::{WeightFormat, WeightStore};

/// What a model's products compute in for weights of `dtype`: bf16 weights give a bf16
/// model (activations rounded to bf16 at each GEMM, f32 accumulation); f32 weights the
/// runtime's f32 choice (exact, or near-f32 on AMX when asked).
pub fn compute_for(dtype: headroom_tensor::DType) -> headroom_tensor::kernels::gemm::Compute {
    use headroom_tensor::kernels::gemm::{f32_compute, Compute};
    if dtype == headroom_tensor::DType::BF16 {
        Compute::Bf16
    } else {
        f32_compute()
    }
}
