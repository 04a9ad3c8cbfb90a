//! Counting what a rank's collectives move and how long they take: [`Metered`] wraps
//! any [`Communicator`] and adds each tensor collective's calls, input bytes and wall
//! time to a shared [`CommMeter`]. It forwards the tensor collectives whole, so the
//! wrapped backend's own allocations are unchanged, and it counts on meta tensors too:
//! a plan (meta execution) predicts the bytes a run moves.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::Communicator;
use crate::error::Result;
use crate::Tensor;

/// One collective kind's totals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OpTotals {
    /// Calls.
    pub calls: u64,
    /// Bytes of this rank's inputs (what it hands the collective).
    pub bytes: u64,
    /// Wall time inside the collective, waiting for the other ranks included.
    pub seconds: f64,
}

/// Totals per collective kind (`all_reduce_sum`, `all_gather`, `all_to_all`), shared by
/// every group of one rank.
#[derive(Debug, Default)]
pub struct CommMeter {
    totals: Mutex<BTreeMap<String, OpTotals>>,
}

impl CommMeter {
    /// The totals so far, by collective kind.
    pub fn totals(&self) -> BTreeMap<String, OpTotals> {
        self.totals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Forgets the totals (a new session starts).
    pub fn reset(&self) {
        self.totals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    fn add(&self, op: &str, bytes: u64, seconds: f64) {
        let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        let t = totals.entry(op.to_string()).or_default();
        t.calls += 1;
        t.bytes += bytes;
        t.seconds += seconds;
    }
}

/// A communicator whose tensor collectives are counted in a [`CommMeter`].
#[derive(Debug)]
pub struct Metered {
    inner: Arc<dyn Communicator>,
    meter: Arc<CommMeter>,
}

impl Metered {
    /// `inner`, counted in `meter`.
    pub fn wrap(inner: Arc<dyn Communicator>, meter: Arc<CommMeter>) -> Arc<dyn Communicator> {
        Arc::new(Self { inner, meter })
    }

    fn timed<T>(&self, op: &str, t: &Tensor, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let start = Instant::now();
        let out = f();
        let bytes = (t.numel() * t.dtype().size()) as u64;
        self.meter.add(op, bytes, start.elapsed().as_secs_f64());
        out
    }
}

impl Communicator for Metered {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn exchange_all_gather(&self, send: &Tensor, recv: &mut Tensor) -> Result<()> {
        self.inner.exchange_all_gather(send, recv)
    }

    fn exchange_all_to_all(&self, send: &Tensor, recv: &mut Tensor) -> Result<()> {
        self.inner.exchange_all_to_all(send, recv)
    }

    fn broadcast_bytes(&self, root: usize, bytes: Vec<u8>) -> Result<Vec<u8>> {
        self.inner.broadcast_bytes(root, bytes)
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.inner.all_gather_bytes(mine)
    }

    fn abort(&self) {
        self.inner.abort();
    }

    fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor> {
        if self.size() == 1 {
            return self.inner.all_reduce_sum(t);
        }
        self.timed("all_reduce_sum", t, || self.inner.all_reduce_sum(t))
    }

    fn all_gather(&self, t: &Tensor, axis: usize) -> Result<Tensor> {
        if self.size() == 1 {
            return self.inner.all_gather(t, axis);
        }
        self.timed("all_gather", t, || self.inner.all_gather(t, axis))
    }

    fn all_to_all(&self, t: &Tensor, split_axis: usize, concat_axis: usize) -> Result<Tensor> {
        if self.size() == 1 {
            return self.inner.all_to_all(t, split_axis, concat_axis);
        }
        self.timed("all_to_all", t, || {
            self.inner.all_to_all(t, split_axis, concat_axis)
        })
    }
}
