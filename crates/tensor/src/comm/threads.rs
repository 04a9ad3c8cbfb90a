//! The `threads` backend: ranks as threads of this process, exchanging bytes through
//! shared mailboxes behind a barrier that an abort opens for good (tests, `headroom
//! plan`'s meta execution of a whole mesh, `--comm threads`).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::{recv_bytes, send_bytes, Communicator};
use crate::error::{Result, TensorError};
use crate::Tensor;

const BACKEND: &str = "threads";

/// A barrier that an abort opens for good.
#[derive(Debug)]
struct Gate {
    /// (ranks waiting, generation, aborted).
    state: Mutex<(usize, u64, bool)>,
    cv: Condvar,
    size: usize,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, (usize, u64, bool)> {
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

/// The mailboxes and barrier shared by the ranks of an in-process group.
#[derive(Debug)]
struct Shared {
    size: usize,
    /// `slots[src][dst]`: the bytes `src` sends `dst` in the current exchange (what a
    /// rank sends every rank, a gather or a broadcast, is one buffer shared by all).
    slots: Mutex<Vec<Vec<Arc<[u8]>>>>,
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
            slots: Mutex::new(vec![vec![Arc::from(Vec::new()); size]; size]),
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
    fn exchange(&self, op: &'static str, outgoing: Vec<Arc<[u8]>>) -> Result<Vec<Arc<[u8]>>> {
        {
            let mut slots = self.lock();
            for (dst, bytes) in outgoing.into_iter().enumerate() {
                slots[self.rank][dst] = bytes;
            }
        }
        self.shared.gate.wait(op)?;
        let incoming = {
            let mut slots = self.lock();
            (0..self.shared.size)
                .map(|src| std::mem::replace(&mut slots[src][self.rank], Arc::from(Vec::new())))
                .collect()
        };
        // Nobody refills the mailboxes before everyone has emptied theirs.
        self.shared.gate.wait(op)?;
        Ok(incoming)
    }

    /// The same `bytes` for every rank, one buffer.
    fn to_all(&self, bytes: &[u8]) -> Vec<Arc<[u8]>> {
        vec![Arc::from(bytes); self.shared.size]
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Vec<Arc<[u8]>>>> {
        self.shared
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Copies the `size` received parts into `recv`, checking every rank sent as much.
    fn fill(op: &'static str, parts: Vec<Arc<[u8]>>, recv: &mut Tensor) -> Result<()> {
        let dst = recv_bytes(BACKEND, recv)?;
        let each = dst.len() / parts.len().max(1);
        for (src, (part, out)) in parts.iter().zip(dst.chunks_exact_mut(each)).enumerate() {
            if part.len() != each {
                return Err(TensorError::shape(
                    op,
                    format!(
                        "ranks disagree on the shape: rank {src} sent {} bytes, {each} expected",
                        part.len()
                    ),
                ));
            }
            out.copy_from_slice(part);
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

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn exchange_all_gather(&self, send: &Tensor, recv: &mut Tensor) -> Result<()> {
        let outgoing = self.to_all(send_bytes(BACKEND, send)?);
        let parts = self.exchange("all_gather", outgoing)?;
        Self::fill("all_gather", parts, recv)
    }

    fn exchange_all_to_all(&self, send: &Tensor, recv: &mut Tensor) -> Result<()> {
        let bytes = send_bytes(BACKEND, send)?;
        let each = bytes.len() / self.shared.size;
        let outgoing = bytes.chunks_exact(each.max(1)).map(Arc::from).collect();
        let parts = self.exchange("all_to_all", outgoing)?;
        Self::fill("all_to_all", parts, recv)
    }

    fn broadcast_bytes(&self, root: usize, bytes: Vec<u8>) -> Result<Vec<u8>> {
        if root >= self.shared.size {
            return Err(TensorError::shape(
                "broadcast",
                format!(
                    "root {root} is not a rank of a group of {}",
                    self.shared.size
                ),
            ));
        }
        let outgoing = if self.rank == root {
            self.to_all(&bytes)
        } else {
            self.to_all(&[])
        };
        let incoming = self.exchange("broadcast", outgoing)?;
        Ok(incoming[root].to_vec())
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let incoming = self.exchange("all_gather_bytes", self.to_all(mine))?;
        Ok(incoming.iter().map(|b| b.to_vec()).collect())
    }

    fn abort(&self) {
        self.shared.gate.abort();
    }
}
