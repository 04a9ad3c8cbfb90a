//! The engine's side of the `planned` allocator: a session is one planned span, keyed by
//! what shapes its allocations; the plan of a shape never seen comes from meta execution
//! of the same session on a `sim` twin of the engine, so even the first session replays
//! a plan, and admission compares the plan's peak with the free memory before the first
//! chunk.
//!
//! Sharded ranks cannot meta-execute alone (their collectives need the other ranks), so
//! they record their first session instead; `headroom plan` meta-executes the whole mesh
//! and installs the plans (see `bench::plan`).

use std::sync::{Arc, Mutex};

use headroom_mem::{AllocatorConfig, AllocatorPolicy, CachingPlatform, ReclaimPolicy};

use crate::engine::{Engine, EngineConfig};
use crate::error::{EngineError, Result};
use crate::mesh::Mesh;
use crate::session::SessionRequest;

/// The key of a session's plan: everything that changes the sizes or the order of its
/// allocations.
pub(crate) fn span_key(
    config: &EngineConfig,
    rank: Option<(usize, usize, usize)>,
    r: &SessionRequest,
) -> String {
    let text = match (&r.text_embeds, &r.prompt) {
        (Some(t), _) => format!("embeds{:?}", t.shape()),
        (None, Some(p)) if !p.trim().is_empty() => "prompt".to_string(),
        _ => "none".to_string(),
    };
    let camera = if r.trajectory.is_some() {
        "trajectory".to_string()
    } else {
        format!("keys{}", r.actions.len())
    };
    format!(
        "{} {:?} {}x{} f{} steps{} shift{} text:{text} image:{} camera:{camera} overlap:{} reuse_kv:{} threads{} rank{:?} kv{}/{}",
        config.model,
        config.weight_dtype,
        r.width,
        r.height,
        r.num_frames,
        r.steps,
        r.flow_shift,
        r.image.is_some(),
        r.overlap,
        r.reuse_last_step_kv,
        headroom_tensor::parallel::num_threads(),
        rank,
        config.sink_frames,
        config.window_frames,
    )
}

/// Capacity of the twin's modelled device: it only counts, so it may be huge.
const TWIN_CAPACITY: u64 = 1 << 50;

/// The sim twin that meta-executes sessions for plans; created on first use.
#[derive(Debug, Default)]
pub(crate) struct MetaTwin {
    engine: Mutex<Option<Box<Engine>>>,
    /// A rank of a mesh: the twin is the whole mesh (ranks as threads on `sim`
    /// platforms, since a rank cannot meta-execute alone), and this rank's plans are
    /// kept.
    mesh: Option<(Mesh, usize)>,
}

impl MetaTwin {
    /// The twin of rank `rank` of `mesh`.
    pub(crate) fn for_mesh(mesh: Mesh, rank: usize) -> Self {
        Self {
            engine: Mutex::new(None),
            mesh: Some((mesh, rank)),
        }
    }

    /// This rank's plans from a meta execution of the session on every rank of `mesh`.
    fn mesh_plans_for(
        config: &EngineConfig,
        kv_pool_bytes: Option<u64>,
        request: &SessionRequest,
        (mesh, rank): (Mesh, usize),
    ) -> Result<headroom_mem::PlanBook> {
        let twin_config = EngineConfig {
            kv_fraction: None,
            kv_budget_bytes: kv_pool_bytes.or(config.kv_budget_bytes),
            capacity: Some(TWIN_CAPACITY),
            ..config.clone()
        };
        let platform = |_rank: usize| -> Result<Arc<dyn headroom_mem::Platform>> {
            Ok(Arc::new(CachingPlatform::sim(
                TWIN_CAPACITY,
                AllocatorConfig::with_policy(AllocatorPolicy::Planned),
                ReclaimPolicy::Never,
            )?))
        };
        let mut books = mesh.run(&twin_config, platform, |_, twin| {
            let request = SessionRequest {
                latent_sink: None,
                ..request.clone()
            };
            let mut session = twin.open_session(request)?;
            for _ in 0..session.chunks_total().unwrap_or(0) {
                session.next_chunk()?;
            }
            drop(session);
            Ok(twin.platform().allocator().plans())
        })?;
        if rank >= books.len() {
            return Err(EngineError::request("mesh", "rank outside the mesh"));
        }
        Ok(books.swap_remove(rank))
    }

    /// Runs `request` as meta execution on the twin and returns the plans it recorded.
    pub(crate) fn plans_for(
        &self,
        config: &EngineConfig,
        kv_pool_bytes: Option<u64>,
        request: &SessionRequest,
    ) -> Result<headroom_mem::PlanBook> {
        if let Some(mesh) = self.mesh {
            return Self::mesh_plans_for(config, kv_pool_bytes, request, mesh);
        }
        let mut slot = self.engine.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            // The twin records without a plan, so it must not run out of memory where
            // the planned session would not: its device is as large as needed, and its
            // KV pool is the real pool's size (not a fraction of that device).
            let platform = CachingPlatform::sim(
                TWIN_CAPACITY,
                AllocatorConfig::with_policy(AllocatorPolicy::Planned),
                ReclaimPolicy::Never,
            )?;
            let twin_config = EngineConfig {
                kv_fraction: None,
                kv_budget_bytes: kv_pool_bytes.or(config.kv_budget_bytes),
                capacity: Some(TWIN_CAPACITY),
                ..config.clone()
            };
            let twin = Engine::twin(twin_config, Arc::new(platform))?;
            *slot = Some(Box::new(twin));
        }
        let Some(twin) = slot.as_ref() else {
            return Err(EngineError::request(
                "allocator",
                "the meta twin was not created",
            ));
        };
        let refused = |e: EngineError| match e {
            EngineError::Model(_) | EngineError::Tensor(_) | EngineError::Mem(_)
                if e.to_string().contains("out of memory") =>
            {
                let stats = twin.platform().memory_stats();
                EngineError::Admission(format!(
                    "the session's planned peak does not fit the {} capacity: its meta execution \
                     ran out of memory with {} reserved ({} allocated); lower the resolution or \
                     frames, or raise --capacity",
                    headroom_mem::format_bytes(TWIN_CAPACITY),
                    headroom_mem::format_bytes(stats.reserved_bytes.all().peak.max(0) as u64),
                    headroom_mem::format_bytes(stats.allocated_bytes.all().peak.max(0) as u64),
                ))
            }
            other => other,
        };
        twin.platform().reset_peak_stats();
        // The twin computes nothing, so nothing may read its tensors' values: a latent
        // sink (`--dump-latents`) stays with the real session.
        let request = SessionRequest {
            latent_sink: None,
            ..request.clone()
        };
        let mut session = twin.open_session(request).map_err(refused)?;
        for _ in 0..session.chunks_total().unwrap_or(0) {
            session.next_chunk().map_err(refused)?;
        }
        drop(session);
        Ok(twin.platform().allocator().plans())
    }
}
