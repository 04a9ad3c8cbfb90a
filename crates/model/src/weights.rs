//! Weights by diffusers key: loaded from a diffusers folder (`config.json` +
//! `diffusion_pytorch_model.safetensors`, or a sharded `….safetensors.index.json`) or
//! initialised from a seed. Networks take every tensor by key with the shape they expect,
//! so a missing or mis-shaped tensor is an error naming the key and both shapes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use headroom_tensor::io::safetensors::SafetensorsFile;
use headroom_tensor::{DType, Device, Tensor};

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
    /// tensor name → file holding it.
    Files(BTreeMap<String, usize>, Vec<SafetensorsFile>),
    /// Seeded random tensors.
    Seeded(u64),
}

/// Where a network's weights come from.
#[derive(Debug)]
pub struct WeightStore {
    source: Source,
    device: Device,
    dtype: DType,
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
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| io_err(&path, e))?;
    serde_json::from_str(&text).map_err(|e| io_err(&path, format!("not valid JSON: {e}")))
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
        let single = dir.join(format!("{stem}.safetensors"));
        let index = dir.join(format!("{stem}.safetensors.index.json"));
        let (names, files) = if single.exists() {
            let file = SafetensorsFile::open(&single)?;
            let names = file.names()?.into_iter().map(|n| (n, 0)).collect();
            (names, vec![file])
        } else if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| io_err(&index, e))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| io_err(&index, format!("not valid JSON: {e}")))?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| io_err(&index, "no weight_map object"))?;
            let mut shard_ids: BTreeMap<String, usize> = BTreeMap::new();
            let mut files = Vec::new();
            let mut names = BTreeMap::new();
            for (name, shard) in map {
                let shard = shard.as_str().ok_or_else(|| {
                    io_err(
                        &index,
                        format!("weight_map entry {name:?} is not a file name"),
                    )
                })?;
                let id = match shard_ids.get(shard) {
                    Some(&id) => id,
                    None => {
                        let path: PathBuf = dir.join(shard);
                        files.push(SafetensorsFile::open(&path)?);
                        shard_ids.insert(shard.to_string(), files.len() - 1);
                        files.len() - 1
                    }
                };
                names.insert(name.clone(), id);
            }
            (names, files)
        } else {
            return Err(io_err(
                dir,
                format!("no {stem}.safetensors or {stem}.safetensors.index.json"),
            ));
        };
        Ok(Self {
            source: Source::Files(names, files),
            device: device.clone(),
            dtype,
            counter: std::cell::Cell::new(0),
        })
    }

    /// Seeded random weights (tests, the embedded default model).
    pub fn seeded(seed: u64, device: &Device, dtype: DType) -> Self {
        Self {
            source: Source::Seeded(seed),
            device: device.clone(),
            dtype,
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
            Source::Files(names, _) => names.contains_key(key),
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

    /// The tensor `key` with exactly `shape`, in `dtype` (norm scales and biases that
    /// diffusers keeps in f32).
    pub fn get_as(&self, key: &str, shape: &[usize], init: Init, dtype: DType) -> Result<Tensor> {
        match &self.source {
            Source::Files(names, files) => {
                let &file = names.get(key).ok_or_else(|| ModelError::MissingWeight {
                    key: key.to_string(),
                    expected: shape.to_vec(),
                })?;
                let (found, _) = files[file].info(key)?;
                if found != shape {
                    return Err(ModelError::WeightShape {
                        key: key.to_string(),
                        expected: shape.to_vec(),
                        found,
                    });
                }
                Ok(files[file].load(key, &self.device, Some(dtype))?)
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
