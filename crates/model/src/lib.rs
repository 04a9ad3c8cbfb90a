//! Wan-family networks on headroom's tensor runtime: weights by diffusers key, the Wan
//! 2.1 causal VAE and its session-owned streaming decoder.
#![warn(missing_docs, missing_debug_implementations)]

pub mod camera;
pub mod dit;
pub mod dmd;
pub mod error;
pub mod import;
pub mod kv;
pub mod vae;
pub mod weights;

pub use dit::{DitConfig, WanTransformer};
pub use error::{ModelError, Result};
pub use vae::{OutputFormat, StreamingDecodeState, StreamingDecoder, VaeConfig, WanVae};
pub use weights::WeightStore;
