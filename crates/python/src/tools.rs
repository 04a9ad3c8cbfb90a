//! The tools beside the engine: `plan()` (`headroom plan --json`), `replay()`
//! (`headroom mem replay --json`) and `write_video()` (`generate --out`'s writers).

use std::path::PathBuf;

use headroom_engine::plan::{plan_dtype, run_plan_sized, PlanConfig, PlanPlatform, PlanReport};
use headroom_engine::Mesh;
use headroom_mem::{
    parse_size, parse_trace, replay_on_sim, AllocatorConfig, AllocatorPolicy, Platform,
    ReclaimPolicy, ReplayOptions,
};
use numpy::{PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::errors::{request, IntoPy};

/// Frames per second of `generate`'s videos.
const FPS: u32 = 16;

/// Bytes from an int or a size string (`"64GiB"`).
fn bytes_arg(py: Python<'_>, field: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(n) = value.extract::<u64>() {
        return Ok(n);
    }
    let text: String = value
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("{field}: give bytes (int) or a size (str)")))?;
    parse_size(&text).map_err(|e| request(py, field, e))
}

/// Policies from a list or a comma-separated string.
fn policies(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Vec<ReclaimPolicy>> {
    let names: Vec<String> = match value.extract::<String>() {
        Ok(text) => text.split(',').map(str::to_string).collect(),
        Err(_) => value.extract()?,
    };
    names
        .iter()
        .map(|n| n.trim().parse().map_err(|e| request(py, "policies", e)))
        .collect()
}

/// What `headroom plan --json` prints for the same arguments, as Python objects.
#[pyfunction]
#[pyo3(signature = (model="lingbot-world-v2-14b", width=None, height=None, frames=None, tp=1,
    sp=1, capacity=None, policies=None, *, allocator="planned", dtype="auto",
    weights="native", decoder="full", tiny_decoder=None, transformer=None, kv_fraction=None,
    chunks=None, measure=false))]
#[allow(clippy::too_many_arguments)]
pub fn plan(
    py: Python<'_>,
    model: &str,
    width: Option<usize>,
    height: Option<usize>,
    frames: Option<&Bound<'_, PyAny>>,
    tp: usize,
    sp: usize,
    capacity: Option<&Bound<'_, PyAny>>,
    policies: Option<&Bound<'_, PyAny>>,
    allocator: &str,
    dtype: &str,
    weights: &str,
    decoder: &str,
    tiny_decoder: Option<PathBuf>,
    transformer: Option<String>,
    kv_fraction: Option<f64>,
    chunks: Option<usize>,
    measure: bool,
) -> PyResult<Py<PyAny>> {
    let frames = match frames {
        None => 33,
        Some(f) if f.extract::<String>().is_ok_and(|s| s == "until-stop") => 0,
        Some(f) => f
            .extract::<usize>()
            .map_err(|_| request(py, "frames", "must be 12·K − 3 or \"until-stop\""))?,
    };
    let capacity = match capacity {
        Some(c) => bytes_arg(py, "capacity", c)?,
        None => 64 << 30,
    };
    let policies = match policies {
        Some(p) => self::policies(py, p)?,
        None => vec![ReclaimPolicy::Never, ReclaimPolicy::BeforeDecode],
    };
    let weight_dtype = plan_dtype(model, dtype).py_err()?;
    let allocator: AllocatorPolicy = allocator.parse().map_err(|e| request(py, "allocator", e))?;
    let resolved = headroom_engine::builtin_world::resolve(model).py_err()?;
    let native = headroom_engine::first_frame::native_size(std::path::Path::new(&resolved))
        .unwrap_or((416, 240));
    let config = PlanConfig {
        model: resolved,
        transformer,
        height: height.unwrap_or(native.1),
        width: width.unwrap_or(native.0),
        frames,
        mesh: Mesh { tp, sp },
        capacity,
        allocator: AllocatorConfig::with_policy(allocator),
        policies,
        kv_fraction,
        chunks,
        weight_dtype,
        weights: weights.parse().map_err(|e| request(py, "weights", e))?,
        history: 0,
        platform: if measure {
            PlanPlatform::Cpu
        } else {
            PlanPlatform::Sim
        },
        decoder: decoder.parse().map_err(|e| request(py, "decoder", e))?,
        tiny_decoder,
    };
    let (rows, _) =
        crate::interrupt::run_interruptible(py, None, || run_plan_sized(&config))?.py_err()?;
    let json = PlanReport::new(&rows).to_json().py_err()?;
    Ok(py.import("json")?.call_method1("loads", (json,))?.unbind())
}

/// What `headroom mem replay --json` prints for the same arguments: a trace (our JSON
/// lines or a PyTorch snapshot pickle) replayed through headroom's allocator.
#[pyfunction]
#[pyo3(signature = (trace, allocator="planned", policy="before-decode", *, capacity=None,
    max_split_size=None, snapshot=None))]
pub fn replay(
    py: Python<'_>,
    trace: PathBuf,
    allocator: &str,
    policy: &str,
    capacity: Option<&Bound<'_, PyAny>>,
    max_split_size: Option<&Bound<'_, PyAny>>,
    snapshot: Option<PathBuf>,
) -> PyResult<Py<PyAny>> {
    let bytes = std::fs::read(&trace)?;
    let ops = parse_trace(&bytes).py_err()?;
    let options = ReplayOptions {
        allocator: allocator.parse().map_err(|e| request(py, "allocator", e))?,
        capacity: match capacity {
            Some(c) => bytes_arg(py, "capacity", c)?,
            None => 64 << 30,
        },
        max_split_size: max_split_size
            .map(|m| bytes_arg(py, "max_split_size", m))
            .transpose()?,
        policy: policy.parse().map_err(|e| request(py, "policy", e))?,
        history: if snapshot.is_some() { 1 << 20 } else { 0 },
    };
    let (report, platform) =
        crate::interrupt::run_interruptible(py, None, || replay_on_sim(&ops, &options))?
            .py_err()?;
    if let Some(path) = &snapshot {
        std::fs::write(path, platform.allocator().snapshot().to_pickle())?;
    }
    let json = report
        .to_json(&trace.display().to_string(), &options)
        .to_string();
    Ok(py.import("json")?.call_method1("loads", (json,))?.unbind())
}

/// Writes `frames` (an iterable of `uint8 [T, H, W, 3]` arrays or chunks) as `generate
/// --out` does: a `.y4m` or an H.264 `.mp4` file at 16 frames per second. Returns the
/// frames written.
#[pyfunction]
pub fn write_video(py: Python<'_>, path: PathBuf, frames: &Bound<'_, PyAny>) -> PyResult<usize> {
    enum Writer {
        Y4m(headroom_media::Y4mWriter),
        Mp4(Box<headroom_media::Mp4Writer>),
    }
    let mp4 = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("mp4"));
    let y4m = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("y4m"));
    if !mp4 && !y4m {
        return Err(request(py, "path", "use a .mp4 or .y4m file"));
    }
    let numpy = py.import("numpy")?;
    let mut writer: Option<Writer> = None;
    let mut written = 0;
    for item in frames.try_iter()? {
        let item = item?;
        let item = if item.hasattr("frames")? {
            item.getattr("frames")?
        } else {
            item
        };
        let array = numpy.call_method1("ascontiguousarray", (item, "uint8"))?;
        let array = array
            .cast::<numpy::PyArray4<u8>>()
            .map_err(|_| request(py, "frames", "each item must be uint8 [T, H, W, 3]"))?;
        let [t, h, w, c] = [
            array.shape()[0],
            array.shape()[1],
            array.shape()[2],
            array.shape()[3],
        ];
        if c != 3 {
            return Err(request(
                py,
                "frames",
                "each item must be uint8 [T, H, W, 3]",
            ));
        }
        let bytes = array.to_vec()?;
        let writer = match &mut writer {
            Some(w) => w,
            None => writer.insert(if mp4 {
                headroom_media::check_h264_size(w, h, FPS).map_err(|e| request(py, "frames", e))?;
                Writer::Mp4(Box::new(
                    headroom_media::Mp4Writer::create(&path, w, h, FPS)
                        .map_err(|e| request(py, "path", e))?,
                ))
            } else {
                Writer::Y4m(
                    headroom_media::Y4mWriter::create(&path, w, h, FPS)
                        .map_err(|e| request(py, "path", e))?,
                )
            }),
        };
        for frame in bytes.chunks_exact(h * w * 3).take(t) {
            match writer {
                Writer::Y4m(y) => y.write_frame(frame),
                Writer::Mp4(m) => m.write_frame(frame),
            }
            .map_err(|e| request(py, "frames", e))?;
            written += 1;
        }
    }
    match writer {
        Some(Writer::Y4m(y)) => y.finish().map(drop),
        Some(Writer::Mp4(m)) => m.finish().map(drop),
        None => return Err(request(py, "frames", "no frames to write")),
    }
    .map_err(|e| request(py, "path", e))?;
    Ok(written)
}
