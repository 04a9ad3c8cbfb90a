//! A TP × SP mesh of ranks and each rank's groups on it.
//!
//! Ranks are numbered by world rank `sp_rank · tp + tp_rank` (a TP group is `tp`
//! consecutive ranks, as NCCL deployments place TP within a node), whatever launched
//! them: threads of this process talking through the in-process communicator (tests,
//! the per-rank meta execution of `headroom plan`, `--comm threads`) or processes of an
//! MPI job (`mpirun`, `srun`), whose groups the binary builds from the job's world.
//! Sessions on a mesh of processes are driven by [`crate::replicated`].

use std::sync::Arc;

use headroom_model::dit::Sharding;
use headroom_tensor::comm::{Communicator, InProcessGroup};

use crate::error::{EngineError, Result};

/// A TP × SP layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mesh {
    /// Tensor-parallel degree.
    pub tp: usize,
    /// Sequence-parallel (Ulysses) degree.
    pub sp: usize,
}

/// One rank's groups: the world (the control plane: session commands, gathered
/// reports) and its TP and SP groups (the transformer's collectives).
#[derive(Debug, Clone)]
pub struct RankGroups {
    /// Every rank of the mesh, in world-rank order.
    pub world: Arc<dyn Communicator>,
    /// This rank's TP and SP groups.
    pub sharding: Sharding,
}

impl RankGroups {
    /// Groups from a world and the TP / SP groups a launcher made, checking that they
    /// agree with each other and with the world rank numbering.
    pub fn new(
        world: Arc<dyn Communicator>,
        tp: Arc<dyn Communicator>,
        sp: Arc<dyn Communicator>,
    ) -> Result<Self> {
        let groups = Self {
            world,
            sharding: Sharding::metered(tp, sp),
        };
        if groups.mesh().ranks() != groups.world.size()
            || groups.sharding.world_rank() != groups.world.rank()
        {
            return Err(EngineError::request(
                "tp/sp",
                format!(
                    "groups of tp {} × sp {} do not match a world of {} ranks at rank {}",
                    groups.sharding.tp.size(),
                    groups.sharding.sp.size(),
                    groups.world.size(),
                    groups.world.rank()
                ),
            ));
        }
        Ok(groups)
    }

    /// The mesh these groups form.
    pub fn mesh(&self) -> Mesh {
        Mesh {
            tp: self.sharding.tp.size(),
            sp: self.sharding.sp.size(),
        }
    }

    /// This rank's world rank.
    pub fn rank(&self) -> usize {
        self.world.rank()
    }

    /// The world's backend (`threads`, `mpi`).
    pub fn backend(&self) -> &'static str {
        self.world.backend()
    }
}

impl Mesh {
    /// One rank, nothing sharded.
    pub const SINGLE: Mesh = Mesh { tp: 1, sp: 1 };

    /// Ranks on the mesh.
    pub fn ranks(&self) -> usize {
        self.tp * self.sp
    }

    /// Refuses a layout with a zero degree.
    pub fn validate(&self) -> Result<()> {
        if self.tp == 0 || self.sp == 0 {
            return Err(EngineError::request("tp/sp", "must be at least 1"));
        }
        Ok(())
    }

    /// Every rank's groups of an in-process mesh, by world rank.
    pub fn thread_groups(&self) -> Vec<RankGroups> {
        let worlds = InProcessGroup::ranks(self.ranks());
        Sharding::in_process_mesh(self.tp, self.sp)
            .into_iter()
            .zip(worlds)
            .map(|(sharding, world)| RankGroups { world, sharding })
            .collect()
    }

    /// Runs `work` on one thread per rank of an in-process mesh and returns the results
    /// in rank order. A rank that fails aborts its groups, so the others fail instead of
    /// waiting forever; the first rank's own error (not an abort it set off) is returned,
    /// naming the rank.
    pub fn run_threads<T, W>(&self, work: W) -> Result<Vec<T>>
    where
        T: Send,
        W: Fn(RankGroups) -> Result<T> + Sync,
    {
        self.validate()?;
        let results: Vec<Result<T>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .thread_groups()
                .into_iter()
                .map(|groups| {
                    let work = &work;
                    scope.spawn(move || {
                        let abort = groups.clone();
                        let out = work(groups);
                        if out.is_err() {
                            abort.world.abort();
                            abort.sharding.tp.abort();
                            abort.sharding.sp.abort();
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(EngineError::Internal("a rank's thread panicked".into()))
                    })
                })
                .collect()
        });
        let (mut out, mut errors) = (Vec::with_capacity(results.len()), Vec::new());
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                Ok(v) => out.push(v),
                Err(e) => errors.push((rank, e)),
            }
        }
        if errors.is_empty() {
            return Ok(out);
        }
        // Report the root cause, not the aborts it set off on the other ranks.
        let root = errors
            .iter()
            .position(|(_, e)| !e.is_aborted())
            .unwrap_or(0);
        let (rank, e) = errors.swap_remove(root);
        if self.ranks() == 1 {
            return Err(e);
        }
        Err(match e {
            e @ EngineError::Rank { .. } => e,
            e => EngineError::Rank {
                rank,
                reason: e.to_string(),
                cause: Some(Box::new(e)),
            },
        })
    }
}
