//! The engine's side of the `planned` allocator: a session is one planned span, keyed by
//! what shapes its allocations; the plan of a shape never seen comes from meta execution
//! of the same session on a `sim` twin of the engine, so even the first session replays
//! a plan, and admission compares the plan's peak with the free memory before the first
//! chunk.
//!
//! A session longer than its steady state (the KV window full, the image condition
//! settled), or one without an end, gets a periodic plan instead: the twin meta-executes
//! [`Engine::steady_blocks`] blocks, and the plan of that recording, with its last steady
//! chunks repeating ([`headroom_mem::allocator::periodic`]), stands for any length. The
//! time to the first chunk and the plan's size no longer grow with the horizon.
//!
//! Sharded ranks cannot meta-execute alone (their collectives need the other ranks), so
//! they record their first session instead; `headroom plan` meta-executes the whole mesh
//! and installs the plans (see [`crate::plan`]).

use std::sync::{Arc, Mutex};

use headroom_mem::{AllocatorConfig, AllocatorPolicy, CachingPlatform, ReclaimPolicy};

use super::Engine;
use crate::config::EngineConfig;
use crate::error::{AdmissionKind, EngineError, Result};
use crate::mesh::Mesh;
use crate::request::SessionRequest;

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
    // Native weights leave the key as it always was (plans cached on disk stay valid).
    let weights = match config.weights {
        headroom_model::WeightFormat::Native => String::new(),
        other => format!(" weights:{other}"),
    };
    format!(
        "{} {:?}{weights} {}x{} f{} steps{} text:{text} image:{} camera:{camera} overlap:{} reuse_kv:{} guidance:{:?} decoder:{}{} threads{} rank{:?} kv{}/{}",
        config.model,
        config.weight_dtype,
        r.width,
        r.height,
        r.num_frames,
        r.steps,
        r.image.is_some(),
        r.overlap,
        r.reuse_last_step_kv,
        r.camera_guidance,
        r.decoder.unwrap_or(config.decoder),
        config
            .tiny_decoder
            .as_ref()
            .map_or(String::new(), |p| format!("({})", p.display())),
        headroom_tensor::parallel::num_threads(),
        rank,
        config.sink_frames,
        config.window_frames,
    )
}

/// Capacity of the twin's modelled device: it only counts, so it may be huge.
const TWIN_CAPACITY: u64 = 1 << 50;

/// The setup of the twin of the engine of `config` whose KV pool holds
/// `kv_pool_bytes`. The twin records without a plan, so it must not run out of memory
/// where the planned session would not: its device is as large as needed, and its KV
/// pool is the real pool's size (not a fraction of that device).
fn twin_config(config: &EngineConfig, kv_pool_bytes: Option<u64>) -> EngineConfig {
    EngineConfig {
        kv_fraction: None,
        kv_budget_bytes: kv_pool_bytes.or(config.kv_budget_bytes),
        capacity: Some(TWIN_CAPACITY),
        ..config.clone()
    }
}

/// A modelled device of [`TWIN_CAPACITY`] under the planned allocator: what a twin
/// (or each rank of a twin mesh) runs on.
fn twin_platform() -> Result<Arc<dyn headroom_mem::Platform>> {
    Ok(Arc::new(CachingPlatform::sim(
        TWIN_CAPACITY,
        AllocatorConfig::with_policy(AllocatorPolicy::Planned),
        ReclaimPolicy::Never,
    )?))
}

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
        let mut books = Engine::on_each_rank(
            mesh,
            &twin_config(config, kv_pool_bytes),
            |_| twin_platform(),
            |_, twin| Self::meta_execute(twin, request, |e| e),
        )?;
        if rank >= books.len() {
            return Err(EngineError::Internal("a twin rank outside the mesh".into()));
        }
        Ok(books.swap_remove(rank))
    }

    /// Runs `request` as meta execution on the twin and returns the plans it recorded
    /// (placed in `order` only, when given: a recording that is placed again later).
    pub(crate) fn plans_for(
        &self,
        config: &EngineConfig,
        kv_pool_bytes: Option<u64>,
        request: &SessionRequest,
        order: Option<headroom_mem::PlacementOrder>,
    ) -> Result<headroom_mem::PlanBook> {
        if let Some(mesh) = self.mesh {
            return Self::mesh_plans_for(config, kv_pool_bytes, request, mesh);
        }
        let found = self.with_twin(config, kv_pool_bytes, |twin| {
            Self::plans_on(twin, request, order)
        })?;
        found.ok_or_else(|| EngineError::Internal("the meta twin was not created".into()))
    }

    /// Runs `f` on the sim twin (created on first use, for the engine of `config` whose
    /// KV pool holds `kv_pool_bytes`); `None` for the twin of a mesh, which is a mesh
    /// run per request rather than one engine.
    pub(crate) fn with_twin<T>(
        &self,
        config: &EngineConfig,
        kv_pool_bytes: Option<u64>,
        f: impl FnOnce(&Engine) -> Result<T>,
    ) -> Result<Option<T>> {
        if self.mesh.is_some() {
            return Ok(None);
        }
        let mut slot = self.engine.lock().unwrap_or_else(|p| p.into_inner());
        let twin = match slot.take() {
            Some(twin) => twin,
            None => Box::new(Engine::twin(
                twin_config(config, kv_pool_bytes),
                twin_platform()?,
            )?),
        };
        f(slot.insert(twin)).map(Some)
    }

    /// [`MetaTwin::plans_for`] on the twin itself.
    fn plans_on(
        twin: &Engine,
        request: &SessionRequest,
        order: Option<headroom_mem::PlacementOrder>,
    ) -> Result<headroom_mem::PlanBook> {
        let refused = |e: EngineError| match e {
            e if e.is_out_of_memory() => {
                let stats = twin.platform().memory_stats();
                EngineError::admission(
                    AdmissionKind::PlannedPeak,
                    format!(
                    "the session's planned peak does not fit the {} capacity: its meta execution \
                     ran out of memory with {} reserved ({} allocated); lower the resolution or \
                     frames, or raise --capacity",
                    headroom_mem::format_bytes(TWIN_CAPACITY),
                    headroom_mem::format_bytes(stats.reserved_bytes.all().peak.max(0) as u64),
                    headroom_mem::format_bytes(stats.allocated_bytes.all().peak.max(0) as u64),
                ),
                )
            }
            other => other,
        };
        twin.platform().reset_peak_stats();
        let allocator = twin.platform().allocator();
        let options = allocator.planned_options();
        allocator.set_planned_options(headroom_mem::PlannedOptions {
            order: order.or(options.order),
            ..options.clone()
        });
        let book = Self::meta_execute(twin, request, refused);
        allocator.set_planned_options(options);
        book
    }

    /// The plans of one meta execution of `request` on `twin`.
    fn meta_execute(
        twin: &Engine,
        request: &SessionRequest,
        refused: impl Fn(EngineError) -> EngineError,
    ) -> Result<headroom_mem::PlanBook> {
        // The twin computes nothing, so nothing may read its tensors' values: a latent
        // sink (`--dump-latents`) stays with the real session.
        let request = SessionRequest {
            latent_sink: None,
            ..request.clone()
        };
        let mut session = twin.open_session(request).map_err(&refused)?;
        for _ in 0..session.chunks_total().unwrap_or(0) {
            session.next_chunk().map_err(&refused)?;
        }
        drop(session);
        Ok(twin.platform().allocator().plans())
    }
}
