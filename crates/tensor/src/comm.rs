//! Collectives between ranks for sharded execution: the [`Communicator`] trait, shaped
//! after NCCL's group calls so a GPU backend (NCCL through cudarc) drops in, and
//! [`InProcessGroup`], whose ranks are threads of this process (tests, `plan`).
//!
//! Every collective returns a new tensor on the calling rank's own device, so what a
//! collective allocates is counted by that rank's allocator. Meta (shape-only) tensors
//! exchange shapes only.

use std::sync::{Arc, Condvar, Mutex};

use crate::error::{Result, TensorError};
use crate::{DType, Tensor};

/// Collective operations over a fixed group of ranks; every rank of the group must make
/// the same calls in the same order.
pub trait Communicator: Send + Sync + std::fmt::Debug {
    /// This rank's index in the group.
    fn rank(&self) -> usize;

    /// Ranks in the group.
    fn size(&self) -> usize;

    /// The elementwise sum of every rank's `t` (same shape everywhere), on every rank.
    fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor>;

    /// Every rank's `t` concatenated along `axis` in rank order, on every rank.
    fn all_gather(&self, t: &Tensor, axis: usize) -> Result<Tensor>;

    /// Splits `t` into `size()` equal parts along `split_axis`, sends part `j` to rank
    /// `j`, and concatenates the parts received along `concat_axis` in rank order
    /// (Ulysses' sequence ↔ heads exchange).
    fn all_to_all(&self, t: &Tensor, split_axis: usize, concat_axis: usize) -> Result<Tensor>;

    /// Marks the group failed (NCCL's `ncclCommAbort`): every pending and later
    /// collective of every rank returns an error instead of waiting forever for a rank
    /// that will not come.
    fn abort(&self);
}

/// A barrier that an abort opens for good.
#[derive(Debug)]
struct Gate {
    /// (ranks waiting, generation, aborted).
    state: Mutex<(usize, u64, bool)>,
    cv: Condvar,
    size: usize,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, u64, bool)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait(&self, op: &'static str) -> Result<()> {
        let mut state = self.lock();
        if state.2 {
            return Err(TensorError::Aborted { op });
        }
        state.0 += 1;
        if state.0 == self.size {
            state.0 = 0;
            state.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        let generation = state.1;
        while state.1 == generation && !state.2 {
            state = self.cv.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        if state.1 == generation {
            return Err(TensorError::Aborted { op });
        }
        Ok(())
    }

    fn abort(&self) {
        self.lock().2 = true;
        self.cv.notify_all();
    }
}

/// A tensor in flight: its shape and, unless it is a meta tensor, its f32 values.
#[derive(Debug, Clone)]
struct Payload {
    shape: Vec<usize>,
    values: Option<Vec<f32>>,
}

impl Payload {
    fn of(t: &Tensor) -> Result<Self> {
        if t.dtype() != DType::F32 {
            return Err(TensorError::DType {
                op: "collective",
                expected: "f32 activations",
                got: t.dtype(),
            });
        }
        Ok(Self {
            shape: t.shape().to_vec(),
            values: if t.device().is_meta() {
                None
            } else {
                Some(t.to_f32_vec()?)
            },
        })
    }

    fn into_tensor(self, like: &Tensor) -> Result<Tensor> {
        match self.values {
            Some(v) => Tensor::from_slice(&v, &self.shape, like.device()),
            None => Tensor::empty(&self.shape, DType::F32, like.device()),
        }
    }
}

/// The received `parts` as tensors on `like`'s device, concatenated along `axis`.
fn concat(parts: Vec<Payload>, like: &Tensor, axis: usize) -> Result<Tensor> {
    let tensors = parts
        .into_iter()
        .map(|p| p.into_tensor(like))
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&tensors.iter().collect::<Vec<_>>(), axis)
}

/// The mailboxes and barrier shared by the ranks of an in-process group.
#[derive(Debug)]
struct Shared {
    size: usize,
    /// `slots[src][dst]`: what `src` sends `dst` in the current exchange.
    slots: Mutex<Vec<Vec<Option<Payload>>>>,
    gate: Gate,
}

/// Ranks as threads of this process: each thread holds one [`InProcessComm`].
#[derive(Debug)]
pub struct InProcessGroup;

impl InProcessGroup {
    /// A group of `size` ranks; hand element `r` to the thread of rank `r`.
    pub fn ranks(size: usize) -> Vec<Arc<dyn Communicator>> {
        let size = size.max(1);
        let shared = Arc::new(Shared {
            size,
            slots: Mutex::new(vec![vec![None; size]; size]),
            gate: Gate {
                state: Mutex::new((0, 0, false)),
                cv: Condvar::new(),
                size,
            },
        });
        (0..size)
            .map(|rank| {
                Arc::new(InProcessComm {
                    rank,
                    shared: Arc::clone(&shared),
                }) as Arc<dyn Communicator>
            })
            .collect()
    }
}

/// One rank's handle on an in-process group.
#[derive(Debug)]
pub struct InProcessComm {
    rank: usize,
    shared: Arc<Shared>,
}

impl InProcessComm {
    /// Sends `outgoing[j]` to rank `j` and returns what every rank sent this one, in
    /// rank order.
    fn exchange(&self, op: &'static str, outgoing: Vec<Payload>) -> Result<Vec<Payload>> {
        let n = self.shared.size;
        {
            let mut slots = self.lock();
            for (dst, p) in outgoing.into_iter().enumerate() {
                slots[self.rank][dst] = Some(p);
            }
        }
        self.shared.gate.wait(op)?;
        let incoming = {
            let mut slots = self.lock();
            (0..n)
                .map(|src| {
                    slots[src][self.rank].take().unwrap_or(Payload {
                        shape: Vec::new(),
                        values: None,
                    })
                })
                .collect()
        };
        // Nobody refills the mailboxes before everyone has emptied theirs.
        self.shared.gate.wait(op)?;
        Ok(incoming)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<Option<Payload>>>> {
        self.shared
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check_same_shapes(&self, op: &'static str, parts: &[Payload]) -> Result<()> {
        if let Some(first) = parts.first() {
            if let Some(other) = parts.iter().find(|p| p.shape != first.shape) {
                return Err(TensorError::shape(
                    op,
                    format!(
                        "ranks disagree on the shape: {:?} vs {:?}",
                        first.shape, other.shape
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Communicator for InProcessComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor> {
        if self.shared.size == 1 {
            return t.contiguous();
        }
        let mine = Payload::of(t)?;
        let parts = self.exchange("all_reduce_sum", vec![mine; self.shared.size])?;
        self.check_same_shapes("all_reduce_sum", &parts)?;
        // Summed in rank order on every rank, so all ranks hold identical bytes.
        let mut sum = Payload {
            shape: t.shape().to_vec(),
            values: None,
        };
        for p in parts {
            sum.values = match (sum.values, p.values) {
                (None, v) => v,
                (Some(mut acc), Some(v)) => {
                    acc.iter_mut().zip(&v).for_each(|(a, b)| *a += b);
                    Some(acc)
                }
                (acc, None) => acc,
            };
        }
        sum.into_tensor(t)
    }

    fn all_gather(&self, t: &Tensor, axis: usize) -> Result<Tensor> {
        if self.shared.size == 1 {
            return t.contiguous();
        }
        t.dim("all_gather", axis)?;
        let mine = Payload::of(t)?;
        let parts = self.exchange("all_gather", vec![mine; self.shared.size])?;
        concat(parts, t, axis)
    }

    fn all_to_all(&self, t: &Tensor, split_axis: usize, concat_axis: usize) -> Result<Tensor> {
        let n = self.shared.size;
        if n == 1 {
            return t.contiguous();
        }
        let len = t.dim("all_to_all", split_axis)?;
        t.dim("all_to_all", concat_axis)?;
        if !len.is_multiple_of(n) {
            return Err(TensorError::shape(
                "all_to_all",
                format!(
                    "axis {split_axis} of {:?} does not split into {n} equal parts",
                    t.shape()
                ),
            ));
        }
        let part = len / n;
        let outgoing = (0..n)
            .map(|j| Payload::of(&t.narrow(split_axis, j * part, part)?))
            .collect::<Result<Vec<_>>>()?;
        let parts = self.exchange("all_to_all", outgoing)?;
        concat(parts, t, concat_axis)
    }

    fn abort(&self) {
        self.shared.gate.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    fn run<F>(size: usize, f: F) -> Vec<Vec<f32>>
    where
        F: Fn(&dyn Communicator, &Device) -> Tensor + Sync,
    {
        let comms = InProcessGroup::ranks(size);
        std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .iter()
                .map(|c| {
                    let f = &f;
                    s.spawn(move || {
                        let device = Device::cpu().unwrap();
                        f(c.as_ref(), &device).to_f32_vec().unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn all_reduce_sums_and_all_gather_concatenates_in_rank_order() {
        let out = run(3, |c, d| {
            let t = Tensor::from_slice(&[c.rank() as f32, 1.0], &[2], d).unwrap();
            c.all_reduce_sum(&t).unwrap()
        });
        assert!(out.iter().all(|v| v == &vec![3.0, 3.0]));
        let out = run(2, |c, d| {
            let t = Tensor::from_slice(&[c.rank() as f32; 2], &[1, 2], d).unwrap();
            c.all_gather(&t, 0).unwrap()
        });
        assert!(out.iter().all(|v| v == &vec![0.0, 0.0, 1.0, 1.0]));
    }

    #[test]
    fn all_to_all_moves_sequence_parts_to_head_parts_and_back() {
        // Rank r holds tokens [2r, 2r+1] of 4, with 2 heads each; after the exchange it
        // holds all 4 tokens of head r; the reverse exchange restores the input.
        let out = run(2, |c, d| {
            let r = c.rank();
            let values: Vec<f32> = (0..2)
                .flat_map(|l| (0..2).map(move |h| (10 * (2 * r + l) + h) as f32))
                .collect();
            let t = Tensor::from_slice(&values, &[1, 2, 2, 1], d).unwrap();
            let heads = c.all_to_all(&t, 2, 1).unwrap();
            assert_eq!(heads.shape(), &[1, 4, 1, 1]);
            let expect: Vec<f32> = (0..4).map(|l| (10 * l + r) as f32).collect();
            assert_eq!(heads.to_f32_vec().unwrap(), expect);
            let back = c.all_to_all(&heads, 1, 2).unwrap();
            assert_eq!(back.to_f32_vec().unwrap(), values);
            back
        });
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn an_aborted_group_fails_its_collectives_instead_of_hanging() {
        let comms = InProcessGroup::ranks(2);
        let device = Device::cpu().unwrap();
        let t = Tensor::zeros(&[2], DType::F32, &device).unwrap();
        std::thread::scope(|s| {
            let waiting = s.spawn(|| comms[0].all_reduce_sum(&t));
            // Rank 1 fails instead of joining the collective.
            comms[1].abort();
            let err = waiting.join().unwrap().unwrap_err().to_string();
            assert!(err.contains("aborted"), "{err}");
        });
        assert!(comms[1].all_gather(&t, 0).is_err());
    }
}
