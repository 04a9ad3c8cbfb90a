//! The backend itself (feature `mpi`).

use std::sync::{Arc, Mutex, MutexGuard};

use headroom_tensor::comm::{recv_bytes, send_bytes, Communicator};
use headroom_tensor::{Result, Tensor};

use crate::comm_err;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{Communicator as _, CommunicatorCollectives, Root};
use mpi::Threading;

use crate::BACKEND;

/// Serializes every MPI call of this process (the job is initialised with
/// `MPI_THREAD_SERIALIZED`).
static MPI_LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    MPI_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// MPI's element count of `len` bytes (MPI counts are C ints).
fn count(op: &'static str, len: usize) -> Result<i32> {
    i32::try_from(len).map_err(|_| {
        comm_err(
            op,
            format!("{len} bytes is past MPI's per-call count limit of 2^31 − 1"),
        )
    })
}

/// This process's membership of an MPI job; finalises MPI when dropped (keep it for the
/// life of the process).
pub struct MpiJob {
    universe: Universe,
    world: Arc<MpiComm>,
}

impl std::fmt::Debug for MpiJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiJob")
            .field("rank", &self.world.rank)
            .field("size", &self.world.size)
            .finish()
    }
}

impl MpiJob {
    /// Joins the job this process was launched into (a lone process is a job of one).
    pub fn init() -> Result<Self> {
        let _guard = lock();
        let (universe, threading) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| comm_err("init", "MPI was already initialised in this process"))?;
        if threading < Threading::Serialized {
            return Err(comm_err(
                "init",
                format!("the MPI library offers {threading:?} threading; serialized is needed"),
            ));
        }
        let world = MpiComm::new(universe.world());
        Ok(Self {
            universe,
            world: Arc::new(world),
        })
    }

    /// The world group: every rank of the job.
    pub fn world(&self) -> Arc<dyn Communicator> {
        Arc::clone(&self.world) as Arc<dyn Communicator>
    }

    /// This process's world rank.
    pub fn rank(&self) -> usize {
        self.world.rank
    }

    /// Ranks in the job.
    pub fn size(&self) -> usize {
        self.world.size
    }

    /// The MPI library's own version string (`MPI_Get_library_version`).
    pub fn library_version(&self) -> String {
        let _guard = lock();
        mpi::environment::library_version().unwrap_or_else(|_| "unknown MPI".to_string())
    }

    /// The group of the world ranks that pass the same `color`, ordered by `key`
    /// (`MPI_Comm_split`); every rank of the world must call it, in the same order.
    pub fn split(&self, color: usize, key: usize) -> Result<Arc<dyn Communicator>> {
        let _guard = lock();
        let color = Color::with_value(
            i32::try_from(color).map_err(|_| comm_err("split", "color past i32"))?,
        );
        let key = i32::try_from(key).map_err(|_| comm_err("split", "key past i32"))?;
        let comm = self
            .world
            .comm
            .split_by_color_with_key(color, key)
            .ok_or_else(|| comm_err("split", "MPI_Comm_split returned no group"))?;
        Ok(Arc::new(MpiComm::new(comm)))
    }

    /// This rank's TP and SP groups of a `tp × sp` mesh, world rank
    /// `sp_rank · tp + tp_rank` (a TP group is `tp` consecutive world ranks).
    pub fn mesh_groups(
        &self,
        tp: usize,
        sp: usize,
    ) -> Result<(Arc<dyn Communicator>, Arc<dyn Communicator>)> {
        if tp * sp != self.size() {
            return Err(comm_err(
                "mesh",
                format!(
                    "--tp {tp} × --sp {sp} = {} ranks, but the job has {} (launch with mpirun -n {})",
                    tp * sp,
                    self.size(),
                    tp * sp
                ),
            ));
        }
        let (sp_rank, tp_rank) = (self.rank() / tp, self.rank() % tp);
        let tp_group = self.split(sp_rank, tp_rank)?;
        let sp_group = self.split(tp_rank, sp_rank)?;
        Ok((tp_group, sp_group))
    }

    /// Keeps the universe alive for as long as the job is (its drop finalises MPI).
    pub fn universe(&self) -> &Universe {
        &self.universe
    }
}

/// One rank's handle on an MPI group.
pub struct MpiComm {
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
}

// SAFETY: an MPI communicator handle is a process-wide value that MPI allows any thread
// to use under MPI_THREAD_SERIALIZED as long as calls do not overlap; every call through
// an `MpiComm` holds `MPI_LOCK`, so they never do.
unsafe impl Send for MpiComm {}
// SAFETY: as for `Send`: shared use is serialized by `MPI_LOCK`.
unsafe impl Sync for MpiComm {}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl MpiComm {
    fn new(comm: SimpleCommunicator) -> Self {
        let (rank, size) = (comm.rank().max(0) as usize, comm.size().max(1) as usize);
        Self { comm, rank, size }
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn exchange_all_gather(&self, send: &Tensor, recv: &mut Tensor) -> Result<()> {
        let send = send_bytes(BACKEND, send)?;
        count("all_gather", send.len())?;
        let recv = recv_bytes(BACKEND, recv)?;
        if recv.len() != send.len() * self.size {
            return Err(comm_err("all_gather", "receive buffer of the wrong size"));
        }
        let _guard = lock();
        self.comm.all_gather_into(send, recv);
        Ok(())
    }

    fn exchange_all_to_all(&self, send: &Tensor, recv: &mut Tensor) -> Result<()> {
        let send = send_bytes(BACKEND, send)?;
        count("all_to_all", send.len() / self.size)?;
        let recv = recv_bytes(BACKEND, recv)?;
        if recv.len() != send.len() || !send.len().is_multiple_of(self.size) {
            return Err(comm_err("all_to_all", "buffers of the wrong size"));
        }
        let _guard = lock();
        self.comm.all_to_all_into(send, recv);
        Ok(())
    }

    fn broadcast_bytes(&self, root: usize, bytes: Vec<u8>) -> Result<Vec<u8>> {
        if root >= self.size {
            return Err(comm_err(
                "broadcast",
                format!("root {root} is not a rank of a group of {}", self.size),
            ));
        }
        let _guard = lock();
        let process = self.comm.process_at_rank(root as i32);
        let mut len = bytes.len() as u64;
        process.broadcast_into(&mut len);
        let len = usize::try_from(len).map_err(|_| comm_err("broadcast", "length past usize"))?;
        count("broadcast", len)?;
        let mut buf = if self.rank == root {
            bytes
        } else {
            vec![0u8; len]
        };
        if len > 0 {
            process.broadcast_into(&mut buf[..]);
        }
        Ok(buf)
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        count("all_gather_bytes", mine.len())?;
        let _guard = lock();
        let mut lens = vec![0u64; self.size];
        self.comm
            .all_gather_into(&(mine.len() as u64), &mut lens[..]);
        let counts = lens
            .iter()
            .map(|&l| count("all_gather_bytes", l as usize))
            .collect::<Result<Vec<i32>>>()?;
        let displs: Vec<i32> = counts
            .iter()
            .scan(0i64, |at, &c| {
                let d = *at;
                *at += c as i64;
                Some(d)
            })
            .map(|d| count("all_gather_bytes", d as usize))
            .collect::<Result<_>>()?;
        let total: usize = lens.iter().map(|&l| l as usize).sum();
        let mut buf = vec![0u8; total];
        // Empty contributions are fine, an empty exchange is not sent at all (a
        // zero-length buffer has no valid address to hand MPI).
        if total > 0 {
            let mut partition = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
            self.comm.all_gather_varcount_into(mine, &mut partition);
        }
        let mut out = Vec::with_capacity(self.size);
        let mut at = 0;
        for l in lens {
            out.push(buf[at..at + l as usize].to_vec());
            at += l as usize;
        }
        Ok(out)
    }

    fn abort(&self) {
        // No lock: the rank that aborts may be the one blocked in a collective holding
        // it (MPI_Abort may be called from any thread to end a stuck job).
        self.comm.abort(70)
    }
}
