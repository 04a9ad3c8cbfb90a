//! Prompt tokenisation with the `tokenizers` crate from a `tokenizer/` folder, matching
//! what the Wan pipelines get from transformers 5.x: `tokenizer(prompt,
//! padding="max_length", max_length=L, truncation=True, add_special_tokens=True)`.
//!
//! transformers 5.x does not take a T5 tokenizer's `tokenizer.json` as written: when
//! `tokenizer_config.json` names `T5Tokenizer`, it keeps the Unigram vocabulary and the
//! added tokens and rebuilds the rest from the class (`tokenization_t5.py`): the
//! `Precompiled` normalizer alone (a `Replace` after it is dropped), the pre-tokenizer
//! `WhitespaceSplit` + `Metaspace(prepend_scheme="always", split=True)`, `<unk>` at id 2
//! without byte fallback, and a post-processor appending `</s>`. Wan's tokenizer.json
//! was written by transformers 4.x with another normalizer, pre-tokenizer and byte
//! fallback on, so the same rebuild happens here, on the JSON, before the `tokenizers`
//! crate reads it. Other tokenizer classes are taken as written, as transformers does.
//!
//! Truncation keeps the first `max_length − 1` pieces and the `</s>` (the
//! post-processor's token counts against the length); padding appends the pad id
//! (`<pad>`) up to `max_length` with attention mask 0.

use std::path::Path;

use serde_json::{json, Value};
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::error::{Result, TextError};

/// The Wan pipelines' sequence length.
pub const MAX_LENGTH: usize = 512;

/// A prompt as token ids, padded to the tokenizer's `max_length`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizedPrompt {
    /// Token ids, `max_length` of them: the real tokens, then padding.
    pub ids: Vec<u32>,
    /// Real tokens (those with attention mask 1): `1 ≤ n ≤ max_length`.
    pub n: usize,
}

impl TokenizedPrompt {
    /// The attention mask: 1 for the first `n` tokens, 0 for padding.
    pub fn mask(&self) -> Vec<bool> {
        (0..self.ids.len()).map(|i| i < self.n).collect()
    }
}

/// A tokenizer loaded from `tokenizer.json` (+ `tokenizer_config.json`), truncating and
/// padding to a fixed length.
#[derive(Debug, Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    max_length: usize,
    pad_id: u32,
}

fn tok_err(e: impl std::fmt::Display) -> TextError {
    TextError::Tokenizer(e.to_string())
}

/// The `Precompiled` normalizer inside a tokenizer.json `normalizer` entry, if any.
fn precompiled_normalizer(normalizer: &Value) -> Option<Value> {
    match normalizer.get("type").and_then(Value::as_str) {
        Some("Precompiled") => Some(normalizer.clone()),
        Some("Sequence") => normalizer
            .get("normalizers")
            .and_then(Value::as_array)?
            .iter()
            .find_map(precompiled_normalizer),
        _ => None,
    }
}

/// Rewrites a T5 tokenizer.json the way transformers 5.x's `T5Tokenizer` rebuilds it
/// (see the module doc).
fn rebuild_t5(json: &mut Value, eos: &str) -> Result<()> {
    let model = json
        .get_mut("model")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| TextError::config("tokenizer.json: model", "missing"))?;
    if model.get("type").and_then(Value::as_str) != Some("Unigram") {
        return Err(TextError::config(
            "tokenizer.json: model.type",
            "a T5Tokenizer needs a Unigram model",
        ));
    }
    model.insert("unk_id".into(), json!(2));
    model.insert("byte_fallback".into(), json!(false));
    let normalizer = json
        .get("normalizer")
        .and_then(precompiled_normalizer)
        .unwrap_or(Value::Null);
    json["normalizer"] = normalizer;
    json["pre_tokenizer"] = json!({
        "type": "Sequence",
        "pretokenizers": [
            {"type": "WhitespaceSplit"},
            {"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "always", "split": true}
        ]
    });
    let eos_id = json
        .get("added_tokens")
        .and_then(Value::as_array)
        .and_then(|tokens| {
            tokens
                .iter()
                .find(|t| t.get("content").and_then(Value::as_str) == Some(eos))
        })
        .and_then(|t| t.get("id"))
        .cloned()
        .or_else(|| {
            // Not an added token: its index in the Unigram vocabulary.
            json["model"]["vocab"].as_array().and_then(|v| {
                v.iter()
                    .position(|p| p.get(0).and_then(Value::as_str) == Some(eos))
                    .map(|i| json!(i))
            })
        })
        .ok_or_else(|| {
            TextError::config(
                "tokenizer.json",
                format!("the end-of-sequence token {eos:?} is not in the vocabulary"),
            )
        })?;
    json["post_processor"] = json!({
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": eos, "type_id": 0}}],
        "pair": [
            {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": eos, "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 0}}, {"SpecialToken": {"id": eos, "type_id": 0}}
        ],
        "special_tokens": {eos: {"id": eos, "ids": [eos_id], "tokens": [eos]}}
    });
    json["truncation"] = Value::Null;
    json["padding"] = Value::Null;
    Ok(())
}

impl TextTokenizer {
    /// Loads `dir/tokenizer.json` (and `dir/tokenizer_config.json` when present),
    /// truncating and padding to `max_length`.
    pub fn from_dir(dir: &Path, max_length: usize) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let tokenizer = std::fs::read_to_string(&path).map_err(|e| TextError::io(&path, e))?;
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.exists() {
            Some(
                std::fs::read_to_string(&config_path)
                    .map_err(|e| TextError::io(&config_path, e))?,
            )
        } else {
            None
        };
        Self::from_json(&tokenizer, config.as_deref(), max_length)
            .map_err(|e| TextError::io(&path, e))
    }

    /// A tokenizer from the text of `tokenizer.json` and, optionally,
    /// `tokenizer_config.json`, truncating and padding to `max_length`.
    pub fn from_json(tokenizer: &str, config: Option<&str>, max_length: usize) -> Result<Self> {
        if max_length < 2 {
            return Err(TextError::config(
                "max_length",
                format!("must be at least 2 (a token and </s>), got {max_length}"),
            ));
        }
        let mut json: Value = serde_json::from_str(tokenizer)
            .map_err(|e| TextError::config("tokenizer.json", format!("not valid JSON: {e}")))?;
        let config: Value = match config {
            Some(text) => serde_json::from_str(text).map_err(|e| {
                TextError::config("tokenizer_config.json", format!("not valid JSON: {e}"))
            })?,
            None => Value::Null,
        };
        let class = config
            .get("tokenizer_class")
            .and_then(Value::as_str)
            .unwrap_or("");
        let token_name = |key: &str, default: &str| -> String {
            match config.get(key) {
                Some(Value::String(s)) => s.clone(),
                // An AddedToken serialised as an object.
                Some(Value::Object(o)) => o
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or(default)
                    .to_string(),
                _ => default.to_string(),
            }
        };
        let eos = token_name("eos_token", "</s>");
        let pad = token_name("pad_token", "<pad>");
        if matches!(class, "T5Tokenizer" | "T5TokenizerFast") {
            rebuild_t5(&mut json, &eos)?;
        }
        let text = serde_json::to_string(&json)
            .map_err(|e| TextError::config("tokenizer.json", e.to_string()))?;
        let mut inner: Tokenizer = text.parse().map_err(tok_err)?;
        inner
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(tok_err)?;
        inner.with_padding(None);
        let pad_id = inner.token_to_id(&pad).ok_or_else(|| {
            TextError::config(
                "pad_token",
                format!("{pad:?} is not in the tokenizer's vocabulary"),
            )
        })?;
        Ok(Self {
            inner,
            max_length,
            pad_id,
        })
    }

    /// The same tokenizer truncating and padding to `max_length` instead.
    pub fn with_max_length(mut self, max_length: usize) -> Result<Self> {
        if max_length < 2 {
            return Err(TextError::config(
                "max_length",
                format!("must be at least 2 (a token and </s>), got {max_length}"),
            ));
        }
        self.inner
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(tok_err)?;
        self.max_length = max_length;
        Ok(self)
    }

    /// The length every prompt is truncated and padded to.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// Tokens in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Tokenises an already-cleaned prompt: the pieces, `</s>`, truncated to
    /// `max_length`, padded with `<pad>`.
    pub fn tokenize(&self, cleaned: &str) -> Result<TokenizedPrompt> {
        let encoding = self.inner.encode(cleaned, true).map_err(tok_err)?;
        let mut ids = encoding.get_ids().to_vec();
        if ids.is_empty() || ids.len() > self.max_length {
            return Err(TextError::Tokenizer(format!(
                "{} tokens for max_length {} (the tokenizer's post-processor must add </s>)",
                ids.len(),
                self.max_length
            )));
        }
        let n = ids.len();
        ids.resize(self.max_length, self.pad_id);
        Ok(TokenizedPrompt { ids, n })
    }
}
