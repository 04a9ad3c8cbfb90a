//! The one error type of the tensor runtime; each variant names the op and what was
//! wrong with which shape or dtype.

use crate::dtype::DType;

/// Errors of tensor operations.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    /// Shapes do not fit the op; `reason` names the shapes and the rule.
    #[error("{op}: {reason}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// The shapes involved and the rule they break.
        reason: String,
    },
    /// A dtype the op does not take.
    #[error("{op}: dtype {got} is not supported here ({expected})")]
    DType {
        /// The operation.
        op: &'static str,
        /// What the op takes.
        expected: &'static str,
        /// What it was given.
        got: DType,
    },
    /// Tensors live on different devices.
    #[error("{op}: operands live on different devices")]
    Device {
        /// The operation.
        op: &'static str,
    },
    /// The op has no kernel for this device or format.
    #[error("{op}: {reason}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// What it does not take, and what it takes instead.
        reason: String,
    },
    /// The allocator could not provide memory (out of memory and friends).
    #[error(transparent)]
    Mem(#[from] headroom_mem::MemError),
    /// The GPU path failed: a launch the kernels do not take, or a driver error.
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
    /// A file could not be read or written.
    #[error("{path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// Reading element values from a meta (shape-only) tensor.
    #[error("{op}: the tensor lives on a meta platform and holds no values")]
    Meta {
        /// The operation.
        op: &'static str,
    },
    /// A collective could not complete: another rank of the group failed.
    #[error("{op}: the rank group was aborted (another rank failed)")]
    Aborted {
        /// The collective.
        op: &'static str,
    },
    /// A collective backend (MPI, NCCL) failed or could not be set up; the job cannot
    /// go on with this group.
    #[error("{backend} {op}: {reason}")]
    Comm {
        /// The backend (`mpi`, `nccl`, `threads`).
        backend: &'static str,
        /// The collective or setup step.
        op: &'static str,
        /// What went wrong.
        reason: String,
    },
}

impl TensorError {
    /// Whether the allocator ran out of device memory.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, TensorError::Mem(m) if m.is_out_of_memory())
    }

    /// Whether a collective failed because another rank aborted the group.
    pub fn is_aborted(&self) -> bool {
        matches!(self, TensorError::Aborted { .. })
    }

    /// A shape error for `op`.
    pub fn shape(op: &'static str, reason: impl Into<String>) -> Self {
        TensorError::Shape {
            op,
            reason: reason.into(),
        }
    }
}

/// Result alias of the tensor runtime.
pub type Result<T> = std::result::Result<T, TensorError>;
