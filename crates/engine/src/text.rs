//! Prompts for an engine: the text encoder of a pipeline folder (`text_encoder/` +
//! `tokenizer/`, or a Wan repo's T5 `.pth` + `google/umt5-xxl/`, picked up automatically), or a seeded built-in one for the `tiny` and
//! `small` presets, created at the first prompt so sessions without prompts never pay
//! for it. Engines without either refuse non-empty prompts, naming the missing folder.

use std::path::Path;
use std::sync::{Arc, Mutex};

use headroom_tensor::{DType, Device, Tensor};
use headroom_text::{TextEncoder, TextEncoderMode, TextEncoderReport};

use crate::error::{EngineError, Result};

/// How the built-in encoder is made once a prompt needs it.
#[derive(Debug, Clone)]
struct Builtin {
    d_model: usize,
    seed: u64,
    device: Device,
    dtype: DType,
    mode: TextEncoderMode,
    cache_bytes: u64,
}

/// The text encoder an engine and its sessions share.
#[derive(Debug)]
pub(crate) struct Prompts {
    /// The model folder or preset name (for the error when there is no encoder).
    model: String,
    builtin: Option<Builtin>,
    encoder: Mutex<Option<Arc<TextEncoder>>>,
}

/// Presets whose DiT `text_dim` the built-in seeded text encoder is built for.
const BUILTIN_PRESETS: [&str; 2] = ["tiny", "small"];

impl Prompts {
    /// The prompts of engine model `model` whose transformer takes `text_dim`-wide text.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        model: &str,
        text_dim: usize,
        seed: u64,
        device: &Device,
        dtype: DType,
        mode: TextEncoderMode,
        cache_bytes: u64,
    ) -> Result<Self> {
        let folder = Path::new(model);
        let mut encoder = None;
        let mut builtin = None;
        let wan_repo = headroom_text::wan_t5::wan_files(folder).is_some();
        if folder.join("text_encoder").is_dir() || wan_repo {
            let loaded = TextEncoder::load(folder, device, dtype, mode, cache_bytes)?;
            if loaded.d_model() != text_dim {
                return Err(EngineError::request(
                    "model",
                    format!(
                        "text encoder d_model {} differs from the transformer's text_dim {text_dim}",
                        loaded.d_model()
                    ),
                ));
            }
            encoder = Some(Arc::new(loaded));
        } else if BUILTIN_PRESETS.contains(&model) {
            builtin = Some(Builtin {
                d_model: text_dim,
                seed,
                device: device.clone(),
                dtype,
                mode,
                cache_bytes,
            });
        }
        Ok(Self {
            model: model.to_string(),
            builtin,
            encoder: Mutex::new(encoder),
        })
    }

    /// Whether a non-empty prompt can be encoded.
    pub(crate) fn available(&self) -> bool {
        self.builtin.is_some() || self.current().is_some()
    }

    fn current(&self) -> Option<Arc<TextEncoder>> {
        self.encoder
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn encoder(&self) -> Result<Arc<TextEncoder>> {
        let mut slot = self.encoder.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(encoder) = slot.as_ref() {
            return Ok(Arc::clone(encoder));
        }
        let Some(b) = &self.builtin else {
            return Err(EngineError::request(
                "prompt",
                format!(
                    "cannot encode a prompt: no text encoder: {}/text_encoder missing",
                    self.model
                ),
            ));
        };
        let encoder = Arc::new(TextEncoder::builtin(
            b.d_model,
            b.seed,
            &b.device,
            b.dtype,
            b.mode,
            b.cache_bytes,
        )?);
        *slot = Some(Arc::clone(&encoder));
        Ok(encoder)
    }

    /// The Wan embedding `[512, text_dim]` of `prompt`, or `None` for an empty prompt
    /// on an engine without a text encoder (the same as no text).
    pub(crate) fn encode(&self, prompt: &str) -> Result<Option<Tensor>> {
        if prompt.trim().is_empty() && !self.available() {
            return Ok(None);
        }
        let encoder = self.encoder()?;
        let platform = encoder.device().platform().clone();
        Ok(Some(encoder.encode_with(prompt, &|| {
            crate::phases::text_end(platform.as_ref())
        })?))
    }

    /// The text encoder's memory and cache report, once one exists.
    pub(crate) fn report(&self) -> Option<TextEncoderReport> {
        self.current().map(|e| e.report())
    }
}

/// Text embeddings `[L, text_dim]` zero-padded to the 512 tokens the Wan pipelines feed
/// (padding rows take part in cross-attention, so they change the output).
pub(crate) fn pad_text(
    text: Option<&Tensor>,
    text_dim: usize,
    device: &Device,
) -> Result<Option<Tensor>> {
    const TOKENS: usize = 512;
    let Some(text) = text else { return Ok(None) };
    let dim = text_dim;
    match *text.shape() {
        [l, d] if d == dim && (1..=TOKENS).contains(&l) => {
            if l == TOKENS {
                return Ok(Some(text.to_device(device)?));
            }
            let text = text.to_device(device)?.to_dtype(DType::F32)?;
            let pad = Tensor::zeros(&[TOKENS - l, dim], DType::F32, device)?;
            Ok(Some(Tensor::cat(&[&text, &pad], 0)?))
        }
        _ => Err(EngineError::request(
            "text_embeds",
            format!(
                "must be [L, {dim}] with 1 ≤ L ≤ {TOKENS}, got {:?}",
                text.shape()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompts(model: &str) -> Prompts {
        let device = Device::cpu().unwrap();
        Prompts::new(
            model,
            16,
            0,
            &device,
            DType::F32,
            TextEncoderMode::Resident,
            0,
        )
        .unwrap()
    }

    #[test]
    fn a_folder_without_text_encoder_refuses_prompts_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().display().to_string();
        let prompts = prompts(&model);
        assert!(!prompts.available());
        let err = prompts.encode("a cat").unwrap_err().to_string();
        assert!(
            err.contains("prompt") && err.contains(&format!("{model}/text_encoder missing")),
            "{err}"
        );
        // An empty prompt is no text at all.
        assert!(prompts.encode("  ").unwrap().is_none());
    }

    #[test]
    fn built_in_presets_encode_prompts_at_their_text_dim() {
        let prompts = prompts("tiny");
        assert!(prompts.report().is_none(), "created at the first prompt");
        let embeds = prompts.encode("a cat").unwrap().unwrap();
        assert_eq!(embeds.shape(), [512, 16]);
        assert!(prompts.report().unwrap().resident_weight_bytes > 0);
    }
}
