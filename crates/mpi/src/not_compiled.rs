//! The backend's API in a build without the `mpi` feature: joining a job says how to
//! get a build that can.

use std::sync::Arc;

use headroom_tensor::comm::Communicator;
use headroom_tensor::Result;

use crate::comm_err;

/// Stands in for the MPI job in a build without MPI; it cannot be made.
#[derive(Debug)]
pub struct MpiJob {
    _never: std::convert::Infallible,
}

impl MpiJob {
    /// Fails: this build has no MPI backend.
    pub fn init() -> Result<Self> {
        Err(comm_err(
            "init",
            "this build has no MPI support: install an MPI library (Debian: openmpi-bin libopenmpi-dev libclang-dev) and build with --features mpi",
        ))
    }

    /// The world group (unreachable: no job can be made).
    pub fn world(&self) -> Arc<dyn Communicator> {
        match self._never {}
    }

    /// This process's world rank (unreachable).
    pub fn rank(&self) -> usize {
        match self._never {}
    }

    /// Ranks in the job (unreachable).
    pub fn size(&self) -> usize {
        match self._never {}
    }

    /// The MPI library's version (unreachable).
    pub fn library_version(&self) -> String {
        match self._never {}
    }

    /// This rank's TP and SP groups (unreachable).
    pub fn mesh_groups(
        &self,
        _tp: usize,
        _sp: usize,
    ) -> Result<(Arc<dyn Communicator>, Arc<dyn Communicator>)> {
        match self._never {}
    }
}
