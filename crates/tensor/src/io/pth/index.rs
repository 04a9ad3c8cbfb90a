//! The checked tensor index of a PyTorch checkpoint (`.pth` / `.pt` from `torch.save`),
//! read without running it.
//!
//! A checkpoint is a stored zip archive (see [`super::zip`]) holding `<root>/data.pkl`,
//! a protocol-2 pickle of the saved object, and one entry `<root>/data/<key>` per
//! storage. Tensors appear in the pickle as calls of `torch._utils._rebuild_tensor_v2`
//! (or `_rebuild_parameter` around one) on a persistent id
//! `('storage', torch.<T>Storage, key, location, numel)`. This module reads the pickle
//! with [`from_pickle_restricted`] and an allow-list of exactly those globals plus
//! `collections.OrderedDict`, so a file that asks for anything else (`os.system`,
//! `builtins.eval`, …) is refused by name before any tensor is looked at, and nothing
//! in the file is ever executed. It then walks the (nested) dicts and returns one
//! [`PthTensor`] per tensor, each with the byte range of its data in the file, checked:
//! the storage entry exists, holds `numel` elements, and the view (offset, shape,
//! strides) stays inside it. The bytes themselves are read by the caller, typically from
//! a memory map, straight into its allocator.
//!
//! Nested dicts flatten to dotted names (`{"generator_ema": {"blocks.0.w": t}}` →
//! `generator_ema.blocks.0.w`); values that are not tensors or dicts (step counters,
//! config strings) are skipped.

use std::collections::BTreeMap;
use std::ops::Range;

use headroom_mem::pickle::{from_pickle_restricted, PickleError, PickleValue};

use super::zip::{stored_entries, ZipEntry, ZipError};

/// Element types of torch storages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageDtype {
    /// `torch.FloatStorage`.
    F32,
    /// `torch.DoubleStorage`.
    F64,
    /// `torch.HalfStorage`.
    F16,
    /// `torch.BFloat16Storage`.
    BF16,
    /// `torch.LongStorage`.
    I64,
    /// `torch.IntStorage`.
    I32,
    /// `torch.ByteStorage`.
    U8,
    /// `torch.BoolStorage`.
    Bool,
}

impl StorageDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            StorageDtype::F64 | StorageDtype::I64 => 8,
            StorageDtype::F32 | StorageDtype::I32 => 4,
            StorageDtype::F16 | StorageDtype::BF16 => 2,
            StorageDtype::U8 | StorageDtype::Bool => 1,
        }
    }

    fn from_class(name: &str) -> Option<Self> {
        Some(match name {
            "FloatStorage" => StorageDtype::F32,
            "DoubleStorage" => StorageDtype::F64,
            "HalfStorage" => StorageDtype::F16,
            "BFloat16Storage" => StorageDtype::BF16,
            "LongStorage" => StorageDtype::I64,
            "IntStorage" => StorageDtype::I32,
            "ByteStorage" => StorageDtype::U8,
            "BoolStorage" => StorageDtype::Bool,
            _ => return None,
        })
    }
}

const STORAGES: [&str; 8] = [
    "FloatStorage",
    "DoubleStorage",
    "HalfStorage",
    "BFloat16Storage",
    "LongStorage",
    "IntStorage",
    "ByteStorage",
    "BoolStorage",
];

/// The globals a checkpoint may name: tensor rebuilders, storage classes, OrderedDict.
pub fn allowed_globals() -> Vec<(&'static str, &'static str)> {
    let mut list = vec![
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_parameter"),
        ("collections", "OrderedDict"),
    ];
    list.extend(STORAGES.iter().map(|s| ("torch", *s)));
    list
}

/// One tensor of a checkpoint: its element type, shape, and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PthTensor {
    /// Storage element type.
    pub dtype: StorageDtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Byte range in the file of the tensor's elements (row-major, contiguous).
    pub data: Range<usize>,
}

/// Why a checkpoint was refused; the message names the tensor, entry or global.
#[derive(Debug, thiserror::Error)]
pub enum PthError {
    /// The archive itself is broken or holds a compressed entry.
    #[error(transparent)]
    Zip(#[from] ZipError),
    /// The pickle is malformed or names a global off the allow-list.
    #[error("data.pkl: {0}")]
    Pickle(#[from] PickleError),
    /// The archive or pickle is well-formed but not a torch checkpoint as expected.
    #[error("{0}")]
    Layout(String),
    /// A tensor's record is inconsistent with its storage.
    #[error("tensor {name:?}: {reason}")]
    Tensor {
        /// The tensor's (dotted) name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

fn layout(reason: impl Into<String>) -> PthError {
    PthError::Layout(reason.into())
}

/// Reads the checkpoint `file` (the whole file's bytes): every tensor by dotted name.
pub fn read_pth(file: &[u8]) -> Result<BTreeMap<String, PthTensor>, PthError> {
    let entries = stored_entries(file)?;
    let pickle = entries
        .iter()
        .find(|e| e.name.ends_with("/data.pkl") || e.name == "data.pkl")
        .ok_or_else(|| {
            layout("no data.pkl in the archive: not a torch.save checkpoint (legacy non-zip .pth files are not supported)")
        })?;
    let root = pickle.name.strip_suffix("data.pkl").unwrap_or_default();
    if let Some(order) = entries
        .iter()
        .find(|e| e.name == format!("{root}byteorder"))
    {
        if &file[order.data.clone()] != b"little" {
            return Err(layout(
                "byteorder is not \"little\": big-endian checkpoints are not supported",
            ));
        }
    }
    let storages: BTreeMap<&str, &ZipEntry> = entries
        .iter()
        .filter_map(|e| Some((e.name.strip_prefix(root)?.strip_prefix("data/")?, e)))
        .collect();
    let value = from_pickle_restricted(&file[pickle.data.clone()], &allowed_globals())?;
    let mut out = BTreeMap::new();
    walk(&value, String::new(), &storages, &mut out, 0)?;
    Ok(out)
}

fn walk(
    value: &PickleValue,
    name: String,
    storages: &BTreeMap<&str, &ZipEntry>,
    out: &mut BTreeMap<String, PthTensor>,
    depth: usize,
) -> Result<(), PthError> {
    if depth > 16 {
        return Err(layout(format!(
            "{name:?}: dicts nest deeper than 16 levels"
        )));
    }
    match value {
        PickleValue::Dict(pairs) => {
            for (k, v) in pairs {
                let key = match k {
                    PickleValue::Str(s) => s.clone(),
                    PickleValue::Int(i) => i.to_string(),
                    _ => continue,
                };
                let child = if name.is_empty() {
                    key
                } else {
                    format!("{name}.{key}")
                };
                walk(v, child, storages, out, depth + 1)?;
            }
        }
        PickleValue::Call { .. } => {
            let tensor = rebuild(value, &name, storages)?;
            out.insert(name, tensor);
        }
        // Numbers, strings, lists of them: metadata a loader does not need.
        _ => {}
    }
    Ok(())
}

fn global_of(value: &PickleValue) -> Option<(&str, &str)> {
    match value {
        PickleValue::Global { module, name } => Some((module, name)),
        _ => None,
    }
}

fn usizes(value: &PickleValue, name: &str, field: &str) -> Result<Vec<usize>, PthError> {
    let bad = || PthError::Tensor {
        name: name.to_string(),
        reason: format!("{field} must be a tuple of non-negative integers"),
    };
    value
        .as_list()
        .ok_or_else(bad)?
        .iter()
        .map(|v| {
            v.as_int()
                .and_then(|i| usize::try_from(i).ok())
                .ok_or_else(bad)
        })
        .collect()
}

/// Checks one `_rebuild_tensor_v2(storage, offset, size, stride, …)` record against its
/// storage entry.
fn rebuild(
    value: &PickleValue,
    name: &str,
    storages: &BTreeMap<&str, &ZipEntry>,
) -> Result<PthTensor, PthError> {
    let err = |reason: String| PthError::Tensor {
        name: name.to_string(),
        reason,
    };
    let PickleValue::Call { callable, args } = value else {
        return Err(err("is not a tensor".into()));
    };
    let args = args.as_list().unwrap_or_default();
    match global_of(callable) {
        Some(("torch._utils", "_rebuild_parameter")) => {
            let inner = args
                .first()
                .ok_or_else(|| err("_rebuild_parameter without a tensor".into()))?;
            return rebuild(inner, name, storages);
        }
        Some(("torch._utils", "_rebuild_tensor_v2")) => {}
        Some((m, n)) => return Err(err(format!("{m}.{n}(…) does not build a tensor"))),
        None => return Err(err("calls something that is not a global".into())),
    }
    let [storage, offset, size, stride, ..] = args else {
        return Err(err(format!(
            "_rebuild_tensor_v2 takes (storage, offset, size, stride, …), got {} arguments",
            args.len()
        )));
    };
    let PickleValue::Persistent(id) = storage else {
        return Err(err("storage argument is not a persistent id".into()));
    };
    let id = id.as_list().unwrap_or_default();
    let [tag, class, key, _location, numel] = id else {
        return Err(err(
            "persistent id must be ('storage', torch.<T>Storage, key, location, numel)".into(),
        ));
    };
    if tag.as_str() != Some("storage") {
        return Err(err(format!("persistent id kind {tag:?} is not 'storage'")));
    }
    let dtype = global_of(class)
        .and_then(|(_, n)| StorageDtype::from_class(n))
        .ok_or_else(|| {
            err(format!(
                "storage class {class:?} is not a torch storage type"
            ))
        })?;
    let key = key
        .as_str()
        .ok_or_else(|| err("storage key is not a string".into()))?;
    let numel = numel
        .as_int()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| err("storage numel is not a non-negative integer".into()))?;
    let entry = storages
        .get(key)
        .ok_or_else(|| err(format!("storage data/{key} is not in the archive")))?;
    let storage_bytes = numel
        .checked_mul(dtype.size())
        .ok_or_else(|| err(format!("storage numel {numel} overflows")))?;
    if entry.data.len() < storage_bytes {
        return Err(err(format!(
            "storage data/{key} holds {} bytes, but its record says {numel} × {} bytes (truncated file?)",
            entry.data.len(),
            dtype.size()
        )));
    }
    let offset = offset
        .as_int()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| err("storage offset is not a non-negative integer".into()))?;
    let shape = usizes(size, name, "size")?;
    let stride = usizes(stride, name, "stride")?;
    if stride.len() != shape.len() {
        return Err(err(format!(
            "size {shape:?} and stride {stride:?} differ in length"
        )));
    }
    let count = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| err(format!("size {shape:?} overflows")))?;
    // Contiguous row-major strides only: a state dict's tensors are; a strided view
    // would need a gather this reader does not do.
    let mut expect = 1usize;
    for (d, (&dim, &st)) in shape.iter().zip(&stride).enumerate().rev() {
        if dim > 1 && st != expect {
            return Err(err(format!(
                "stride {stride:?} of size {shape:?} is not contiguous row-major (dimension {d}); save it with .contiguous()"
            )));
        }
        expect = expect.saturating_mul(dim);
    }
    let end = offset
        .checked_add(count)
        .filter(|&e| e <= numel)
        .ok_or_else(|| {
            err(format!(
                "offset {offset} + {count} elements runs past the end of its storage data/{key} ({numel} elements)"
            ))
        })?;
    let start = entry.data.start + offset * dtype.size();
    let stop = entry.data.start + end * dtype.size();
    Ok(PthTensor {
        dtype,
        shape,
        data: start..stop,
    })
}

#[cfg(test)]
mod tests {
    use super::super::zip::tests::stored_zip;
    use super::*;
    use headroom_mem::pickle::to_pickle;

    fn global(module: &str, name: &str) -> PickleValue {
        PickleValue::Global {
            module: module.into(),
            name: name.into(),
        }
    }

    fn tensor(key: &str, numel: i64, offset: i64, size: &[i64]) -> PickleValue {
        let mut stride = vec![1i64; size.len()];
        for d in (0..size.len().saturating_sub(1)).rev() {
            stride[d] = stride[d + 1] * size[d + 1];
        }
        let ints = |v: &[i64]| PickleValue::Tuple(v.iter().map(|&i| PickleValue::Int(i)).collect());
        PickleValue::Call {
            callable: Box::new(global("torch._utils", "_rebuild_tensor_v2")),
            args: Box::new(PickleValue::Tuple(vec![
                PickleValue::Persistent(Box::new(PickleValue::Tuple(vec![
                    PickleValue::str("storage"),
                    global("torch", "FloatStorage"),
                    PickleValue::str(key),
                    PickleValue::str("cpu"),
                    PickleValue::Int(numel),
                ]))),
                PickleValue::Int(offset),
                ints(size),
                ints(&stride),
                PickleValue::Bool(false),
                PickleValue::Dict(Vec::new()),
            ])),
        }
    }

    fn checkpoint(value: &PickleValue, storage: &[u8]) -> Vec<u8> {
        stored_zip(
            &[
                ("archive/data.pkl", &to_pickle(value)),
                ("archive/byteorder", b"little"),
                ("archive/data/0", storage),
            ],
            0,
        )
    }

    #[test]
    fn nested_state_dicts_flatten_to_dotted_names_with_checked_ranges() {
        let floats: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let value = PickleValue::dict([
            (
                "generator_ema",
                PickleValue::dict([("model.w", tensor("0", 6, 2, &[2, 2]))]),
            ),
            ("step", PickleValue::Int(10)),
        ]);
        let file = checkpoint(&value, &floats);
        let tensors = read_pth(&file).unwrap();
        let t = &tensors["generator_ema.model.w"];
        assert_eq!((t.dtype, t.shape.clone()), (StorageDtype::F32, vec![2, 2]));
        assert_eq!(&file[t.data.clone()], &floats[8..24]);
        assert_eq!(tensors.len(), 1);
    }

    #[test]
    fn a_pickle_calling_os_system_is_refused_naming_the_global() {
        let evil = PickleValue::Call {
            callable: Box::new(global("os", "system")),
            args: Box::new(PickleValue::Tuple(vec![PickleValue::str("echo pwned")])),
        };
        let file = checkpoint(&PickleValue::dict([("w", evil)]), &[]);
        let err = read_pth(&file).unwrap_err().to_string();
        assert!(
            err.contains("os.system") && err.contains("not allowed"),
            "{err}"
        );
    }

    #[test]
    fn a_storage_offset_past_the_end_is_refused_naming_the_tensor() {
        let floats = [0u8; 16];
        let file = checkpoint(
            &PickleValue::dict([("blocks.0.w", tensor("0", 4, 3, &[2]))]),
            &floats,
        );
        let err = read_pth(&file).unwrap_err().to_string();
        assert!(
            err.contains("\"blocks.0.w\"") && err.contains("past the end"),
            "{err}"
        );
        // A record claiming more elements than the entry holds.
        let file = checkpoint(
            &PickleValue::dict([("w", tensor("0", 8, 0, &[8]))]),
            &floats,
        );
        let err = read_pth(&file).unwrap_err().to_string();
        assert!(err.contains("holds 16 bytes"), "{err}");
    }

    #[test]
    fn a_compressed_checkpoint_entry_is_refused() {
        let file = stored_zip(&[("archive/data.pkl", b"\x80\x02}.")], 8);
        let err = read_pth(&file).unwrap_err().to_string();
        assert!(err.contains("compressed"), "{err}");
    }
}
