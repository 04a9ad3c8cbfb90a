//! The one error type of the model crate.

use headroom_tensor::TensorError;

/// Errors of model loading and execution.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A config value breaks a rule; the message names the field and the rule.
    #[error("config: {field}: {rule}")]
    Config {
        /// The config field.
        field: String,
        /// The rule it breaks.
        rule: String,
    },
    /// A checkpoint lacks a tensor the network needs.
    #[error("weights: missing tensor {key:?} (expected shape {expected:?}){hint}")]
    MissingWeight {
        /// The diffusers key.
        key: String,
        /// The shape the network expects.
        expected: Vec<usize>,
        /// The layout assumed and the first tensors the checkpoint has that were not
        /// used (empty when there is nothing to add).
        hint: String,
    },
    /// A checkpoint tensor has the wrong shape.
    #[error("weights: tensor {key:?} has shape {found:?}, the network expects {expected:?}")]
    WeightShape {
        /// The diffusers key.
        key: String,
        /// The shape the network expects.
        expected: Vec<usize>,
        /// The shape in the checkpoint.
        found: Vec<usize>,
    },
    /// A file or folder could not be read.
    #[error("{path}: {reason}")]
    Io {
        /// The path.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// An input breaks a contract of the op; the message names the input and the rule.
    #[error("{op}: {reason}")]
    Input {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// An 8-bit checkpoint tensor in a layout headroom does not read; names the tensor
    /// and what it reads instead.
    #[error("{key}: {rule}")]
    Quantization {
        /// The tensor (our key).
        key: String,
        /// The rule it breaks.
        rule: String,
    },
    /// A tensor op failed (shapes, dtypes, out of memory).
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

impl ModelError {
    /// Whether the allocator ran out of device memory.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, ModelError::Tensor(t) if t.is_out_of_memory())
    }

    /// Whether a collective failed because another rank aborted the group.
    pub fn is_aborted(&self) -> bool {
        matches!(self, ModelError::Tensor(t) if t.is_aborted())
    }

    /// An input error for `op`.
    pub fn input(op: &'static str, reason: impl Into<String>) -> Self {
        ModelError::Input {
            op,
            reason: reason.into(),
        }
    }

    /// A config error for `field`.
    pub fn config(field: impl Into<String>, rule: impl Into<String>) -> Self {
        ModelError::Config {
            field: field.into(),
            rule: rule.into(),
        }
    }
}

/// Result alias of the model crate.
pub type Result<T> = std::result::Result<T, ModelError>;
