//! The one error type of the text crate.

use headroom_model::ModelError;
use headroom_tensor::TensorError;

/// Errors of tokenisation, text-encoder loading and encoding.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A config value breaks a rule; the message names the field and the rule. Fix the
    /// config file (or the option) it names.
    #[error("config: {field}: {rule}")]
    Config {
        /// The config field.
        field: String,
        /// The rule it breaks.
        rule: String,
    },
    /// A file or folder could not be read or parsed. Check that the path holds a
    /// transformers text encoder (`text_encoder/`) and tokenizer (`tokenizer/`).
    #[error("{path}: {reason}")]
    Io {
        /// The path.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The tokenizer refused a prompt or could not be built.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// An input breaks a contract; the message names the input and the rule.
    #[error("{op}: {reason}")]
    Input {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Loading weights failed (a missing or mis-shaped tensor, a bad file).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A tensor op failed (shapes, dtypes, out of memory).
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

impl TextError {
    /// Whether the allocator ran out of device memory.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            TextError::Model(m) => m.is_out_of_memory(),
            TextError::Tensor(t) => t.is_out_of_memory(),
            _ => false,
        }
    }

    /// A config error for `field`.
    pub fn config(field: impl Into<String>, rule: impl Into<String>) -> Self {
        TextError::Config {
            field: field.into(),
            rule: rule.into(),
        }
    }

    /// An input error for `op`.
    pub fn input(op: &'static str, reason: impl Into<String>) -> Self {
        TextError::Input {
            op,
            reason: reason.into(),
        }
    }

    /// An I/O error for `path`.
    pub fn io(path: &std::path::Path, reason: impl std::fmt::Display) -> Self {
        TextError::Io {
            path: path.display().to_string(),
            reason: reason.to_string(),
        }
    }
}

/// Result alias of the text crate.
pub type Result<T> = std::result::Result<T, TextError>;
