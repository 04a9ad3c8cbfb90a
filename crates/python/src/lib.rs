//! headroom from Python: the `headroom._headroom` extension module under the `headroom`
//! package. A thin layer, adding no logic of its own: the engine of `headroom generate`
//! (`engine::Engine`, `session::Session`), PyTorch's memory names, the planner of
//! `headroom plan` and the replay of `headroom mem replay` (`tools`). Compute runs with
//! the GIL released; the Gymnasium environment is plain Python in the package.
#![warn(missing_docs, missing_debug_implementations)]

mod engine;
mod errors;
mod inputs;
mod interrupt;
mod session;
mod tools;

use pyo3::prelude::*;
use pyo3::types::PyList;

/// Runs the next chunk of each session as one batched round (`headroom_engine::scheduler`):
/// each session's chunk is the bytes it makes alone; `None` for a session that had
/// finished; a failure raises with the others' chunks in its `chunks`.
#[pyfunction]
fn next_chunks(py: Python<'_>, sessions: Vec<Bound<'_, session::Session>>) -> PyResult<Py<PyList>> {
    session::next_chunks(py, &sessions)
}

/// Kernel threads of the process's pool (fixed once the first kernel ran).
#[pyfunction]
fn threads() -> usize {
    headroom_tensor::parallel::pool().current_num_threads()
}

/// The module.
#[pymodule]
fn _headroom(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<engine::Engine>()?;
    m.add_class::<session::Session>()?;
    m.add_class::<session::Chunk>()?;
    m.add_class::<session::SessionState>()?;
    m.add_class::<inputs::FrameBuffer>()?;
    m.add_function(wrap_pyfunction!(tools::plan, m)?)?;
    m.add_function(wrap_pyfunction!(tools::replay, m)?)?;
    m.add_function(wrap_pyfunction!(tools::write_video, m)?)?;
    m.add_function(wrap_pyfunction!(next_chunks, m)?)?;
    m.add_function(wrap_pyfunction!(threads, m)?)?;
    m.add("RequestError", py.get_type::<errors::RequestError>())?;
    m.add(
        "OutOfMemoryError",
        py.get_type::<errors::OutOfMemoryError>(),
    )?;
    m.add("CheckpointError", py.get_type::<errors::CheckpointError>())?;
    m.add("Cancelled", py.get_type::<errors::Cancelled>())?;
    m.add("EngineError", py.get_type::<errors::EngineError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
