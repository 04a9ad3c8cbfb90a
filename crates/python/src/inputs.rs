//! What crosses the boundary: a first frame from a numpy array, a PIL image or a path;
//! key scripts; text embeddings; and frames out as numpy `uint8 [T, H, W, 3]` arrays
//! that view the engine's own frame tensor (zero-copy on the host).

use std::path::PathBuf;

use headroom_model::camera::Keys;
use headroom_tensor::{Device, Tensor};
use numpy::ndarray::ArrayView4;
use numpy::{PyArray2, PyArray3, PyArray4, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{request, IntoPy};

/// The bytes behind a frames array: the engine's frame tensor, kept alive (its block
/// held in the engine's allocator) as long as a numpy array views it.
#[derive(Debug)]
#[pyclass(module = "headroom._headroom", frozen)]
pub struct FrameBuffer {
    tensor: Tensor,
}

/// `frames` (u8 `[T, H, W, 3]`) as a read-only numpy array: a view of the tensor's own
/// bytes where it lives on the host, else a copy.
pub fn frames_array(py: Python<'_>, frames: Tensor) -> PyResult<Py<PyAny>> {
    let [t, h, w, c] = *frames.shape() else {
        return Err(crate::errors::EngineError::new_err(format!(
            "frames must be [T, H, W, 3], got {:?}",
            frames.shape()
        )));
    };
    let array = if frames.host_bytes().is_some() {
        let owner = Bound::new(py, FrameBuffer { tensor: frames })?;
        let base = owner.clone().into_any();
        let bytes = owner.get().tensor.host_bytes().unwrap_or(&[]);
        let view = ArrayView4::from_shape((t, h, w, c), bytes)
            .map_err(|e| crate::errors::EngineError::new_err(e.to_string()))?;
        // SAFETY: the array's base is `owner`, which holds the tensor whose bytes `view`
        // points at; a tensor's host storage never moves or is freed while a handle to
        // it lives, and nothing writes a delivered frame tensor (the array is made
        // read-only below, so Python does not either).
        let array = unsafe { PyArray4::<u8>::borrow_from_array(&view, base) };
        array.into_any()
    } else {
        let bytes = frames.to_vec::<u8>().py_err()?;
        numpy::PyArray1::from_vec(py, bytes)
            .reshape([t, h, w, c])?
            .into_any()
    };
    array.getattr("flags")?.setattr("writeable", false)?;
    Ok(array.unbind())
}

/// An RGB image from `image`: a path (str or `os.PathLike`), a PIL image, or a numpy
/// `uint8` array `[H, W, 3]`.
pub fn rgb_image(py: Python<'_>, image: &Bound<'_, PyAny>) -> PyResult<image::RgbImage> {
    if let Ok(path) = image.extract::<PathBuf>() {
        let bytes = std::fs::read(&path)?;
        return headroom_media::decode_image(&bytes, headroom_engine::first_frame::MAX_SIDE)
            .map_err(|e| request(py, "image", format!("{}: {e}", path.display())));
    }
    let array = if image.hasattr("convert")? && image.hasattr("getdata")? {
        // A PIL image: its RGB pixels, through numpy's array interface.
        let rgb = image.call_method1("convert", ("RGB",))?;
        py.import("numpy")?.call_method1("asarray", (rgb,))?
    } else {
        image.clone()
    };
    let Ok(array) = array.cast::<PyArray3<u8>>() else {
        return Err(PyTypeError::new_err(
            "image: give a path, a PIL image or a numpy uint8 array [H, W, 3]",
        ));
    };
    let [h, w, c] = [array.shape()[0], array.shape()[1], array.shape()[2]];
    if c != 3 || h == 0 || w == 0 {
        return Err(request(
            py,
            "image",
            format!("must be uint8 [H, W, 3], got [{h}, {w}, {c}]"),
        ));
    }
    let pixels = array.to_vec().or_else(|_| {
        // Not contiguous: numpy copies it into order.
        py.import("numpy")?
            .call_method1("ascontiguousarray", (array,))?
            .cast::<PyArray3<u8>>()?
            .to_vec()
            .map_err(PyErr::from)
    })?;
    image::RgbImage::from_raw(w as u32, h as u32, pixels)
        .ok_or_else(|| request(py, "image", "pixels do not fill [H, W, 3]"))
}

/// The first frame a session conditions on, `[3, H, W]` in [−1, 1], from `image`.
pub fn image_tensor(
    py: Python<'_>,
    image: &Bound<'_, PyAny>,
    width: usize,
    height: usize,
    device: &Device,
) -> PyResult<Tensor> {
    let rgb = rgb_image(py, image)?;
    headroom_engine::first_frame::to_tensor(&rgb, width, height, device).py_err()
}

/// Key sets from `actions`: a key script (`"wwaa-d"`, `"w+d"` joins two keys into one
/// latent frame) or a sequence of key sets (`["w", "wd", ""]`), one per latent frame.
pub fn key_sets(py: Python<'_>, actions: &Bound<'_, PyAny>) -> PyResult<Vec<Keys>> {
    let parsed = if let Ok(script) = actions.extract::<String>() {
        Keys::script(&script)
    } else if let Ok(sets) = actions.extract::<Vec<String>>() {
        sets.iter().map(|s| Keys::parse(s)).collect()
    } else {
        return Err(PyTypeError::new_err(
            "actions: give a key script (\"wwdd\") or a list of key sets ([\"w\", \"wd\"])",
        ));
    };
    parsed.map_err(|e| request(py, "actions", e))
}

/// One key set from `keys`: a string of keys (`"wd"`) or an iterable of key names.
pub fn keys(py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Keys> {
    let text = if let Ok(text) = keys.extract::<String>() {
        text
    } else if let Ok(names) = keys.extract::<Vec<String>>() {
        names.concat()
    } else {
        return Err(PyTypeError::new_err(
            "keys: give a string of keys (\"wd\") or a list of key names",
        ));
    };
    Keys::parse(&text).map_err(|e| request(py, "keys", e))
}

/// Text embeddings `[L, text_dim]` from a numpy float32 array.
pub fn text_embeds(py: Python<'_>, embeds: &Bound<'_, PyAny>, device: &Device) -> PyResult<Tensor> {
    let array = py
        .import("numpy")?
        .call_method1("ascontiguousarray", (embeds, "float32"))?;
    let array = array
        .cast::<PyArray2<f32>>()
        .map_err(|_| request(py, "text_embeds", "must be a 2-D float array [L, text_dim]"))?;
    let shape = [array.shape()[0], array.shape()[1]];
    let data = array.to_vec()?;
    Tensor::from_slice(&data, &shape, device).py_err()
}

/// A PyTorch snapshot pickle's bytes as Python objects (`pickle.loads`).
pub fn unpickle<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    py.import("pickle")?
        .call_method1("loads", (PyBytes::new(py, bytes),))
}
