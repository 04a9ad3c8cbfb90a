//! `--tp`, `--sp` and `--comm`, shared by `generate` and `serve`: where the ranks of a
//! TP × SP mesh live and how they talk.
//!
//! - `threads`: every rank a thread of this one process (a single machine, no MPI).
//! - `mpi`: one process per rank, started by `mpirun -n T·S` or Slurm's `srun` (a build
//!   with `--features mpi`); the job's world is split into the TP and SP groups.
//! - `nccl`: one process per GPU, collectives on NCCL with its id sent over MPI (a
//!   build with `--features cuda,mpi`).
//!
//! Rank 0 does the command's I/O and leads the session schedule
//! (`headroom_engine::replicated`); every other rank follows it.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};
use clap::Args;
use headroom_engine::{EngineError, Mesh, RankGroups};
use headroom_tensor::Device;

/// The collective backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommArg {
    /// Ranks as threads of this process.
    Threads,
    /// Ranks as processes of an MPI job.
    Mpi,
    /// Ranks as processes, one per GPU, on NCCL.
    Nccl,
}

impl FromStr for CommArg {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "threads" => Ok(CommArg::Threads),
            "mpi" => Ok(CommArg::Mpi),
            "nccl" => Ok(CommArg::Nccl),
            other => Err(format!("must be threads, mpi or nccl, got {other:?}")),
        }
    }
}

impl fmt::Display for CommArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CommArg::Threads => "threads",
            CommArg::Mpi => "mpi",
            CommArg::Nccl => "nccl",
        })
    }
}

/// The mesh a command runs on.
#[derive(Debug, Clone, Args)]
pub struct RankArgs {
    /// Tensor-parallel degree: ranks that split every layer's heads and FFN units (must
    /// divide the model's heads together with --sp, and its FFN width).
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Ulysses sequence-parallel degree: ranks that split a block's tokens.
    #[arg(long, default_value_t = 1)]
    pub sp: usize,
    /// Collective backend: threads (ranks as threads of this process), mpi (one process
    /// per rank under mpirun/srun; a --features mpi build) or nccl (one process per GPU;
    /// --features cuda,mpi). Default: nccl on a CUDA device, mpi when started by
    /// mpirun/srun, else threads.
    #[arg(long)]
    pub comm: Option<CommArg>,
}

impl RankArgs {
    /// The TP × SP layout, refused when a degree is zero.
    pub fn mesh(&self) -> Result<Mesh> {
        if self.tp == 0 || self.sp == 0 {
            bail!(
                "--tp {} --sp {}: each degree must be at least 1",
                self.tp,
                self.sp
            );
        }
        Ok(Mesh {
            tp: self.tp,
            sp: self.sp,
        })
    }

    /// The backend: as given, else by where the process runs.
    pub fn comm(&self, on_gpu: bool) -> CommArg {
        self.comm.unwrap_or(if on_gpu {
            CommArg::Nccl
        } else if headroom_mpi::launched_by_mpi() {
            CommArg::Mpi
        } else {
            CommArg::Threads
        })
    }

    /// Whether the command runs unsharded in this one process, as without these flags
    /// (`--tp 1 --sp 1` and no backend asked for). One of several processes an MPI
    /// launcher started is refused here: each would run the whole session alone.
    pub fn is_single(&self) -> Result<bool> {
        if self.mesh()? != Mesh::SINGLE {
            return Ok(false);
        }
        if let Some(ranks) = headroom_mpi::launched_ranks() {
            bail!(
                "this process is one of {ranks} that an MPI launcher started, but --tp 1 --sp 1 is one rank: pass --tp and --sp with tp·sp = {ranks}"
            );
        }
        Ok(!matches!(self.comm, Some(CommArg::Mpi | CommArg::Nccl)))
    }

    /// Runs `work` on every rank of the mesh with its groups (and, on GPUs, its device)
    /// and returns rank 0's value in the process that holds rank 0 (`None` in the
    /// others). `gpu` makes a rank's GPU from its rank among the job's processes on its
    /// node; with it the collectives run on NCCL, without it on the host. A world size
    /// that is not `tp · sp`, or a backend that cannot run where the ranks are, is
    /// refused before `work` runs (so before any weights load).
    pub fn launch<T, W>(&self, gpu: Option<GpuFor<'_>>, work: W) -> Result<Option<T>>
    where
        T: Send,
        W: Fn(RankGroups, Option<Device>) -> Result<T> + Sync,
    {
        let mesh = self.mesh()?;
        let comm = self.comm(gpu.is_some());
        match (comm, gpu) {
            (CommArg::Threads | CommArg::Mpi, Some(_)) => bail!(
                "--comm {comm} on a GPU: a sharded session on GPUs runs its collectives on NCCL, one process per GPU (--comm nccl, the default there)"
            ),
            (CommArg::Threads, None) => {
                if let Some(ranks) = headroom_mpi::launched_ranks() {
                    bail!(
                        "--comm threads runs every rank in one process, but this process is one of {ranks} started by an MPI launcher; use --comm mpi, or start one process"
                    );
                }
                let mut values = mesh.run_threads(|groups| {
                    let rank = groups.rank();
                    work(groups, None).map_err(|e| EngineError::Rank {
                        rank,
                        reason: format!("{e:#}"),
                        cause: None,
                    })
                })?;
                Ok(Some(values.swap_remove(0)))
            }
            (CommArg::Mpi, None) => {
                let job = headroom_mpi::MpiJob::init()?;
                let (tp, sp) = job.mesh_groups(mesh.tp, mesh.sp)?;
                let groups = RankGroups::new(job.world(), tp, sp)?;
                run_rank(groups, None, &work)
            }
            (CommArg::Nccl, None) => bail!(
                "--comm nccl runs on GPUs, one process per GPU: pass --device cuda (rank r of a node takes cuda:r), or use --comm mpi or threads on the host"
            ),
            (CommArg::Nccl, Some(gpu)) => nccl_launch(mesh, gpu, &work),
        }
    }
}

/// Makes a rank's GPU device from its rank among the job's processes on its node.
pub type GpuFor<'a> = &'a (dyn Fn(usize) -> Result<Device> + Sync);

/// Runs `work` as this process's rank and returns its value on rank 0. A follower that
/// fails takes the job down, naming itself.
fn run_rank<T, W>(groups: RankGroups, device: Option<Device>, work: &W) -> Result<Option<T>>
where
    W: Fn(RankGroups, Option<Device>) -> Result<T>,
{
    let rank = groups.rank();
    match work(groups.clone(), device) {
        Ok(v) => Ok((rank == 0).then_some(v)),
        Err(e) if rank == 0 => Err(e),
        Err(e) => {
            eprintln!("headroom: rank {rank} failed: {e:#}");
            groups.world.abort();
            Err(e)
        }
    }
}

/// The NCCL mesh: an MPI job whose TP and SP groups each get an NCCL communicator on
/// this rank's GPU (the unique ids travel over the MPI groups, which stay the control
/// plane). Any rank that cannot open its GPU or its communicators ends the job, naming
/// itself, instead of leaving the others waiting in NCCL's initialisation.
#[cfg(all(feature = "cuda", feature = "mpi"))]
fn nccl_launch<T, W>(mesh: headroom_engine::Mesh, gpu: GpuFor<'_>, work: &W) -> Result<Option<T>>
where
    W: Fn(RankGroups, Option<Device>) -> Result<T>,
{
    use headroom_tensor::comm::nccl::NcclComm;
    use headroom_tensor::comm::Communicator;
    use std::sync::Arc;

    let job = headroom_mpi::MpiJob::init()?;
    let (tp, sp) = job.mesh_groups(mesh.tp, mesh.sp)?;
    let setup = || -> Result<(RankGroups, Device)> {
        let local = headroom_mpi::local_rank().unwrap_or(job.rank());
        let device = gpu(local)?;
        let tp = Arc::new(NcclComm::init(tp, &device)?) as Arc<dyn Communicator>;
        let sp = Arc::new(NcclComm::init(sp, &device)?) as Arc<dyn Communicator>;
        Ok((RankGroups::new(job.world(), tp, sp)?, device))
    };
    match setup() {
        Ok((groups, device)) => run_rank(groups, Some(device), work),
        Err(e) => {
            eprintln!("headroom: rank {} failed: {e:#}", job.rank());
            job.world().abort();
            Err(e)
        }
    }
}

/// A build without CUDA and MPI has no NCCL mesh.
#[cfg(not(all(feature = "cuda", feature = "mpi")))]
fn nccl_launch<T, W>(_: headroom_engine::Mesh, _: GpuFor<'_>, _: &W) -> Result<Option<T>>
where
    W: Fn(RankGroups, Option<Device>) -> Result<T>,
{
    bail!("--comm nccl: this build has no NCCL mesh; build with --features cuda,mpi (NCCL itself is loaded at run time)")
}
