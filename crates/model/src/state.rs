//! A session's saved state: named tensors (as host bytes) and named JSON fields, written
//! and read by each stateful part next to where it lives (the KV pages, a decoder's
//! streaming state, the image encoder's cache, the camera).
//!
//! The bytes are plain host memory, outside every allocator: a state saved from a
//! device holds nothing of it, which is what lets a parked session's device bytes go to
//! zero. What a file of it looks like (safetensors with JSON metadata, a checksum, the
//! identity of what it ran on) is the engine's business; this module only names things.
//! Names are dotted paths (`kv.k.3`, `decoder.slot.12`): a part writes under the scope
//! it is given, so two parts never collide.

use std::collections::BTreeMap;

use headroom_tensor::{DType, Device, Tensor};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{ModelError, Result};

/// One saved tensor: its dtype, shape and little-endian row-major bytes on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedTensor {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// `numel · dtype.size()` bytes, row-major.
    pub bytes: Vec<u8>,
}

impl SavedTensor {
    /// The tensor's values copied to the host in one transfer (made dense first).
    pub fn of(t: &Tensor) -> Result<Self> {
        let dense = if t.is_contiguous() {
            t.clone()
        } else {
            t.contiguous()?
        };
        let host = dense.to_host()?;
        let bytes = host
            .host_bytes()
            .ok_or_else(|| ModelError::input("state", "a tensor on a meta device has no bytes"))?
            .to_vec();
        Ok(Self {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            bytes,
        })
    }

    /// The tensor on `device`, in one transfer.
    pub fn load(&self, device: &Device) -> Result<Tensor> {
        Ok(Tensor::from_bytes(
            &self.bytes,
            &self.shape,
            self.dtype,
            device,
        )?)
    }
}

/// Named tensors and named JSON fields: everything a session's future depends on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SavedState {
    /// Tensors by dotted name.
    pub tensors: BTreeMap<String, SavedTensor>,
    /// JSON fields by dotted name.
    pub fields: BTreeMap<String, serde_json::Value>,
}

impl SavedState {
    /// Bytes of all tensors.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.values().map(|t| t.bytes.len() as u64).sum()
    }

    /// Bytes of the tensors whose names start with `prefix` followed by a dot.
    pub fn bytes_under(&self, prefix: &str) -> u64 {
        let dotted = format!("{prefix}.");
        self.tensors
            .iter()
            .filter(|(name, _)| name.starts_with(&dotted))
            .map(|(_, t)| t.bytes.len() as u64)
            .sum()
    }

    /// A writer at the top scope.
    pub fn writer(&mut self) -> StateWriter<'_> {
        StateWriter {
            state: self,
            scope: String::new(),
        }
    }

    /// A reader at the top scope that loads tensors onto `device`.
    pub fn reader<'a>(&'a self, device: &'a Device) -> StateReader<'a> {
        StateReader {
            state: self,
            scope: String::new(),
            device,
        }
    }
}

fn join(scope: &str, name: &str) -> String {
    if scope.is_empty() {
        name.to_string()
    } else {
        format!("{scope}.{name}")
    }
}

/// Writes named tensors and fields under one scope of a [`SavedState`].
#[derive(Debug)]
pub struct StateWriter<'a> {
    state: &'a mut SavedState,
    scope: String,
}

impl StateWriter<'_> {
    /// A writer under `name` inside this one's scope.
    pub fn scope(&mut self, name: &str) -> StateWriter<'_> {
        StateWriter {
            scope: join(&self.scope, name),
            state: self.state,
        }
    }

    /// Saves tensor `t` as `name` (its values copied to the host).
    pub fn tensor(&mut self, name: &str, t: &Tensor) -> Result<()> {
        self.state
            .tensors
            .insert(join(&self.scope, name), SavedTensor::of(t)?);
        Ok(())
    }

    /// Saves host bytes already in saved form as `name`.
    pub fn saved(&mut self, name: &str, t: SavedTensor) {
        self.state.tensors.insert(join(&self.scope, name), t);
    }

    /// Saves an optional tensor: present under `name`, absent when `None`.
    pub fn maybe_tensor(&mut self, name: &str, t: Option<&Tensor>) -> Result<()> {
        match t {
            Some(t) => self.tensor(name, t),
            None => Ok(()),
        }
    }

    /// Saves a list of optional tensors (a streaming cache's slots): which are present
    /// under `name`, and each present one as `name.i`.
    pub fn slots(&mut self, name: &str, slots: &[Option<Tensor>]) -> Result<()> {
        self.field(name, &slots.iter().map(Option::is_some).collect::<Vec<_>>())?;
        for (i, slot) in slots.iter().enumerate() {
            self.maybe_tensor(&format!("{name}.{i}"), slot.as_ref())?;
        }
        Ok(())
    }

    /// Saves field `name` as JSON.
    pub fn field<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> Result<()> {
        let value = serde_json::to_value(value).map_err(|e| {
            ModelError::input("state", format!("field {name:?} does not serialise: {e}"))
        })?;
        self.state.fields.insert(join(&self.scope, name), value);
        Ok(())
    }
}

/// Reads named tensors and fields under one scope of a [`SavedState`]; a missing or
/// mistyped name is an error that names it.
#[derive(Debug, Clone)]
pub struct StateReader<'a> {
    state: &'a SavedState,
    scope: String,
    device: &'a Device,
}

impl<'a> StateReader<'a> {
    /// A reader under `name` inside this one's scope.
    pub fn scope(&self, name: &str) -> StateReader<'a> {
        StateReader {
            state: self.state,
            scope: join(&self.scope, name),
            device: self.device,
        }
    }

    /// The device tensors are loaded onto.
    pub fn device(&self) -> &'a Device {
        self.device
    }

    /// The saved tensor `name`, as stored.
    pub fn saved(&self, name: &str) -> Result<&'a SavedTensor> {
        let key = join(&self.scope, name);
        self.state
            .tensors
            .get(&key)
            .ok_or_else(|| ModelError::input("snapshot", format!("no tensor {key:?}")))
    }

    /// Whether tensor `name` was saved.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.state.tensors.contains_key(&join(&self.scope, name))
    }

    /// Tensor `name` loaded onto the reader's device.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        self.saved(name)?.load(self.device)
    }

    /// Tensor `name` if it was saved.
    pub fn maybe_tensor(&self, name: &str) -> Result<Option<Tensor>> {
        if self.has_tensor(name) {
            self.tensor(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The slots [`StateWriter::slots`] saved as `name`, loaded.
    pub fn slots(&self, name: &str) -> Result<Vec<Option<Tensor>>> {
        let present: Vec<bool> = self.field(name)?;
        present
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                if p {
                    self.tensor(&format!("{name}.{i}")).map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect()
    }

    /// Field `name`, read as `T`.
    pub fn field<T: DeserializeOwned>(&self, name: &str) -> Result<T> {
        let key = join(&self.scope, name);
        let value = self
            .state
            .fields
            .get(&key)
            .ok_or_else(|| ModelError::input("snapshot", format!("no field {key:?}")))?;
        serde_json::from_value(value.clone()).map_err(|e| {
            ModelError::input(
                "snapshot",
                format!("field {key:?} is not what it should be: {e}"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_tensors_and_fields_read_back_as_written() {
        let dev = Device::cpu().unwrap();
        let t = Tensor::from_slice(&[1.0f32, -2.5, 3.25, 0.0, 7.0, 8.0], &[2, 3], &dev).unwrap();
        let mut state = SavedState::default();
        {
            let mut w = state.writer();
            let mut kv = w.scope("kv");
            kv.tensor("k.0", &t.permute(&[1, 0]).unwrap()).unwrap();
            kv.field("frames", &vec![0usize, 1, 2]).unwrap();
            w.field("pose", &[[0.1f64, 1.0 / 3.0], [f64::MIN_POSITIVE, -0.0]])
                .unwrap();
        }
        let r = state.reader(&dev);
        let kv = r.scope("kv");
        let k = kv.tensor("k.0").unwrap();
        assert_eq!(k.shape(), &[3, 2]);
        assert_eq!(
            k.to_vec::<f32>().unwrap(),
            t.permute(&[1, 0]).unwrap().to_vec::<f32>().unwrap()
        );
        assert_eq!(kv.field::<Vec<usize>>("frames").unwrap(), vec![0, 1, 2]);
        // f64 fields round-trip exactly through JSON text.
        let text = serde_json::to_string(&state.fields).unwrap();
        let back: BTreeMap<String, serde_json::Value> = serde_json::from_str(&text).unwrap();
        let pose: [[f64; 2]; 2] = serde_json::from_value(back["pose"].clone()).unwrap();
        assert_eq!(pose[0][1].to_bits(), (1.0f64 / 3.0).to_bits());
        assert_eq!(pose[1][0].to_bits(), f64::MIN_POSITIVE.to_bits());
        let missing = r.tensor("kv.v.0").unwrap_err().to_string();
        assert!(missing.contains("kv.v.0"), "{missing}");
        assert_eq!(state.bytes_under("kv"), 24);
    }
}
