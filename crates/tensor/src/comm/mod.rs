//! Collectives between ranks for sharded execution: the [`Communicator`] trait, shaped
//! after NCCL's group calls, and its backends — [`InProcessGroup`] (ranks as threads of
//! this process: tests, `plan`, `--comm threads`) and [`nccl`] (GPUs; its communicator
//! with the `cuda` feature) here, MPI in the `headroom-mpi` crate.
//!
//! A backend only moves bytes: it implements two exchanges on buffers it is handed (an
//! all-gather into `[size, …]` and an all-to-all of `[size, …]` parts) plus the byte
//! messages of the control plane. What each collective *allocates* is decided once, here,
//! in the trait's provided methods, so every backend makes the same allocations in the
//! same order, from the calling rank's own allocator: a plan made on the in-process
//! backend (meta execution) is a prediction of a run on MPI, byte for byte. Sums are
//! taken in rank order on every rank, so every backend and every rank hold identical
//! bytes (MPI's and NCCL's own reductions are free to pick another order).
//!
//! Meta (shape-only) tensors exchange nothing: the output shapes follow from the inputs.

mod meter;
pub mod nccl;
mod threads;

pub use meter::{CommMeter, Metered, OpTotals};
pub use threads::{InProcessComm, InProcessGroup};

use crate::error::{Result, TensorError};
use crate::{DType, Tensor};

/// Collective operations over a fixed group of ranks; every rank of the group must make
/// the same calls in the same order.
pub trait Communicator: Send + Sync + std::fmt::Debug {
    /// This rank's index in the group.
    fn rank(&self) -> usize;

    /// Ranks in the group.
    fn size(&self) -> usize;

    /// The backend's name (`threads`, `mpi`, `nccl`).
    fn backend(&self) -> &'static str;

    /// Fills `recv` (`[size, …send's shape]`, fresh and contiguous, `send`'s dtype) with
    /// every rank's `send` (contiguous) in rank order. Never called on meta tensors.
    fn exchange_all_gather(&self, send: &Tensor, recv: &mut Tensor) -> Result<()>;

    /// Sends part `j` of `send` (`[size, …]`, contiguous) to rank `j` and fills part `i`
    /// of `recv` (same shape, fresh) with what rank `i` sent this one. Never called on
    /// meta tensors.
    fn exchange_all_to_all(&self, send: &Tensor, recv: &mut Tensor) -> Result<()>;

    /// `bytes` of rank `root` on every rank (the control plane: session commands).
    fn broadcast_bytes(&self, root: usize, bytes: Vec<u8>) -> Result<Vec<u8>>;

    /// Every rank's `mine`, in rank order, on every rank (any lengths).
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Marks the group failed (NCCL's `ncclCommAbort`, MPI's `MPI_Abort`): no rank waits
    /// for one that will not come. In-process, every pending and later collective
    /// returns an error; across processes the whole job ends.
    fn abort(&self);

    /// The elementwise sum of every rank's f32 `t` (same shape everywhere), on every
    /// rank, summed in rank order.
    fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor> {
        if self.size() == 1 {
            return t.contiguous();
        }
        if t.dtype() != DType::F32 {
            return Err(TensorError::DType {
                op: "all_reduce_sum",
                expected: "f32 activations",
                got: t.dtype(),
            });
        }
        let gathered = gather_ranks(self.size(), t, |s, r| self.exchange_all_gather(s, r))?;
        sum_over_ranks(&gathered, t.shape())
    }

    /// Every rank's `t` concatenated along `axis` in rank order, on every rank.
    fn all_gather(&self, t: &Tensor, axis: usize) -> Result<Tensor> {
        if self.size() == 1 {
            return t.contiguous();
        }
        t.dim("all_gather", axis)?;
        let gathered = gather_ranks(self.size(), t, |s, r| self.exchange_all_gather(s, r))?;
        concat_ranks(&gathered, axis)
    }

    /// Splits `t` into `size()` equal parts along `split_axis`, sends part `j` to rank
    /// `j`, and concatenates the parts received along `concat_axis` in rank order
    /// (Ulysses' sequence ↔ heads exchange).
    fn all_to_all(&self, t: &Tensor, split_axis: usize, concat_axis: usize) -> Result<Tensor> {
        let n = self.size();
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
        // [.., n, part, ..] with the rank axis moved to the front: part j is contiguous
        // (a view when nothing precedes the split axis, else one packing copy).
        let mut split_shape = t.shape().to_vec();
        split_shape[split_axis] = len / n;
        split_shape.insert(split_axis, n);
        let order: Vec<usize> = std::iter::once(split_axis)
            .chain(0..split_axis)
            .chain(split_axis + 1..split_shape.len())
            .collect();
        let send = t.reshape(&split_shape)?.permute(&order)?.contiguous()?;
        let mut recv = Tensor::empty(send.shape(), send.dtype(), send.device())?;
        if !t.device().is_meta() {
            self.exchange_all_to_all(&send, &mut recv)?;
        }
        drop(send);
        concat_ranks(&recv, concat_axis)
    }
}

/// `[n, …t's shape]` holding every rank's `t` in rank order, exchanged by `exchange`
/// (skipped for meta tensors).
fn gather_ranks<F>(n: usize, t: &Tensor, exchange: F) -> Result<Tensor>
where
    F: FnOnce(&Tensor, &mut Tensor) -> Result<()>,
{
    let send = t.contiguous()?;
    let mut shape = vec![n];
    shape.extend_from_slice(t.shape());
    let mut recv = Tensor::empty(&shape, t.dtype(), t.device())?;
    if !t.device().is_meta() {
        exchange(&send, &mut recv)?;
    }
    Ok(recv)
}

/// The sum over axis 0 of `parts` (`[n, …shape]`, f32, contiguous): rank 0's values
/// plus rank 1's plus … in that order, so every rank holds the same bytes.
fn sum_over_ranks(parts: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if parts.device().launcher().is_some() {
        return parts.sum(0, false);
    }
    let mut out = Tensor::empty(shape, DType::F32, parts.device())?;
    let m = out.numel();
    if let (Some(src), Some(dst)) = (parts.as_slice::<f32>(), out.data_mut::<f32>()) {
        dst.copy_from_slice(&src[..m]);
        for part in src.chunks_exact(m).skip(1) {
            dst.iter_mut().zip(part).for_each(|(a, b)| *a += b);
        }
    }
    Ok(out)
}

/// The `n` parts of `parts` (`[n, …]`) concatenated along `axis` of a part: a view when
/// no axis precedes `axis` (or those are all 1), else one copy.
fn concat_ranks(parts: &Tensor, axis: usize) -> Result<Tensor> {
    let n = parts.shape()[0];
    let part = &parts.shape()[1..];
    let mut out_shape = part.to_vec();
    out_shape[axis] *= n;
    if part[..axis].iter().product::<usize>() == 1 {
        return parts.reshape(&out_shape);
    }
    let order: Vec<usize> = (1..=axis)
        .chain(std::iter::once(0))
        .chain(axis + 1..=part.len())
        .collect();
    parts.permute(&order)?.contiguous()?.reshape(&out_shape)
}

/// The bytes of a contiguous host tensor, for a backend's send buffer.
pub fn send_bytes<'a>(backend: &'static str, t: &'a Tensor) -> Result<&'a [u8]> {
    t.host_bytes().ok_or_else(|| TensorError::Comm {
        backend,
        op: "send",
        reason: format!(
            "needs a contiguous tensor in host memory (got {:?} on {})",
            t.shape(),
            t.device().describe()
        ),
    })
}

/// The bytes of a fresh contiguous host tensor, for a backend's receive buffer.
pub fn recv_bytes<'a>(backend: &'static str, t: &'a mut Tensor) -> Result<&'a mut [u8]> {
    let (shape, device) = (t.shape().to_vec(), t.device().describe());
    t.host_bytes_mut().ok_or_else(|| TensorError::Comm {
        backend,
        op: "receive",
        reason: format!("needs a fresh tensor in host memory (got {shape:?} on {device})"),
    })
}

#[cfg(test)]
mod tests;
