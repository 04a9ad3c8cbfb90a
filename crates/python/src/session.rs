//! `headroom.Session`: an iterable of chunks, steered between them; each chunk computed
//! by [`run_interruptible`] (the GIL released, Ctrl-C stopping it at its next safe point).

use std::sync::{Arc, Mutex};

use headroom_engine::{CancelToken, Chunk as InnerChunk, EngineError, Session as Inner};
use headroom_engine::{SessionSnapshot, BLOCK_FRAMES};
use headroom_model::camera::{CameraUpdate, UpdateMode};
use pyo3::exceptions::{PyRuntimeError, PyStopIteration, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::{request, IntoPy};
use crate::interrupt::run_interruptible;

/// One chunk of video: `frames` (numpy `uint8 [T, H, W, 3]`, read-only), `index`,
/// `timings` (seconds) and `memory` (allocator statistics after its decode).
#[derive(Debug)]
#[pyclass(module = "headroom._headroom", frozen)]
pub struct Chunk {
    /// Chunk index from 0.
    #[pyo3(get)]
    index: usize,
    /// Frames, `uint8 [T, H, W, 3]`.
    #[pyo3(get)]
    frames: Py<PyAny>,
    /// Seconds: `total`, `denoise`, `commit`, `decode`.
    #[pyo3(get)]
    timings: Py<PyAny>,
    /// `memory_stats()` after the chunk's decode.
    #[pyo3(get)]
    memory: Py<PyAny>,
}

#[pymethods]
impl Chunk {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let shape = self.frames.bind(py).getattr("shape")?.repr()?.to_string();
        Ok(format!(
            "headroom.Chunk(index={}, frames={shape})",
            self.index
        ))
    }
}

impl Chunk {
    /// The Python chunk of `chunk`, which took `total` seconds.
    pub fn new(py: Python<'_>, chunk: InnerChunk, total: f64) -> PyResult<Self> {
        let timings = PyDict::new(py);
        timings.set_item("total", total)?;
        timings.set_item("denoise", chunk.timings.denoise.as_secs_f64())?;
        timings.set_item("commit", chunk.timings.commit.as_secs_f64())?;
        timings.set_item("decode", chunk.timings.decode.as_secs_f64())?;
        let memory = PyDict::new(py);
        for (key, value) in chunk.stats_decoded.to_map() {
            memory.set_item(key, value)?;
        }
        Ok(Self {
            index: chunk.index,
            frames: crate::inputs::frames_array(py, chunk.frames)?,
            timings: timings.into_any().unbind(),
            memory: memory.into_any().unbind(),
        })
    }
}

/// A session's state at a chunk boundary, in host memory (`Session.snapshot()`):
/// `Engine.resume(state)` goes on from it, as often as wanted.
#[derive(Debug)]
#[pyclass(module = "headroom._headroom", frozen)]
pub struct SessionState {
    pub(crate) snapshot: Arc<SessionSnapshot>,
}

#[pymethods]
impl SessionState {
    /// Chunks the session had made.
    #[getter]
    fn chunks_done(&self) -> usize {
        self.snapshot.progress.chunks_done
    }

    /// Bytes of state it holds.
    #[getter]
    fn state_bytes(&self) -> u64 {
        self.snapshot.state_bytes()
    }

    /// Writes it as a `.hrsnap` file (what `generate --resume` and `Engine.resume` read).
    fn save(&self, path: std::path::PathBuf) -> PyResult<u64> {
        self.snapshot.write(&path).py_err()
    }
}

/// A streaming session: iterate it for chunks; steer it between them.
#[derive(Debug)]
#[pyclass(module = "headroom._headroom", frozen)]
pub struct Session {
    /// The `headroom.Engine` it runs on, kept alive as long as its session.
    engine: Py<PyAny>,
    inner: Mutex<Option<Inner>>,
    id: String,
}

impl Session {
    /// Wraps an open session of `engine`.
    pub fn new(engine: Py<PyAny>, session: Inner) -> Self {
        Self {
            engine,
            id: session.id().to_string(),
            inner: Mutex::new(Some(session)),
        }
    }

    /// Runs `f` on the open session (a closed one is refused, naming it).
    fn with<T>(&self, py: Python<'_>, f: impl FnOnce(&mut Inner) -> PyResult<T>) -> PyResult<T> {
        let mut guard = self.lock()?;
        match guard.as_mut() {
            Some(session) => f(session),
            None => Err(request(py, "session", format!("{} is closed", self.id))),
        }
    }

    /// The session, unless another thread is computing its chunk (waiting for it with
    /// the GIL held would keep that thread from finishing).
    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, Option<Inner>>> {
        self.inner.try_lock().map_err(|e| match e {
            std::sync::TryLockError::WouldBlock => PyRuntimeError::new_err(format!(
                "session {} is computing a chunk on another thread; call it between chunks",
                self.id
            )),
            std::sync::TryLockError::Poisoned(_) => {
                PyRuntimeError::new_err("the session's lock was poisoned (a chunk panicked)")
            }
        })
    }
}

/// Runs the next chunk of every session in `sessions` as one batched round
/// (`scheduler::next_chunks`), with the GIL released: a chunk per session, `None` for
/// one that had finished. A session that failed raises its error (the first), whose
/// `chunks` holds the others' chunks (`None` where a session failed or had finished).
pub fn next_chunks(py: Python<'_>, sessions: &[Bound<'_, Session>]) -> PyResult<Py<PyList>> {
    let mut guards = Vec::with_capacity(sessions.len());
    for s in sessions {
        guards.push(s.get().lock()?);
    }
    let token = CancelToken::new();
    let mut open = Vec::with_capacity(guards.len());
    for (guard, s) in guards.iter_mut().zip(sessions) {
        match guard.as_mut() {
            Some(session) => {
                session.set_cancel(token.clone());
                open.push(session);
            }
            None => return Err(request(py, "sessions", format!("{} is closed", s.get().id))),
        }
    }
    let start = std::time::Instant::now();
    let results = run_interruptible(py, Some(&token), move || {
        headroom_engine::scheduler::next_chunks(&mut open)
    });
    let results = match results {
        Ok(results) => results,
        Err(interrupt) => {
            // A session whose chunk passed its last safe point before the signal came
            // finished it anyway: every session of the round ends, as a stopped one does.
            let ended: Vec<Option<Inner>> = guards.iter_mut().map(|g| g.take()).collect();
            py.detach(move || drop(ended));
            return Err(interrupt);
        }
    };
    let total = start.elapsed().as_secs_f64();
    let out = PyList::empty(py);
    let mut failed = None;
    for result in results {
        match result {
            Ok(chunk) => out.append(Chunk::new(py, chunk, total)?)?,
            Err(EngineError::Finished(_)) => out.append(py.None())?,
            Err(e) => {
                out.append(py.None())?;
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failed {
        // The other sessions' chunks are made: they travel with the error.
        let err = crate::errors::to_py(e);
        err.value(py).setattr("chunks", &out)?;
        return Err(err);
    }
    Ok(out.unbind())
}

#[pymethods]
impl Session {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next chunk: 9 frames first, then 12; `StopIteration` after the last.
    fn __next__(&self, py: Python<'_>) -> PyResult<Chunk> {
        let mut guard = self.lock()?;
        let Some(session) = guard.as_mut() else {
            return Err(PyStopIteration::new_err(()));
        };
        let token = CancelToken::new();
        session.set_cancel(token.clone());
        let start = std::time::Instant::now();
        let result = match run_interruptible(py, Some(&token), || session.next_chunk()) {
            Ok(result) => result,
            Err(interrupt) => {
                // A chunk that passed its last safe point before the signal came finished
                // anyway: the session ends all the same, as under the CLI.
                let ended = guard.take();
                py.detach(move || drop(ended));
                return Err(interrupt);
            }
        };
        let total = start.elapsed().as_secs_f64();
        match result {
            Ok(chunk) => Chunk::new(py, chunk, total),
            Err(EngineError::Finished(_)) => Err(PyStopIteration::new_err(())),
            Err(e) => Err(crate::errors::to_py(e)),
        }
    }

    /// Steers the camera from the next chunk on: `keys` held (`"wd"`: forward and right;
    /// `""`: stand still), or `camera={"mode": "velocity"|"target", "translation":
    /// [x, y, z], "rotation": [x, y, z, w], "transition_chunks": n}` as the server's
    /// `session.interaction`. `frame` starts it at that video frame of the next chunk.
    #[pyo3(signature = (keys=None, camera=None, frame=0))]
    fn interact(
        &self,
        py: Python<'_>,
        keys: Option<&Bound<'_, PyAny>>,
        camera: Option<&Bound<'_, PyDict>>,
        frame: usize,
    ) -> PyResult<()> {
        let update = match (keys, camera) {
            (Some(keys), None) => CameraUpdate::from_keys(crate::inputs::keys(py, keys)?),
            (None, Some(camera)) => camera_update(py, camera)?,
            _ => {
                return Err(PyTypeError::new_err(
                    "interact: give keys=… or camera=…, one of them",
                ))
            }
        };
        self.with(py, |s| s.interact_at(update, frame).py_err())
    }

    /// Changes the prompt from the next chunk on (encoded now: errors surface here).
    fn set_prompt(&self, py: Python<'_>, prompt: &str) -> PyResult<()> {
        self.with(py, |s| py.detach(|| s.set_prompt(prompt)).py_err())
    }

    /// The session's state at this chunk boundary, in host memory.
    fn snapshot(&self, py: Python<'_>) -> PyResult<SessionState> {
        self.with(py, |s| {
            let snapshot = py.detach(|| s.snapshot()).py_err()?;
            Ok(SessionState {
                snapshot: Arc::new(snapshot),
            })
        })
    }

    /// Ends the session: its KV pages, decoder state and conditioning go back now.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let session = self.lock()?.take();
        py.detach(move || drop(session));
        Ok(())
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    /// The session's id.
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// Chunks made so far.
    #[getter]
    fn chunks_done(&self) -> PyResult<usize> {
        Ok(self.lock()?.as_ref().map_or(0, Inner::chunks_done))
    }

    /// Chunks the session makes in all (`None`: it streams until closed).
    #[getter]
    fn chunks_total(&self) -> PyResult<Option<usize>> {
        Ok(self.lock()?.as_ref().and_then(Inner::chunks_total))
    }

    /// Whether it is closed (or ended by an error or a cancel).
    #[getter]
    fn closed(&self) -> PyResult<bool> {
        Ok(self.lock()?.is_none())
    }

    /// The engine it runs on.
    #[getter]
    fn engine(&self, py: Python<'_>) -> Py<PyAny> {
        self.engine.clone_ref(py)
    }

    /// Latent frames a chunk holds (its actions hold over all of them).
    #[classattr]
    fn block_frames() -> usize {
        BLOCK_FRAMES
    }

    fn __repr__(&self) -> PyResult<String> {
        let guard = self.lock()?;
        Ok(match guard.as_ref() {
            Some(s) => format!(
                "headroom.Session(id={:?}, chunks={}/{})",
                self.id,
                s.chunks_done(),
                s.chunks_total().map_or("∞".to_string(), |n| n.to_string())
            ),
            None => format!("headroom.Session(id={:?}, closed)", self.id),
        })
    }
}

/// A camera update from the server's fields.
fn camera_update(py: Python<'_>, camera: &Bound<'_, PyDict>) -> PyResult<CameraUpdate> {
    let mode = match camera.get_item("mode")? {
        None => UpdateMode::Target,
        Some(m) => match m.extract::<String>()?.as_str() {
            "target" => UpdateMode::Target,
            "velocity" => UpdateMode::Velocity,
            other => {
                return Err(request(
                    py,
                    "camera.mode",
                    format!("must be \"target\" or \"velocity\", got {other:?}"),
                ))
            }
        },
    };
    let get = |key: &str| camera.get_item(key);
    let translation: [f64; 3] = match get("translation")? {
        Some(v) => v.extract()?,
        None => [0.0; 3],
    };
    let rotation: [f64; 4] = match get("rotation")? {
        Some(v) => v.extract()?,
        None => [0.0, 0.0, 0.0, 1.0],
    };
    let transition_chunks: f64 = match get("transition_chunks")? {
        Some(v) => v.extract()?,
        None => 0.0,
    };
    CameraUpdate {
        mode,
        translation,
        rotation,
        transition_chunks,
    }
    .validated()
    .map_err(|e| request(py, "camera", e))
}
