//! Recognising a TAEHV file by its keys and shapes, and opening its decoder's weights.
//!
//! A file is TAEHV's when its decoder keys are `decoder.{index}.…` (the Wan VAE's are
//! named, `decoder.conv_in…` or `decoder.conv1…`). The latent channels, widths and patch
//! come from the conv shapes; the `encoder.…` keys are ignored. The `_super` files put a
//! 1×1 conv at index 0 and `SuperMemBlock`s after it, and are refused by name.

use std::collections::BTreeMap;
use std::path::Path;

use headroom_tensor::{DType, Device, Tensor};

use super::TinyConfig;
use crate::checkpoint::{io_err, Tensors};
use crate::error::{ModelError, Result};
use crate::weights::{Init, WeightStore};

/// Whether tensor names look like a TAEHV checkpoint (`decoder.{digit}…` keys).
pub fn is_taehv<'a>(mut names: impl Iterator<Item = &'a String>) -> bool {
    names.any(|n| {
        n.strip_prefix("decoder.")
            .and_then(|rest| rest.chars().next())
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// Whether `path` is a checkpoint file whose tensor names are TAEHV's (false for
/// folders, unreadable files and every other layout).
pub fn is_taehv_file(path: &Path) -> bool {
    path.is_file() && Tensors::single(path).is_ok_and(|t| is_taehv(t.names.keys()))
}

fn dims<'a>(shapes: &'a BTreeMap<String, Vec<usize>>, key: &str) -> Result<&'a [usize]> {
    shapes.get(key).map(Vec::as_slice).ok_or_else(|| {
        ModelError::input(
            "tiny decoder",
            format!("not a TAEHV decoder: the file has no {key:?}"),
        )
    })
}

fn conv3x3(shapes: &BTreeMap<String, Vec<usize>>, key: &str) -> Result<(usize, usize)> {
    match *dims(shapes, key)? {
        [cout, cin, 3, 3] if cout > 0 && cin > 0 => Ok((cout, cin)),
        ref other => Err(ModelError::WeightShape {
            key: key.to_string(),
            expected: vec![0, 0, 3, 3],
            found: other.to_vec(),
        }),
    }
}

/// The decoder's shapes from a file's tensor shapes (stored names).
pub fn recognise(shapes: &BTreeMap<String, Vec<usize>>) -> Result<TinyConfig> {
    if !is_taehv(shapes.keys()) {
        return Err(ModelError::input(
            "tiny decoder",
            "not a TAEHV file: no decoder.{index}.… tensors",
        ));
    }
    if shapes.contains_key("decoder.0.weight") || shapes.contains_key("decoder.1.conv.0.weight") {
        return Err(ModelError::input(
            "tiny decoder",
            "a TAEHV _super decoder (SuperMemBlock layers) is not supported: use taew2_1 or taew2_2",
        ));
    }
    let (n0, latent_channels) = conv3x3(shapes, "decoder.1.weight")?;
    let mut widths = [n0, 0, 0, 0];
    for (k, key) in ["decoder.8.weight", "decoder.14.weight", "decoder.20.weight"]
        .iter()
        .enumerate()
    {
        let (cout, cin) = conv3x3(shapes, key)?;
        if cin != widths[k] {
            return Err(ModelError::WeightShape {
                key: key.to_string(),
                expected: vec![cout, widths[k], 3, 3],
                found: vec![cout, cin, 3, 3],
            });
        }
        widths[k + 1] = cout;
    }
    let (out, cin) = conv3x3(shapes, "decoder.22.weight")?;
    let patch = (1..=4).find(|p| 3 * p * p == out).ok_or_else(|| {
        ModelError::input(
            "tiny decoder",
            format!("decoder.22.weight has {out} output channels; a TAEHV decoder has 3·p² (3, 12, 27 or 48)"),
        )
    })?;
    if cin != widths[3] {
        return Err(ModelError::WeightShape {
            key: "decoder.22.weight".into(),
            expected: vec![out, widths[3], 3, 3],
            found: vec![out, cin, 3, 3],
        });
    }
    let config = TinyConfig {
        latent_channels,
        patch,
        widths,
        time_strides: TinyConfig::taew2_1().time_strides,
    };
    config.validate()?;
    Ok(config)
}

/// The config and a store over the decoder's tensors of the TAEHV file at `path`.
pub(super) fn open(
    path: &Path,
    device: &Device,
    dtype: DType,
) -> Result<(TinyConfig, WeightStore)> {
    if !matches!(dtype, DType::F32 | DType::BF16) {
        return Err(ModelError::input(
            "tiny decoder",
            format!("weights load in f32 or bf16, not {dtype:?}"),
        ));
    }
    if !path.is_file() {
        return Err(io_err(path, "no such file"));
    }
    let tensors = Tensors::single(path)?;
    let mut shapes = BTreeMap::new();
    for (name, &file) in &tensors.names {
        if name.starts_with("decoder.") {
            shapes.insert(name.clone(), tensors.files[file].info(name)?.0);
        }
    }
    let config = recognise(&shapes).map_err(|e| io_err(path, e))?;
    let store = WeightStore::renamed(
        tensors,
        |k| k.starts_with("decoder.").then(|| k.to_string()),
        "TAEHV",
        device,
        dtype,
    );
    Ok((config, store))
}

/// `TGrow`'s 1×1 weight for `stride` frames of width `n`: `[n·stride, n, 1, 1]`. A file
/// trained with more frames keeps more rows; as `taehv.py` does, the last `n·stride`
/// (the last frames') are taken.
pub(super) fn grow_weight(w: &WeightStore, key: &str, n: usize, stride: usize) -> Result<Tensor> {
    let want = [n * stride, n, 1, 1];
    let Some(found) = w.shape_of(key) else {
        return w.get(key, &want, Init::FanIn);
    };
    let rows = found.first().copied().unwrap_or(0);
    if found.len() != 4 || found[1..] != [n, 1, 1] || rows < n * stride || rows % n != 0 {
        return Err(ModelError::WeightShape {
            key: key.to_string(),
            expected: want.to_vec(),
            found,
        });
    }
    let whole = w.get(key, &found, Init::FanIn)?;
    if rows == n * stride {
        return Ok(whole);
    }
    Ok(whole
        .narrow(0, rows - n * stride, n * stride)?
        .copy_as(w.dtype())?)
}
