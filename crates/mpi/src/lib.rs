//! The `mpi` collective backend: one process per rank, launched by `mpirun` or Slurm's
//! `srun`, talking through the system's MPI library (rsmpi over OpenMPI here).
//!
//! [`MpiJob::init`] joins the job (`MPI_Init_thread`, serialized: only one thread of a
//! rank calls MPI at a time, which every call here enforces with one lock), and
//! `MpiJob::split` carves the world into groups by `MPI_Comm_split` (the TP and SP
//! groups of a mesh). A group's `Communicator` moves the bytes of our own allocator's
//! tensors with `MPI_Allgather` and `MPI_Alltoall` straight between their buffers (the
//! only copy is the packing the shared collective code does for an all-to-all whose
//! split axis is not the outermost); `Communicator::abort` is `MPI_Abort`, which ends
//! every process of the job.
//!
//! This crate is its own so that the `mpi` feature of the `headroom` binary recompiles
//! only this crate and the binary: the layers below never know MPI exists.
#![warn(missing_docs, missing_debug_implementations)]

use headroom_tensor::TensorError;

#[cfg(feature = "mpi")]
mod job;
#[cfg(not(feature = "mpi"))]
mod not_compiled;

#[cfg(feature = "mpi")]
pub use job::{MpiComm, MpiJob};
#[cfg(not(feature = "mpi"))]
pub use not_compiled::MpiJob;

/// The backend's name in errors and reports.
const BACKEND: &str = "mpi";

/// Whether this build carries the MPI backend (feature `mpi`).
pub const COMPILED: bool = cfg!(feature = "mpi");

fn comm_err(op: &'static str, reason: impl Into<String>) -> TensorError {
    TensorError::Comm {
        backend: BACKEND,
        op,
        reason: reason.into(),
    }
}

/// Whether this process was started by an MPI launcher (`mpirun`/`mpiexec` of Open MPI
/// or MPICH/Hydra, Slurm's `srun`), read from the variables they set.
pub fn launched_by_mpi() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "SLURM_STEP_NUM_TASKS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// The number of processes an MPI launcher started, when it announced more than one in
/// the environment (`None` for a lone process or no launcher).
pub fn launched_ranks() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .filter(|&n: &usize| n > 1)
}

/// This process's rank among the job's processes on its own node, as the launcher
/// announced it (Open MPI, MPICH/Hydra, Slurm): the GPU a one-process-per-GPU rank
/// takes. `None` when no launcher said.
pub fn local_rank() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
        "PMIX_LOCAL_RANK",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}
