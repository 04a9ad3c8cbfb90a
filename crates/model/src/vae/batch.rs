//! Several streams' cache slots as one batch: each slot's tensors stacked along the
//! batch axis for a batched chunk, and split back into each stream's own afterwards.

use headroom_tensor::Tensor;

use crate::error::{ModelError, Result};

/// Refuses a batch without latents, with other than one state per latent, or with
/// latents of more than one shape.
pub(crate) fn check_batch(op: &'static str, latents: &[&Tensor], states: usize) -> Result<()> {
    if latents.is_empty() || latents.len() != states {
        return Err(ModelError::input(
            op,
            format!(
                "{} latents for {states} states (at least one, as many of each)",
                latents.len()
            ),
        ));
    }
    if let Some(other) = latents.iter().find(|l| l.shape() != latents[0].shape()) {
        return Err(ModelError::input(
            op,
            format!(
                "latents {:?} and {:?}: a batch has one shape",
                latents[0].shape(),
                other.shape()
            ),
        ));
    }
    Ok(())
}

/// The slot lists of several streams (one length) stacked along axis 0: a slot is held
/// by every stream or by none (streams at the same point of their stream).
fn stack_slots(lists: &[&[Option<Tensor>]]) -> Result<Vec<Option<Tensor>>> {
    let Some(first) = lists.first() else {
        return Ok(Vec::new());
    };
    (0..first.len())
        .map(|j| {
            let held: Vec<&Tensor> = lists.iter().filter_map(|l| l[j].as_ref()).collect();
            match held.len() {
                0 => Ok(None),
                n if n == lists.len() => Ok(Some(if n == 1 {
                    held[0].clone()
                } else {
                    Tensor::cat(&held, 0)?
                })),
                n => Err(ModelError::input(
                    "batched cache",
                    format!(
                        "cache slot {j} is held by {n} of {} streams: a batch needs streams at the same point",
                        lists.len()
                    ),
                )),
            }
        })
        .collect()
}

/// [`stack_slots`] of several streams' slot lists, which are emptied (their layout
/// kept): the stack holds the streams' past for the batched chunk, and the streams' own
/// copies go back before it runs, not after. A stream whose chunk then fails ends.
pub(crate) fn take_stacked(lists: &mut [&mut Vec<Option<Tensor>>]) -> Result<Vec<Option<Tensor>>> {
    let views: Vec<&[Option<Tensor>]> = lists.iter().map(|l| &l[..]).collect();
    let stacked = stack_slots(&views)?;
    for list in lists.iter_mut() {
        list.iter_mut().for_each(|slot| *slot = None);
    }
    Ok(stacked)
}

/// Splits stacked slots back into `n` streams' own lists (each a compact copy, so no
/// stream keeps the batch's tensors alive).
pub(crate) fn unstack_slots(
    stacked: Vec<Option<Tensor>>,
    n: usize,
) -> Result<Vec<Vec<Option<Tensor>>>> {
    let mut lists: Vec<Vec<Option<Tensor>>> =
        (0..n).map(|_| Vec::with_capacity(stacked.len())).collect();
    for slot in stacked {
        match slot {
            Some(t) if n == 1 => lists[0].push(Some(t)),
            Some(t) => {
                for (k, list) in lists.iter_mut().enumerate() {
                    list.push(Some(t.narrow(0, k, 1)?.contiguous()?));
                }
            }
            None => lists.iter_mut().for_each(|l| l.push(None)),
        }
    }
    Ok(lists)
}
