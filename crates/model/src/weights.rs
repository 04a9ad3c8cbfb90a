//! Weights by diffusers key: loaded from a diffusers folder (`config.json` +
//! `diffusion_pytorch_model.safetensors`, or a sharded `….safetensors.index.json`) or
//! initialised from a seed. Networks take every tensor by key with the shape they expect,
//! so a missing or mis-shaped tensor is an error naming the key and both shapes.

use std::collections::BTreeMap;
use std::path::Path;

use std::cell::RefCell;
use std::collections::BTreeSet;

use headroom_tensor::{DType, Device, Tensor};

use crate::checkpoint::{TensorFile, Tensors};
use crate::error::{ModelError, Result};

/// How a seeded initialisation fills one tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Normal noise scaled by `1/√fan_in` (weights).
    FanIn,
    /// Normal noise times a constant (biases).
    Scaled(f32),
    /// `1 + 0.1·noise` (norm scales).
    NearOne,
}

#[derive(Debug)]
enum Source {
    /// Our key → (file, stored name), the layout they were read as, and the keys taken.
    Files {
        names: BTreeMap<String, (usize, String)>,
        files: Vec<TensorFile>,
        layout: String,
        taken: RefCell<BTreeSet<String>>,
    },
    /// Seeded random tensors.
    Seeded(u64),
}

/// How a network's large linear weights (the DiT blocks' attention and FFN) are held in
/// memory; every other tensor stays as loaded.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum WeightFormat {
    /// As the file has them (8-bit files stay 8-bit), in the load dtype otherwise.
    #[default]
    Native,
    /// `float8_e4m3fn` per output channel (symmetric), widened to bf16 in the products.
    Fp8,
    /// int8 per output channel (symmetric), the products W8A8.
    Int8,
}

impl WeightFormat {
    /// The name `--weights` takes.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Native => "native",
            WeightFormat::Fp8 => "fp8",
            WeightFormat::Int8 => "int8",
        }
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "native" => Ok(WeightFormat::Native),
            "fp8" => Ok(WeightFormat::Fp8),
            "int8" => Ok(WeightFormat::Int8),
            other => Err(format!(
                "unknown weight format {other:?}; use native, fp8 or int8"
            )),
        }
    }
}

/// Whether `dtype` is one of the 8-bit weight formats checkpoints ship.
pub fn is_8bit(dtype: DType) -> bool {
    matches!(dtype, DType::F8E4M3 | DType::F8E5M2 | DType::I8)
}

/// 8-bit `codes` (`[out, …]`) times their `scale` (one value, or one per output row), in
/// f32: the values an 8-bit checkpoint's tensor stands for.
pub fn dequantize(codes: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let values = codes.to_dtype(DType::F32)?;
    if scale.numel() == 1 {
        return Ok(values.mul(scale)?);
    }
    let mut per_row = vec![1; codes.rank()];
    per_row[0] = scale.numel();
    Ok(values.mul(&scale.reshape(&per_row)?)?)
}

/// Where a network's weights come from.
#[derive(Debug)]
pub struct WeightStore {
    source: Source,
    device: Device,
    dtype: DType,
    format: WeightFormat,
    counter: std::cell::Cell<u64>,
}

fn io_err(path: &Path, reason: impl std::fmt::Display) -> ModelError {
    ModelError::Io {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Reads a folder's `config.json` as JSON.
pub fn read_config(dir: &Path) -> Result<serde_json::Value> {
    read_json(&dir.join("config.json"))
}

/// Reads a JSON file.
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    serde_json::from_str(&text).map_err(|e| io_err(path, format!("not valid JSON: {e}")))
}

/// The first `n` items, for error messages that list keys.
pub(crate) fn first_few<'a>(keys: impl Iterator<Item = &'a String>, n: usize) -> String {
    let keys: Vec<&String> = keys.collect();
    let mut text = keys
        .iter()
        .take(n)
        .map(|k| format!("{k:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    if keys.len() > n {
        text.push_str(&format!(" … ({} in all)", keys.len()));
    }
    text
}

impl WeightStore {
    /// Weights of a diffusers folder, converted to `dtype` on load, onto `device`.
    pub fn from_dir(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        Self::from_files(dir, "diffusion_pytorch_model", device, dtype)
    }

    /// Weights of a folder holding `{stem}.safetensors` or a sharded
    /// `{stem}.safetensors.index.json` (`diffusion_pytorch_model` for diffusers, `model`
    /// for transformers), converted to `dtype` on load, onto `device`.
    pub fn from_files(dir: &Path, stem: &str, device: &Device, dtype: DType) -> Result<Self> {
        let tensors = Tensors::stem(dir, stem)?;
        Ok(Self::renamed(
            tensors,
            |k| Some(k.to_string()),
            "diffusers",
            device,
            dtype,
        ))
    }

    /// Weights of `tensors` under our names: `rename` maps each stored name to our key
    /// (`None` drops it); `layout` names the layout assumed, for error messages.
    pub fn renamed(
        tensors: Tensors,
        rename: impl Fn(&str) -> Option<String>,
        layout: &str,
        device: &Device,
        dtype: DType,
    ) -> Self {
        let names = tensors
            .names
            .into_iter()
            .filter_map(|(stored, file)| Some((rename(&stored)?, (file, stored))))
            .collect();
        Self {
            source: Source::Files {
                names,
                files: tensors.files,
                layout: layout.to_string(),
                taken: RefCell::new(BTreeSet::new()),
            },
            device: device.clone(),
            dtype,
            format: WeightFormat::Native,
            counter: std::cell::Cell::new(0),
        }
    }

    /// The store with its large linear weights held as `format`.
    pub fn with_format(mut self, format: WeightFormat) -> Self {
        self.format = format;
        self
    }

    /// How the large linear weights are held.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Our keys the store holds (empty for a seeded store).
    pub fn keys(&self) -> Vec<String> {
        match &self.source {
            Source::Files { names, .. } => names.keys().cloned().collect(),
            Source::Seeded(_) => Vec::new(),
        }
    }

    /// Shape of the tensor under our key `key`, if the store holds it.
    pub fn shape_of(&self, key: &str) -> Option<Vec<usize>> {
        match &self.source {
            Source::Files { names, files, .. } => {
                let (file, stored) = names.get(key)?;
                files[*file].info(stored).ok().map(|(shape, _)| shape)
            }
            Source::Seeded(_) => None,
        }
    }

    /// The layout the store's names were read as ("diffusers", "original Wan", …).
    pub fn layout(&self) -> &str {
        match &self.source {
            Source::Files { layout, .. } => layout,
            Source::Seeded(_) => "seeded",
        }
    }

    /// Keys of the store that no `get` has asked for yet: after a network is built,
    /// tensors the checkpoint has that the network does not know.
    pub fn unused(&self) -> Vec<String> {
        match &self.source {
            Source::Files { names, taken, .. } => {
                let taken = taken.borrow();
                names
                    .keys()
                    .filter(|k| !taken.contains(*k))
                    .cloned()
                    .collect()
            }
            Source::Seeded(_) => Vec::new(),
        }
    }

    /// Refuses a checkpoint with tensors the network did not use, listing the first few
    /// and the layout assumed (a renaming that went wrong shows up here).
    pub fn check_all_used(&self, what: &str) -> Result<()> {
        let unused = self.unused();
        if unused.is_empty() {
            return Ok(());
        }
        Err(ModelError::input(
            "weights",
            format!(
                "{what}: {} unknown tensors in a checkpoint read as the {} layout: {}",
                unused.len(),
                self.layout(),
                first_few(unused.iter(), 5)
            ),
        ))
    }

    /// Seeded random weights (tests, the embedded default model).
    pub fn seeded(seed: u64, device: &Device, dtype: DType) -> Self {
        Self {
            source: Source::Seeded(seed),
            device: device.clone(),
            dtype,
            format: WeightFormat::Native,
            counter: std::cell::Cell::new(0),
        }
    }

    /// The device tensors are loaded onto.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dtype weights are stored in (norms and biases may stay f32).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether the store can provide `key` (a seeded store provides every key).
    pub fn has(&self, key: &str) -> bool {
        match &self.source {
            Source::Files { names, .. } => names.contains_key(key),
            Source::Seeded(_) => true,
        }
    }

    /// The tensor `key` with exactly `shape`, in the store's dtype.
    pub fn get(&self, key: &str, shape: &[usize], init: Init) -> Result<Tensor> {
        self.get_as(key, shape, init, self.dtype)
    }

    /// Part `index` of `parts` equal parts along `axis` of the tensor `key` (whole shape
    /// `shape`), for tensor-parallel shards. The whole tensor is read (or drawn) first,
    /// so a seeded store draws the same values sharded or not.
    #[allow(clippy::too_many_arguments)]
    pub fn get_part(
        &self,
        key: &str,
        shape: &[usize],
        init: Init,
        dtype: DType,
        axis: usize,
        (index, parts): (usize, usize),
    ) -> Result<Tensor> {
        let whole = self.get_as(key, shape, init, dtype)?;
        if parts <= 1 {
            return Ok(whole);
        }
        let len = shape[axis] / parts;
        // A copy of its own, so the whole tensor's storage is not kept alive by a view.
        Ok(whole.narrow(axis, index * len, len)?.copy_as(dtype)?)
    }

    /// The dtype the file stores `key` in (`None` for a seeded store or a missing key).
    pub fn stored_dtype(&self, key: &str) -> Option<DType> {
        match &self.source {
            Source::Files { names, files, .. } => {
                let (file, stored) = names.get(key)?;
                files[*file].info(stored).ok().map(|(_, d)| d)
            }
            Source::Seeded(_) => None,
        }
    }

    /// The f32 scale an 8-bit `{base}.weight` of `shape` ships with, as the layouts name
    /// it: ComfyUI's `{base}.scale_weight`, or `{base}.weight_scale` (with an
    /// `{base}.input_scale` for activations, which the products do not need): `[1]` for
    /// one value, `[out]` for one per output channel; `None` when the file has none. A
    /// scale of another shape (block-wise) is refused by name. Every scale key read is
    /// marked used.
    pub fn scale_of(&self, key: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        let Source::Files { names, taken, .. } = &self.source else {
            return Ok(None);
        };
        let base = key.strip_suffix(".weight").unwrap_or(key);
        let input = format!("{base}.input_scale");
        if names.contains_key(&input) {
            taken.borrow_mut().insert(input);
        }
        let Some(scale_key) = [
            format!("{base}.scale_weight"),
            format!("{base}.weight_scale"),
        ]
        .into_iter()
        .find(|k| names.contains_key(k)) else {
            return Ok(None);
        };
        let found = self.shape_of(&scale_key).unwrap_or_default();
        let n: usize = found.iter().product();
        let out = shape.first().copied().unwrap_or(1);
        let per_channel = n == out && found.iter().filter(|&&d| d != 1).count() <= 1;
        if n != 1 && !per_channel {
            return Err(ModelError::Quantization {
                key: scale_key,
                rule: format!(
                    "a scale of shape {found:?} for a weight {shape:?} (block-wise?) is not a \
                     layout headroom reads; it reads one scale per tensor or one per output \
                     channel (ComfyUI scale_weight, weight_scale)"
                ),
            });
        }
        let s = self.get_as(&scale_key, &found, Init::NearOne, DType::F32)?;
        Ok(Some(s.reshape(&[n])?))
    }

    /// Part `index` of `parts` along `axis` of an 8-bit `key` of `shape`, kept in its
    /// stored dtype, and its scale (`[1]`, or `[out]` sliced as the rows are): `None`
    /// when the file stores `key` in another dtype (or the store is seeded). An int8
    /// weight without a scale is refused (no layout ships one).
    pub fn quantized_part(
        &self,
        key: &str,
        shape: &[usize],
        axis: usize,
        (index, parts): (usize, usize),
    ) -> Result<Option<(Tensor, Tensor)>> {
        let Some(stored) = self.stored_dtype(key).filter(|d| is_8bit(*d)) else {
            return Ok(None);
        };
        let codes = self.get_part(key, shape, Init::FanIn, stored, axis, (index, parts))?;
        let scale = match self.scale_of(key, shape)? {
            Some(s) => s,
            None if stored == DType::I8 => {
                return Err(ModelError::Quantization {
                    key: key.to_string(),
                    rule: "an int8 weight without a weight_scale: not a layout headroom \
                           reads (lightx2v's int8 files ship one per output channel)"
                        .into(),
                })
            }
            None => Tensor::full(&[1], 1.0, DType::F32, &self.device)?,
        };
        let scale = if scale.numel() > 1 && axis == 0 && parts > 1 {
            let len = shape[0] / parts;
            scale.narrow(0, index * len, len)?.contiguous()?
        } else {
            scale
        };
        Ok(Some((codes, scale)))
    }

    /// Marks `key` used without reading it (a layout's marker tensor, such as ComfyUI's
    /// `scaled_fp8`).
    pub fn accept(&self, key: &str) {
        if let Source::Files { names, taken, .. } = &self.source {
            if names.contains_key(key) {
                taken.borrow_mut().insert(key.to_string());
            }
        }
    }

    /// The tensor `key` with exactly `shape`, in `dtype` (norm scales and biases that
    /// diffusers keeps in f32).
    pub fn get_as(&self, key: &str, shape: &[usize], init: Init, dtype: DType) -> Result<Tensor> {
        match &self.source {
            Source::Files {
                names,
                files,
                layout,
                taken,
            } => {
                let Some((file, stored)) = names.get(key) else {
                    let unused = self.unused();
                    let hint = if unused.is_empty() {
                        format!(" (layout {layout})")
                    } else {
                        format!(
                            " (layout {layout}; tensors not yet used: {})",
                            first_few(unused.iter(), 4)
                        )
                    };
                    return Err(ModelError::MissingWeight {
                        key: key.to_string(),
                        expected: shape.to_vec(),
                        hint,
                    });
                };
                let (found, stored_dtype) = files[*file].info(stored)?;
                if found != shape {
                    return Err(ModelError::WeightShape {
                        key: if stored == key {
                            key.to_string()
                        } else {
                            format!("{key} (stored as {stored})")
                        },
                        expected: shape.to_vec(),
                        found,
                    });
                }
                taken.borrow_mut().insert(key.to_string());
                if is_8bit(stored_dtype) && !is_8bit(dtype) {
                    // An 8-bit tensor read as a float one (outside the blocks' linears):
                    // its values, times its scale where the file has one.
                    let codes = files[*file].load(stored, &self.device, stored_dtype)?;
                    return match self.scale_of(key, shape)? {
                        Some(scale) => Ok(dequantize(&codes, &scale)?.to_dtype(dtype)?),
                        None => Ok(codes.to_dtype(dtype)?),
                    };
                }
                files[*file].load(stored, &self.device, dtype)
            }
            Source::Seeded(seed) => {
                // Each tensor draws from its own stretch of the seed's stream, in request
                // order, so a network initialises the same way every time.
                let n: usize = shape.iter().product();
                let offset = self.counter.get();
                self.counter.set(offset + n as u64);
                let noise = Tensor::randn(shape, *seed, offset, DType::F32, &self.device)?;
                let fan_in: usize = shape.iter().skip(1).product::<usize>().max(1);
                let t = match init {
                    Init::FanIn => noise.mul_scalar(1.0 / (fan_in as f32).sqrt())?,
                    Init::Scaled(s) => noise.mul_scalar(s)?,
                    Init::NearOne => noise.affine(0.1, 1.0)?,
                };
                Ok(t.to_dtype(dtype)?)
            }
        }
    }
}
