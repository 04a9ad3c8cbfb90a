//! Runs one engine per rank of a TP × SP mesh, ranks as threads of this process talking
//! through the in-process communicator: sharded sessions on this machine (tests) and
//! the per-rank meta execution of `headroom plan`.

use std::sync::Arc;

use headroom_mem::Platform;
use headroom_model::dit::Sharding;

use crate::engine::{Engine, EngineConfig};
use crate::error::{EngineError, Result};

/// A TP × SP layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mesh {
    /// Tensor-parallel degree.
    pub tp: usize,
    /// Sequence-parallel (Ulysses) degree.
    pub sp: usize,
}

impl Mesh {
    /// One rank, nothing sharded.
    pub const SINGLE: Mesh = Mesh { tp: 1, sp: 1 };

    /// Ranks on the mesh.
    pub fn ranks(&self) -> usize {
        self.tp * self.sp
    }

    /// Runs `work` on an engine per rank (world rank `sp_rank · tp + tp_rank`), each on
    /// the platform `platform(rank)` gives, and returns the results in rank order. A
    /// rank that fails aborts the mesh, so the others fail instead of waiting forever;
    /// the first error is returned.
    pub fn run<T, P, W>(&self, config: &EngineConfig, platform: P, work: W) -> Result<Vec<T>>
    where
        T: Send,
        P: Fn(usize) -> Result<Arc<dyn Platform>> + Sync,
        W: Fn(usize, &Engine) -> Result<T> + Sync,
    {
        if self.tp == 0 || self.sp == 0 {
            return Err(EngineError::request("tp/sp", "must be at least 1"));
        }
        if *self == Mesh::SINGLE {
            let engine = Engine::on(config.clone(), platform(0)?)?;
            return Ok(vec![work(0, &engine)?]);
        }
        let shards = Sharding::in_process_mesh(self.tp, self.sp);
        let results: Vec<Result<T>> = std::thread::scope(|scope| {
            let handles: Vec<_> = shards
                .into_iter()
                .enumerate()
                .map(|(rank, shard)| {
                    let (platform, work) = (&platform, &work);
                    scope.spawn(move || {
                        let abort = shard.clone();
                        let out = platform(rank)
                            .and_then(|p| Engine::on_rank(config.clone(), p, Some(shard)))
                            .and_then(|engine| work(rank, &engine));
                        if out.is_err() {
                            abort.tp.abort();
                            abort.sp.abort();
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(EngineError::request("mesh", "a rank's thread panicked"))
                    })
                })
                .collect()
        });
        // Report the root cause, not the aborts it set off on the other ranks.
        let (mut out, mut errors) = (Vec::with_capacity(results.len()), Vec::new());
        for r in results {
            match r {
                Ok(v) => out.push(v),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            return Ok(out);
        }
        let root = errors
            .iter()
            .position(|e| !e.to_string().contains("rank group was aborted"))
            .unwrap_or(0);
        Err(errors.swap_remove(root))
    }
}
