//! The engine's errors as Python exceptions, by kind, never by message:
//!
//! - a request field that breaks a rule: [`RequestError`], a `ValueError` whose `field`
//!   names the field;
//! - out of memory, or a session refused for want of room: [`OutOfMemoryError`], a
//!   `MemoryError` with `planned_bytes` (what was asked for) and `free_bytes` (what was
//!   free for it) where the refusal weighed bytes, and `kind`;
//! - a file that is not there: `FileNotFoundError`; a checkpoint or snapshot that cannot
//!   be read or does not fit this engine: [`CheckpointError`], with `kind`;
//! - a chunk stopped by its cancel token: [`Cancelled`];
//! - anything else the engine says: [`EngineError`], a `RuntimeError`.

use headroom_engine::error::EngineError as Error;
use headroom_engine::AdmissionKind;
use headroom_mem::MemError;
use headroom_model::ModelError;
use headroom_tensor::TensorError;
use pyo3::exceptions::{PyFileNotFoundError, PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::PyErr;

pyo3::create_exception!(
    headroom,
    RequestError,
    PyValueError,
    "A request field breaks a rule; `field` names it."
);
pyo3::create_exception!(
    headroom,
    OutOfMemoryError,
    PyMemoryError,
    "Out of memory, or a session refused for want of room: `planned_bytes`, `free_bytes`, `kind`."
);
pyo3::create_exception!(
    headroom,
    CheckpointError,
    PyRuntimeError,
    "A checkpoint or session snapshot cannot be read, or does not fit this engine; `kind` says why."
);
pyo3::create_exception!(
    headroom,
    Cancelled,
    PyRuntimeError,
    "A chunk was stopped at a safe point by its cancel token; the session is over."
);
pyo3::create_exception!(
    headroom,
    EngineError,
    PyRuntimeError,
    "The engine failed (not the request, not the memory, not a file)."
);

/// A `RequestError` for `field` with `message`.
pub fn request(py: Python<'_>, field: &str, message: impl std::fmt::Display) -> PyErr {
    let err = RequestError::new_err(format!("{field}: {message}"));
    let _ = err.value(py).setattr("field", field);
    err
}

/// The allocator's refusal inside `e`, in whichever layer it surfaced.
fn mem_error(e: &Error) -> Option<&MemError> {
    fn from_tensor(t: &TensorError) -> Option<&MemError> {
        match t {
            TensorError::Mem(m) => Some(m),
            _ => None,
        }
    }
    match e {
        Error::Rank { cause: Some(c), .. } => mem_error(c),
        Error::Mem(m) => Some(m),
        Error::Tensor(t) => from_tensor(t),
        Error::Model(ModelError::Tensor(t)) => from_tensor(t),
        _ => None,
    }
}

/// The exception for `e`.
pub fn to_py(e: Error) -> PyErr {
    Python::attach(|py| convert(py, e))
}

fn memory(py: Python<'_>, message: String, bytes: Option<(u64, u64)>, kind: &str) -> PyErr {
    let err = OutOfMemoryError::new_err(message);
    let value = err.value(py);
    let (planned, free) = match bytes {
        Some((p, f)) => (Some(p), Some(f)),
        None => (None, None),
    };
    let _ = value.setattr("planned_bytes", planned);
    let _ = value.setattr("free_bytes", free);
    let _ = value.setattr("kind", kind);
    err
}

fn convert(py: Python<'_>, e: Error) -> PyErr {
    let message = e.to_string();
    if let Some(kind) = e.admission_kind() {
        let kind = match kind {
            AdmissionKind::KvPages => "kv_pages",
            AdmissionKind::Memory => "memory",
            AdmissionKind::PlannedPeak => "planned_peak",
        };
        return memory(py, message, e.admission_bytes_of(), kind);
    }
    if e.is_out_of_memory() {
        let bytes = match mem_error(&e) {
            Some(MemError::OutOfMemory {
                requested, free, ..
            }) => Some((*requested, *free)),
            _ => None,
        };
        return memory(py, message, bytes, "out_of_memory");
    }
    if let Some(fault) = e.snapshot_fault() {
        let err = CheckpointError::new_err(message);
        let _ = err.value(py).setattr("kind", fault.name());
        return err;
    }
    match e {
        Error::Request { field, rule } => request(py, field, rule),
        Error::Model(ModelError::Io { path, reason }) => {
            if std::path::Path::new(&path).exists() {
                let err = CheckpointError::new_err(format!("{path}: {reason}"));
                let _ = err.value(py).setattr("kind", "io");
                err
            } else {
                PyFileNotFoundError::new_err((2, format!("{path}: {reason}"), path))
            }
        }
        Error::Model(ModelError::Input { op, reason }) => request(py, op, reason),
        Error::Model(model) => {
            let err = CheckpointError::new_err(model.to_string());
            let _ = err.value(py).setattr("kind", "model");
            err
        }
        Error::Cancelled { .. } => Cancelled::new_err(message),
        _ => EngineError::new_err(message),
    }
}

/// The exception for a memory-core error outside the engine (`replay`, `plan` sizes).
pub fn mem_to_py(e: MemError) -> PyErr {
    to_py(Error::Mem(e))
}

/// An extension trait: `.py()?` turns an engine result into a Python one.
pub trait IntoPy<T> {
    /// The result with its error as a Python exception.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

impl<T> IntoPy<T> for Result<T, MemError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(mem_to_py)
    }
}

impl<T> IntoPy<T> for Result<T, ModelError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(|e| to_py(Error::Model(e)))
    }
}

impl<T> IntoPy<T> for Result<T, TensorError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(|e| to_py(Error::Tensor(e)))
    }
}
