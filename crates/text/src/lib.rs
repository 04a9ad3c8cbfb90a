//! Wan text conditioning without Python: the T5 tokenizer (`tokenizers` crate, no
//! network), the pipelines' prompt cleaning, the UMT5 encoder on headroom's tensor
//! runtime, and a `TextEncoder` that turns prompts into the `[512, d_model]` embeddings
//! the Wan pipelines feed the transformer, with resident or on-demand weights and an LRU
//! embedding cache.
//!
//! The trade-off: on-demand weights free the encoder's memory between prompts at the
//! price of loading it for the next one; the embedding cache makes a repeated prompt
//! free.
#![warn(missing_docs, missing_debug_implementations)]

pub mod cache;
pub mod clean;
pub mod config;
pub mod encoder;
pub mod error;
pub mod tokenizer;
pub mod umt5;
pub mod wan_t5;

pub use cache::{CacheStats, EmbeddingCache};
pub use clean::prompt_clean;
pub use config::{Activation, Umt5Config};
pub use encoder::{TextEncoder, TextEncoderMode, TextEncoderReport};
pub use error::{Result, TextError};
pub use tokenizer::{TextTokenizer, TokenizedPrompt, MAX_LENGTH};
pub use umt5::{relative_position_bucket, Umt5Encoder};
