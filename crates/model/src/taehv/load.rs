//! Recognising a TAEHV file by its keys and shapes, and opening its decoder's weights.
//!
//! A file is TAEHV's when its decoder keys are `decoder.{index}.…` (the Wan VAE's are
//! named, `decoder.conv_in…` or `decoder.conv1…`). The index is the layer's place in
//! `taehv.py`'s `decoder` Sequential, so the last one gives the stage count: an
//! `N`-stage decoder ends in its output conv at `4 + 6·N`. The latent channels, widths and
//! patch come from the conv shapes, each stage's time stride from its `TGrow`'s rows;
//! the `encoder.…` keys are ignored. Files are untrusted: a layout that breaks the rule
//! (a last index off the rule, weights at a parameter-free layer, a `TGrow` whose rows
//! are not a multiple of its width) is refused naming the key. The `_super` files put a
//! 1×1 conv at index 0 and `SuperMemBlock`s after it, and are refused by name.

use std::collections::BTreeMap;
use std::path::Path;

use headroom_tensor::{DType, Device, Tensor};

use super::{last_layer, stage_layer, TinyConfig, MAX_STAGES};
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

/// The layer index of a `decoder.{index}.…` key (`None` for other keys); an index too
/// large to be a number is refused naming the key.
fn layer_index(key: &str) -> Result<Option<usize>> {
    let Some(head) = key
        .strip_prefix("decoder.")
        .and_then(|rest| rest.split('.').next())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_digit()))
    else {
        return Ok(None);
    };
    head.parse().map(Some).map_err(|_| {
        ModelError::config(
            key,
            "the layer index is not a number a TAEHV decoder could have",
        )
    })
}

/// The stage count from the last layer's index: `(last − 4) / 6` where that is whole and
/// 1..=[`MAX_STAGES`].
fn stage_count(key: &str, last: usize) -> Result<usize> {
    let stages = last.checked_sub(4).map_or(0, |d| d / 6);
    if stages > 0 && last_layer(stages) == last {
        if stages <= MAX_STAGES {
            return Ok(stages);
        }
        return Err(ModelError::config(
            key,
            format!(
                "the last layer at decoder.{last} makes {stages} stages; a TAEHV decoder has at most {MAX_STAGES} (its last layer at decoder.{})",
                last_layer(MAX_STAGES)
            ),
        ));
    }
    Err(ModelError::config(
        key,
        format!(
            "the last layer of a TAEHV decoder of N stages is its output conv at decoder.{{4 + 6·N}} \
             ({} for 1 stage, {} for 2, {} for 3, …); this file's last is at {last}",
            last_layer(1),
            last_layer(2),
            last_layer(3),
        ),
    ))
}

/// What parameter-free layer index `i` is in a decoder of `stages` stages, if it is one.
fn parameter_free(i: usize, stages: usize) -> Option<&'static str> {
    match i {
        0 => Some("the input clamp"),
        2 => Some("the first ReLU"),
        i if i + 1 == last_layer(stages) => Some("the last ReLU"),
        i if i >= 3 && (i - 3) % 6 == 3 => Some("an upsample"),
        _ => None,
    }
}

/// A stage's `TGrow` stride from its 1×1 weight `[n·stride, n, 1, 1]`.
fn grow_stride(shapes: &BTreeMap<String, Vec<usize>>, key: &str, n: usize) -> Result<usize> {
    match *dims(shapes, key)? {
        [rows, cin, 1, 1] if cin == n && rows >= n && rows % n == 0 => Ok(rows / n),
        ref other => Err(ModelError::config(
            key,
            format!(
                "shape {other:?}: the TGrow after a stage of width {n} is [{n}·stride, {n}, 1, 1]"
            ),
        )),
    }
}

/// The decoder's shapes from a file's tensor shapes (stored names): the stage count
/// from the last layer's index, the widths from the convs, the time strides from the
/// `TGrow`s.
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
    let mut indexed = Vec::new();
    for key in shapes.keys() {
        if let Some(i) = layer_index(key)? {
            indexed.push((i, key.as_str()));
        }
    }
    // `decoder.1x.…` passes `is_taehv` and has no index.
    let Some(&(last, last_key)) = indexed.iter().max() else {
        return Err(ModelError::input(
            "tiny decoder",
            "not a TAEHV file: no decoder.{index}.… tensors",
        ));
    };
    let stages = stage_count(last_key, last)?;
    if let Some((i, key, what)) = indexed
        .iter()
        .find_map(|&(i, key)| parameter_free(i, stages).map(|what| (i, key, what)))
    {
        return Err(ModelError::config(
            key,
            format!(
                "decoder.{i} is {what} in a TAEHV decoder of {stages} stages, which has no weights"
            ),
        ));
    }
    let (n0, latent_channels) = conv3x3(shapes, "decoder.1.weight")?;
    let mut widths = vec![n0];
    let mut time_strides = Vec::with_capacity(stages);
    for k in 0..stages {
        let n = widths[k];
        time_strides.push(grow_stride(
            shapes,
            &format!("decoder.{}.conv.weight", stage_layer(k, 4)),
            n,
        )?);
        let key = format!("decoder.{}.weight", stage_layer(k, 5));
        let (cout, cin) = conv3x3(shapes, &key)?;
        if cin != n {
            return Err(ModelError::WeightShape {
                key,
                expected: vec![cout, n, 3, 3],
                found: vec![cout, cin, 3, 3],
            });
        }
        widths.push(cout);
    }
    let key = format!("decoder.{last}.weight");
    let (out, cin) = conv3x3(shapes, &key)?;
    let patch = (1..=4).find(|p| 3 * p * p == out).ok_or_else(|| {
        ModelError::input(
            "tiny decoder",
            format!("{key} has {out} output channels; a TAEHV decoder has 3·p² (3, 12, 27 or 48)"),
        )
    })?;
    if cin != widths[stages] {
        return Err(ModelError::WeightShape {
            key,
            expected: vec![out, widths[stages], 3, 3],
            found: vec![out, cin, 3, 3],
        });
    }
    let config = TinyConfig {
        latent_channels,
        patch,
        widths,
        time_strides,
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
