//! The bytes of a snapshot file: a safetensors file whose tensors are the session's
//! saved tensors and whose `__metadata__` carries, as strings,
//!
//! - `format`: `headroom.session`, and `version`: [`FORMAT_VERSION`];
//! - `meta`: JSON, the identity of what the session ran on and where it stands;
//! - `fields`: JSON, every saved field by dotted name;
//! - `checksum`: `sha256:` and the hex digest of, in order, the `meta` string, a zero
//!   byte, the `fields` string, a zero byte, then for each tensor in name order its
//!   name, a zero byte, its dtype name, a zero byte, its shape as little-endian u64s and
//!   its bytes.
//!
//! So Python reads one with `safetensors.safe_open` (or `json` on the header) and can
//! check the digest with `hashlib`. A file is written whole under a temporary name,
//! synced, then renamed over the target, so a reader sees the old file or the new one,
//! never half of one; a failed write removes its temporary file.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use headroom_model::{SavedState, SavedTensor};
use headroom_tensor::io::safetensors::{our_dtype, their_dtype};
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use sha2::{Digest, Sha256};

use crate::error::{EngineError, Result, SnapshotFault};

/// What the `format` metadata says.
pub const MAGIC: &str = "headroom.session";
/// The version of the snapshot format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// File name extension of a snapshot.
pub const EXTENSION: &str = "hrsnap";

fn corrupt(reason: impl Into<String>) -> EngineError {
    EngineError::snapshot(SnapshotFault::Corrupt, reason)
}

fn checksum(meta: &str, fields: &str, state: &SavedState) -> String {
    let mut h = Sha256::new();
    h.update(meta.as_bytes());
    h.update([0]);
    h.update(fields.as_bytes());
    h.update([0]);
    for (name, t) in &state.tensors {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(t.dtype.name().as_bytes());
        h.update([0]);
        for d in &t.shape {
            h.update((*d as u64).to_le_bytes());
        }
        h.update(&t.bytes);
    }
    let digest = h.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The snapshot's bytes: `state`'s tensors with `meta` and the fields in the metadata.
pub(crate) fn encode(meta: &serde_json::Value, state: &SavedState) -> Result<Vec<u8>> {
    let meta = meta.to_string();
    let fields = serde_json::to_string(&state.fields)
        .map_err(|e| corrupt(format!("the fields do not serialise: {e}")))?;
    let mut info = HashMap::new();
    info.insert("format".to_string(), MAGIC.to_string());
    info.insert("version".to_string(), FORMAT_VERSION.to_string());
    info.insert("checksum".to_string(), checksum(&meta, &fields, state));
    info.insert("meta".to_string(), meta);
    info.insert("fields".to_string(), fields);
    let views = state
        .tensors
        .iter()
        .map(|(name, t)| {
            TensorView::new(their_dtype(t.dtype), t.shape.clone(), &t.bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| corrupt(format!("tensor {name:?}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, Some(info)).map_err(|e| corrupt(e.to_string()))
}

/// Refuses a buffer shorter than its safetensors header declares, saying by how much.
fn check_length(bytes: &[u8]) -> Result<()> {
    let truncated = |reason: String| EngineError::snapshot(SnapshotFault::Truncated, reason);
    let Some(len) = bytes.get(..8) else {
        return Err(truncated(format!(
            "{} bytes: shorter than the 8-byte header length",
            bytes.len()
        )));
    };
    let n = u64::from_le_bytes(len.try_into().unwrap_or([0; 8]));
    let header_end = n
        .checked_add(8)
        .filter(|&e| e <= 100 << 20)
        .ok_or_else(|| corrupt(format!("a header of {n} bytes is not a snapshot's")))?
        as usize;
    let Some(header) = bytes.get(8..header_end) else {
        return Err(truncated(format!(
            "{} bytes: the header alone declares {header_end}",
            bytes.len()
        )));
    };
    let header: serde_json::Value = serde_json::from_slice(header)
        .map_err(|e| corrupt(format!("the header is not JSON: {e}")))?;
    let data_end = header
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(_, t)| t.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0) as usize;
    let want = header_end.saturating_add(data_end);
    if bytes.len() < want {
        return Err(truncated(format!(
            "{} bytes where the header declares {want}: the file was cut short",
            bytes.len()
        )));
    }
    Ok(())
}

/// The meta JSON and saved state of a snapshot's bytes, after its format, version and
/// checksum are checked (before anything is allocated).
pub(crate) fn decode(bytes: &[u8]) -> Result<(serde_json::Value, SavedState)> {
    check_length(bytes)?;
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| corrupt(format!("not a safetensors file: {e}")))?;
    let (_, header) = SafeTensors::read_metadata(bytes)
        .map_err(|e| corrupt(format!("not a safetensors file: {e}")))?;
    let info = header
        .metadata()
        .clone()
        .ok_or_else(|| corrupt("no metadata: not a headroom snapshot"))?;
    let get = |key: &str| {
        info.get(key).ok_or_else(|| {
            corrupt(format!(
                "no {key:?} in the metadata: not a headroom snapshot"
            ))
        })
    };
    if get("format")? != MAGIC {
        return Err(corrupt(format!(
            "format {:?} is not {MAGIC:?}",
            get("format")?
        )));
    }
    let version = get("version")?;
    if version != &FORMAT_VERSION.to_string() {
        return Err(EngineError::snapshot(
            SnapshotFault::Version,
            format!("written in snapshot format version {version}; this build reads version {FORMAT_VERSION}"),
        ));
    }
    let (meta_text, fields_text) = (get("meta")?, get("fields")?);
    let fields: BTreeMap<String, serde_json::Value> = serde_json::from_str(fields_text)
        .map_err(|e| corrupt(format!("the fields are not JSON: {e}")))?;
    let mut state = SavedState {
        tensors: BTreeMap::new(),
        fields,
    };
    for (name, view) in st.tensors() {
        let dtype = our_dtype(view.dtype())
            .ok_or_else(|| corrupt(format!("tensor {name:?} has dtype {:?}", view.dtype())))?;
        state.tensors.insert(
            name,
            SavedTensor {
                dtype,
                shape: view.shape().to_vec(),
                bytes: view.data().to_vec(),
            },
        );
    }
    let want = get("checksum")?;
    let got = checksum(meta_text, fields_text, &state);
    if &got != want {
        return Err(corrupt(format!(
            "the checksum does not match: the header says {want}, the bytes give {got}"
        )));
    }
    let meta = serde_json::from_str(meta_text)
        .map_err(|e| corrupt(format!("the meta is not JSON: {e}")))?;
    Ok((meta, state))
}

/// Writes `bytes` to `path` atomically: a temporary file beside it, written whole and
/// synced, then renamed over `path` (and the folder synced). On any failure the
/// temporary file is removed and `path` is as it was.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |what: &str, e: std::io::Error| {
        EngineError::snapshot(SnapshotFault::Io, format!("{what} {}: {e}", path.display()))
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io("no file name in", std::io::ErrorKind::InvalidInput.into()))?;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename is durable once the folder is synced (best effort where a folder
        // cannot be opened for it).
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io("cannot write", e));
    }
    Ok(())
}

/// Reads a snapshot file's bytes, naming the path when it cannot.
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        EngineError::snapshot(
            SnapshotFault::Io,
            format!("cannot read {}: {e}", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_tensor::DType;

    fn state() -> SavedState {
        let mut s = SavedState::default();
        s.tensors.insert(
            "kv.k.0".into(),
            SavedTensor {
                dtype: DType::F32,
                shape: vec![2, 2],
                bytes: (0u8..16).collect(),
            },
        );
        s.fields.insert("next_block".into(), serde_json::json!(3));
        s
    }

    #[test]
    fn bytes_round_trip_and_every_fault_is_named() {
        let meta = serde_json::json!({"chunk": 2});
        let bytes = encode(&meta, &state()).unwrap();
        let (m, s) = decode(&bytes).unwrap();
        assert_eq!(m, meta);
        assert_eq!(s, state());
        let fault = |b: &[u8]| decode(b).unwrap_err().snapshot_fault().unwrap();
        // Cut anywhere: truncated (or, inside the 8 bytes, too).
        for cut in [0, 4, 20, bytes.len() - 1] {
            assert_eq!(
                fault(&bytes[..cut]),
                SnapshotFault::Truncated,
                "cut at {cut}"
            );
        }
        // One bit of tensor data flipped: the checksum catches it.
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(fault(&flipped), SnapshotFault::Corrupt);
        // Garbage.
        assert_eq!(fault(&[7u8; 64]), SnapshotFault::Corrupt);
    }

    #[test]
    fn a_failed_atomic_write_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-folder").join("chunk-0.hrsnap");
        assert!(write_atomic(&path, b"x").is_err());
        let path = dir.path().join("chunk-0.hrsnap");
        write_atomic(&path, b"first").unwrap();
        write_atomic(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left");
    }
}
