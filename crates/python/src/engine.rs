//! `headroom.Engine`: the engine of `headroom generate`, configured by the same names
//! and values as its flags, and its memory in PyTorch's words.

use std::path::Path;
use std::sync::Arc;

use headroom_engine::{Engine as Inner, EngineConfig, Placement, SessionRequest};
use headroom_mem::{parse_size, AllocatorConfig, AllocatorPolicy, ReclaimPolicy};
use headroom_model::{DecoderKind, WeightFormat};
use headroom_tensor::{DType, Device};
use numpy::PyArrayMethods;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{request, IntoPy};
use crate::interrupt::run_interruptible;
use crate::session::{Session, SessionState};

/// Video size when neither the call nor the model gives one (the CLI's default).
const DEFAULT_SIZE: (usize, usize) = (416, 240);

/// Frames of a session when `frames` is absent: 3 chunks (9 + 12 + 12), as the CLI.
const DEFAULT_FRAMES: usize = 33;

/// A loaded model serving sessions one after another (or stepped together).
#[derive(Debug)]
#[pyclass(module = "headroom._headroom", frozen)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
    /// `model` as given.
    name: String,
    /// `device` as given.
    device_name: String,
}

/// A value given as a size in bytes: an int, or a string such as `"64MiB"`.
fn size_arg(py: Python<'_>, field: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(bytes) = value.extract::<u64>() {
        return Ok(bytes);
    }
    let text: String = value
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("{field}: give bytes (int) or a size (str)")))?;
    parse_size(&text).map_err(|e| request(py, field, e))
}

/// Parses `value` of `field` with `FromStr`, naming the field on failure.
fn parsed<T: std::str::FromStr>(py: Python<'_>, field: &str, value: &str) -> PyResult<T>
where
    T::Err: std::fmt::Display,
{
    value.parse().map_err(|e| request(py, field, e))
}

/// Refuses a path that is not there as `FileNotFoundError`, before any weights load.
fn existing(path: &str) -> PyResult<()> {
    if Path::new(path).exists() {
        return Ok(());
    }
    Err(pyo3::exceptions::PyFileNotFoundError::new_err((
        2,
        format!("{path}: no such file or folder"),
        path.to_string(),
    )))
}

impl Engine {
    /// The device the engine runs on: `cpu` (its own host platform, `None`), `cuda[:N]`
    /// (a build with the `cuda` feature) or `cuda-check`.
    fn device(py: Python<'_>, name: &str, config: &EngineConfig) -> PyResult<Option<Device>> {
        match name {
            "cpu" => Ok(None),
            "cuda-check" => Device::checked_gpu(
                config.capacity.unwrap_or(80 << 30),
                config.allocator.clone(),
                config.reclaim,
            )
            .map(Some)
            .py_err(),
            other => {
                let ordinal = match other.strip_prefix("cuda") {
                    Some("") => 0,
                    Some(rest) => match rest.strip_prefix(':').map(str::parse::<usize>) {
                        Some(Ok(n)) => n,
                        _ => return Err(request(py, "device", format!("invalid {other:?}"))),
                    },
                    None => {
                        return Err(request(
                            py,
                            "device",
                            format!("must be cpu, cuda, cuda:N or cuda-check, got {other:?}"),
                        ))
                    }
                };
                cuda_device(py, ordinal, config).map(Some)
            }
        }
    }

    /// The session request of `Engine.session`'s arguments.
    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        py: Python<'_>,
        prompt: Option<String>,
        image: Option<&Bound<'_, PyAny>>,
        seed: u64,
        frames: Option<&Bound<'_, PyAny>>,
        actions: Option<&Bound<'_, PyAny>>,
        width: Option<usize>,
        height: Option<usize>,
        extra: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<SessionRequest> {
        let native = self.inner.native_size().unwrap_or(DEFAULT_SIZE);
        let (width, height) = (width.unwrap_or(native.0), height.unwrap_or(native.1));
        let frames = match frames {
            None => DEFAULT_FRAMES,
            Some(f) if f.extract::<String>().is_ok_and(|s| s == "until-stop") => 0,
            Some(f) => f.extract::<usize>().map_err(|_| {
                request(
                    py,
                    "frames",
                    "must be 12·K − 3 (9, 21, 33, …) or \"until-stop\"",
                )
            })?,
        };
        let device = self.inner.device().clone();
        let mut r = SessionRequest::new(width, height, frames);
        r.seed = seed;
        r.prompt = prompt;
        if let Some(image) = image {
            r.image = Some(crate::inputs::image_tensor(
                py, image, width, height, &device,
            )?);
        }
        if let Some(actions) = actions {
            r.actions = crate::inputs::key_sets(py, actions)?;
        }
        for (key, value) in extra.into_iter().flat_map(|d| d.iter()) {
            let key: String = key.extract()?;
            match key.as_str() {
                "steps" => r.steps = value.extract()?,
                "flow_shift" => r.flow_shift = value.extract()?,
                "overlap" => r.overlap = value.extract()?,
                "reuse_last_step_kv" => r.reuse_last_step_kv = value.extract()?,
                "camera_guidance" => r.camera_guidance = value.extract()?,
                "decoder" => r.decoder = Some(parsed(py, "decoder", &value.extract::<String>()?)?),
                "text_embeds" => {
                    r.text_embeds = Some(crate::inputs::text_embeds(py, &value, &device)?)
                }
                other => {
                    return Err(PyTypeError::new_err(format!(
                        "session() got an unexpected keyword argument {other:?} (extra: steps, flow_shift, overlap, reuse_last_step_kv, camera_guidance, decoder, text_embeds)"
                    )))
                }
            }
        }
        Ok(r)
    }
}

#[cfg(feature = "cuda")]
fn cuda_device(_py: Python<'_>, ordinal: usize, config: &EngineConfig) -> PyResult<Device> {
    Device::cuda(ordinal, config.allocator.clone(), config.reclaim).py_err()
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(py: Python<'_>, _ordinal: usize, _config: &EngineConfig) -> PyResult<Device> {
    Err(request(
        py,
        "device",
        "this wheel has no CUDA support (build it with the `cuda` feature)",
    ))
}

#[pymethods]
impl Engine {
    /// Loads `model` as `headroom generate --model … --device … …` would.
    #[new]
    #[pyo3(signature = (model="world", device="cpu", dtype=None, decoder=None, weights=None,
        threads=None, policy=None, allocator=None, *, capacity=None, kv_budget=None,
        max_sessions=None, tiny_decoder=None, transformer=None, plan_cache=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: &str,
        device: &str,
        dtype: Option<&str>,
        decoder: Option<&str>,
        weights: Option<&str>,
        threads: Option<usize>,
        policy: Option<&str>,
        allocator: Option<&str>,
        capacity: Option<&Bound<'_, PyAny>>,
        kv_budget: Option<&Bound<'_, PyAny>>,
        max_sessions: Option<usize>,
        tiny_decoder: Option<std::path::PathBuf>,
        transformer: Option<String>,
        plan_cache: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        if let Some(threads) = threads {
            if threads == 0 {
                return Err(request(py, "threads", "must be at least 1"));
            }
            if !headroom_tensor::parallel::set_threads(threads) {
                return Err(request(
                    py,
                    "threads",
                    format!(
                        "the kernel pool already runs {} threads in this process (results are byte-identical per thread count); give threads to the first engine, or set HEADROOM_THREADS",
                        headroom_tensor::parallel::pool().current_num_threads()
                    ),
                ));
            }
        }
        let looks_like_path = model.contains(['/', '\\']) || model.starts_with(['.', '~']);
        if looks_like_path {
            existing(model)?;
        }
        for path in [
            tiny_decoder.as_deref(),
            transformer.as_deref().map(Path::new),
        ]
        .into_iter()
        .flatten()
        {
            existing(&path.to_string_lossy())?;
        }
        let dtype = match dtype.unwrap_or("f32") {
            "f32" => DType::F32,
            "bf16" => DType::BF16,
            other => {
                return Err(request(
                    py,
                    "dtype",
                    format!("must be f32 or bf16, got {other:?}"),
                ))
            }
        };
        let reclaim: ReclaimPolicy = parsed(py, "policy", policy.unwrap_or("before-decode"))?;
        let policy: AllocatorPolicy = parsed(py, "allocator", allocator.unwrap_or("planned"))?;
        let decoder: DecoderKind = parsed(py, "decoder", decoder.unwrap_or("full"))?;
        let weights: WeightFormat = parsed(py, "weights", weights.unwrap_or("native"))?;
        let capacity = capacity.map(|c| size_arg(py, "capacity", c)).transpose()?;
        let kv_budget_bytes = match kv_budget {
            Some(v) if v.extract::<String>().is_ok_and(|s| s == "auto") => None,
            Some(v) => Some(size_arg(py, "kv_budget", v)?),
            None => None,
        };
        let resolved = py
            .detach(|| headroom_engine::builtin_world::resolve(model))
            .py_err()?;
        let config = EngineConfig {
            model: resolved,
            transformer,
            allocator: AllocatorConfig::with_policy(policy),
            reclaim,
            kv_budget_bytes,
            max_sessions: max_sessions.unwrap_or(1).max(1),
            capacity,
            weight_dtype: dtype,
            weights,
            plan_cache,
            decoder,
            tiny_decoder,
            ..EngineConfig::default()
        };
        let on = Self::device(py, device, &config)?;
        let inner = py
            .detach(move || match on {
                Some(device) => Inner::load(config, Placement::device(device)),
                None => Inner::new(config),
            })
            .py_err()?;
        Ok(Self {
            inner: Arc::new(inner),
            name: model.to_string(),
            device_name: device.to_string(),
        })
    }

    /// Opens a session (admitted whole, or refused with `MemoryError`).
    #[pyo3(signature = (prompt=None, image=None, seed=0, frames=None, actions=None,
        width=None, height=None, **extra))]
    #[allow(clippy::too_many_arguments)]
    fn session(
        slf: &Bound<'_, Self>,
        prompt: Option<String>,
        image: Option<&Bound<'_, PyAny>>,
        seed: u64,
        frames: Option<&Bound<'_, PyAny>>,
        actions: Option<&Bound<'_, PyAny>>,
        width: Option<usize>,
        height: Option<usize>,
        extra: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Session> {
        let py = slf.py();
        let this = slf.get();
        let request = this.request(
            py, prompt, image, seed, frames, actions, width, height, extra,
        )?;
        let inner = Arc::clone(&this.inner);
        let session = run_interruptible(py, None, move || inner.open_session(request))?;
        Ok(Session::new(
            slf.clone().into_any().unbind(),
            session.py_err()?,
        ))
    }

    /// Resumes a session from a `SessionState` (`Session.snapshot()`) or a `.hrsnap`
    /// file: its next chunks are the bytes the uninterrupted session would have made.
    fn resume(slf: &Bound<'_, Self>, state: &Bound<'_, PyAny>) -> PyResult<Session> {
        let py = slf.py();
        let inner = Arc::clone(&slf.get().inner);
        let session = if let Ok(state) = state.cast::<SessionState>() {
            let snapshot = Arc::clone(&state.get().snapshot);
            run_interruptible(py, None, move || inner.resume(snapshot))?
        } else {
            let path: std::path::PathBuf = state.extract().map_err(|_| {
                PyTypeError::new_err("resume: give a SessionState or a .hrsnap path")
            })?;
            existing(&path.to_string_lossy())?;
            run_interruptible(py, None, move || inner.resume(path.as_path()))?
        };
        Ok(Session::new(
            slf.clone().into_any().unbind(),
            session.py_err()?,
        ))
    }

    /// `torch.cuda.memory_stats()` of the engine's allocator: PyTorch's keys
    /// (`allocated_bytes.all.peak`, …) plus headroom's reclaim and plan counters.
    fn memory_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (key, value) in self.inner.platform().memory_stats().to_map() {
            dict.set_item(key, value)?;
        }
        Ok(dict)
    }

    /// `torch.cuda.memory._snapshot()`'s shape (segments, device_traces,
    /// allocator_settings): pickle it and pytorch.org/memory_viz opens it.
    fn memory_snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pickle = self.inner.platform().allocator().snapshot().to_pickle();
        crate::inputs::unpickle(py, &pickle)
    }

    /// Keeps the allocator's event history (the `device_traces` of `memory_snapshot()`),
    /// up to `max_entries` events; 0 turns it off (`torch.cuda.memory._record_memory_history`).
    #[pyo3(signature = (max_entries=1 << 20))]
    fn record_memory_history(&self, max_entries: usize) {
        self.inner.platform().allocator().set_history(max_entries);
    }

    /// Resets the peaks of `memory_stats()` to the current values.
    fn reset_peak_memory_stats(&self) {
        self.inner.platform().reset_peak_stats();
    }

    /// The frame a session opened with `image` (default: the model's own first frame,
    /// else black) conditions on, as `uint8 [H, W, 3]` at the session's size.
    #[pyo3(signature = (image=None, width=None, height=None))]
    fn first_frame(
        &self,
        py: Python<'_>,
        image: Option<&Bound<'_, PyAny>>,
        width: Option<usize>,
        height: Option<usize>,
    ) -> PyResult<Py<PyAny>> {
        let native = self.inner.native_size().unwrap_or(DEFAULT_SIZE);
        let (width, height) = (width.unwrap_or(native.0), height.unwrap_or(native.1));
        let rgb = match image {
            Some(image) => Some(crate::inputs::rgb_image(py, image)?),
            None => headroom_engine::first_frame::load(Path::new(&self.inner.config().model))
                .py_err()?,
        };
        let host = Device::cpu().py_err()?;
        let planar = match rgb {
            Some(rgb) => headroom_engine::first_frame::to_tensor(&rgb, width, height, &host)
                .py_err()?
                .to_vec::<f32>()
                .py_err()?,
            None => vec![-1.0; 3 * width * height],
        };
        let n = width * height;
        let mut pixels = vec![0u8; 3 * n];
        for (i, px) in pixels.chunks_exact_mut(3).enumerate() {
            for (c, v) in px.iter_mut().enumerate() {
                *v = ((planar[c * n + i] + 1.0) * 127.5)
                    .round()
                    .clamp(0.0, 255.0) as u8;
            }
        }
        Ok(numpy::PyArray1::from_vec(py, pixels)
            .reshape([height, width, 3])?
            .into_any()
            .unbind())
    }

    /// `(width, height)` the model was trained at (its folder's first frame), if known.
    #[getter]
    fn native_size(&self) -> Option<(usize, usize)> {
        self.inner.native_size()
    }

    /// `model` as given.
    #[getter]
    fn model(&self) -> &str {
        &self.name
    }

    /// `device` as given.
    #[getter(device)]
    fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Bytes the engine keeps with no session open: weights, KV pool, prompt cache.
    #[getter]
    fn resident_bytes(&self) -> u64 {
        self.inner.resident().total()
    }

    fn __repr__(&self) -> String {
        format!(
            "headroom.Engine(model={:?}, device={:?})",
            self.name, self.device_name
        )
    }
}
