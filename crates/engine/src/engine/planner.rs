//! An engine's planner for the `planned` allocator, one field of the engine: the meta
//! twin that makes a new shape's plan, the planner of batched rounds, the plan cache on
//! disk, and the admission of a session's planned peak before its span opens.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use headroom_mem::allocator::periodic;
use headroom_mem::{AllocatorPolicy, PlanBook, SpanId};

use super::planned::{span_key, MetaTwin};
use super::round_plan::RoundPlanner;
use super::Engine;
use crate::blocks::{frames_for_blocks, BLOCK_FRAMES};
use crate::error::{AdmissionKind, EngineError, Result};
use crate::plan_cache::{PlanCache, PlanCacheCounts};
use crate::request::SessionRequest;
use crate::round::{RoundMember, RoundPlans};

/// An engine's planner for the `planned` allocator: its meta twin, the planner of
/// batched rounds, the plan cache on disk, where image conditions settle, and whether
/// sessions are stepped in batches.
#[derive(Debug)]
pub(crate) struct Planner {
    /// The sim twin that meta-executes sessions (none on a twin itself and on ranks
    /// that record instead).
    meta: Option<Arc<MetaTwin>>,
    /// Makes the plans of batched rounds, once the first session is admitted.
    rounds: OnceLock<Arc<RoundPlanner>>,
    /// Plans kept on disk, when the config names a folder.
    cache: Option<PlanCache>,
    /// Where image conditions settle on a meta device
    /// ([`crate::condition::probe_settle_block`]), probed on first use.
    condition_settles: OnceLock<Option<usize>>,
    /// Sessions may be stepped in batches with others ([`Engine::set_batched_steps`]).
    batched_steps: AtomicBool,
}

impl Planner {
    /// A planner with meta twin `meta` (if any) and plan cache `cache` (if any).
    pub(super) fn new(meta: Option<Arc<MetaTwin>>, cache: Option<PlanCache>) -> Self {
        Self {
            meta,
            rounds: OnceLock::new(),
            cache,
            condition_settles: OnceLock::new(),
            batched_steps: AtomicBool::new(false),
        }
    }

    /// What the plan cache did so far (`None` without one).
    pub(super) fn plan_cache_counts(&self) -> Option<PlanCacheCounts> {
        self.cache.as_ref().map(PlanCache::counts)
    }

    /// See [`Engine::set_batched_steps`].
    pub(super) fn set_batched_steps(&self, batched: bool) {
        self.batched_steps.store(batched, Ordering::Relaxed);
    }

    /// Whether sessions start detached from their plans (stepped in batches).
    pub(super) fn batched_steps(&self) -> bool {
        self.batched_steps.load(Ordering::Relaxed)
    }

    /// Where `engine`'s image conditions settle, probed once; `None` for a model without
    /// an image condition.
    pub(super) fn condition_settle_block(&self, engine: &Engine) -> Option<usize> {
        if !engine.transformer().config().takes_image_condition() {
            return None;
        }
        *self
            .condition_settles
            .get_or_init(|| crate::condition::probe_settle_block(engine.vae().config()))
    }

    /// Blocks a recording needs to end in steady chunks a periodic plan can repeat:
    /// the KV window full (`window_frames` visible, the sink included) and the image
    /// condition settled, then two runs of the longest period.
    pub(super) fn steady_blocks(&self, engine: &Engine) -> usize {
        let window = engine.config().window_frames.div_ceil(BLOCK_FRAMES);
        let settled = self.condition_settle_block(engine).unwrap_or(0);
        window.max(settled) + periodic::marks_needed(periodic::MAX_CHUNKS)
    }

    /// Under the planned allocator: makes the session's plan (meta execution on the sim
    /// twin) if there is none, refuses the session when the plan's peak does not fit
    /// beside what the live sessions have committed, and opens its span beside theirs;
    /// returns the span, if it opened one. A session of `blocks`
    /// blocks longer than [`Planner::steady_blocks`], or without an end (`None`), gets a
    /// periodic plan; one without an end that gets none runs on the caching path (a
    /// recording would never end). A `resumed` session's span is detached from the
    /// start.
    pub(super) fn begin_span(
        &self,
        engine: &Engine,
        request: &SessionRequest,
        blocks: Option<usize>,
        resumed: bool,
    ) -> Result<Option<SpanId>> {
        let allocator = engine.platform().allocator();
        if allocator.policy() != AllocatorPolicy::Planned {
            return Ok(None);
        }
        let open_ended = blocks.is_none();
        let steady = self.steady_blocks(engine);
        let repeats = blocks.is_none_or(|b| b > steady);
        let rank = engine.transformer().sharding().map(|s| {
            (
                s.tp.size(),
                s.sp.size(),
                s.sp.rank() * s.tp.size() + s.tp.rank(),
            )
        });
        let key = span_key(engine.config(), rank, request);
        if let Some(cache) = &self.cache {
            // A plan the last session re-recorded goes to disk, a dropped one leaves it;
            // then the file's plan is installed when the allocator has none.
            cache.sync(&key, allocator);
            cache.load_into(&key, allocator);
        }
        if let Some(meta) = &self.meta {
            if allocator.wants_plan(&key) {
                let pool_bytes = engine.kv_pool().map(|p| p.bytes());
                let made = if repeats {
                    let prefix = SessionRequest {
                        num_frames: frames_for_blocks(steady),
                        latent_sink: None,
                        ..request.clone()
                    };
                    // Placed once, cheaply: only its periodic plan is kept.
                    let book = meta.plans_for(
                        engine.config(),
                        pool_bytes,
                        &prefix,
                        Some(headroom_mem::PlacementOrder::Start),
                    )?;
                    book.get(&span_key(engine.config(), rank, &prefix))
                        .and_then(|p| periodic::periodic(&p.requests, &p.marks, None))
                } else {
                    None
                };
                match made {
                    Some(plan) => {
                        let mut book = PlanBook::default();
                        book.insert(&key, plan);
                        allocator.install_plans(&book);
                    }
                    // A session with an end is planned whole.
                    None if !open_ended => {
                        let book = meta.plans_for(engine.config(), pool_bytes, request, None)?;
                        allocator.install_plans(&book);
                    }
                    None => {}
                }
                if let Some(cache) = &self.cache {
                    cache.sync(&key, allocator);
                }
            }
        }
        match allocator.planned_peak(&key) {
            // A resumed session's allocations start mid-stream, where no plan of its
            // shape starts: its plan's peak counts for admission, its work goes to the
            // cache (a detached span), and it is never recorded as the shape's plan.
            Some(peak) if resumed => {
                engine.admit_planned_peak(peak)?;
                let (id, _) = allocator.open_span(&key).map_err(|e| {
                    EngineError::admission(AdmissionKind::PlannedPeak, e.to_string())
                })?;
                allocator.detach_span(id);
                return Ok(Some(id));
            }
            None if resumed => return Ok(None),
            Some(peak) => engine.admit_planned_peak(peak)?,
            // Without a plan a session with an end is recorded; one without is not.
            None if open_ended => return Ok(None),
            None => {}
        }
        let (id, _) = allocator
            .open_span(&key)
            .map_err(|e| EngineError::admission(AdmissionKind::PlannedPeak, e.to_string()))?;
        if self.batched_steps.load(Ordering::Relaxed) {
            allocator.detach_span(id);
        }
        Ok(Some(id))
    }

    /// What a session of `request` brings to the plans of batched rounds: only where it
    /// has a planned span and the engine a meta twin of its own (not a mesh's).
    pub(super) fn round_member(
        &self,
        engine: &Engine,
        request: &SessionRequest,
        span: Option<SpanId>,
    ) -> Option<Arc<RoundMember>> {
        let meta = self.meta.as_ref()?;
        if span.is_none() || engine.transformer().sharding().is_some() {
            return None;
        }
        let planner = self
            .rounds
            .get_or_init(|| Arc::new(RoundPlanner::new(engine, Arc::clone(meta))));
        let key = span_key(engine.config(), None, request);
        let planner: Arc<dyn RoundPlans> = planner.clone();
        Some(Arc::new(RoundMember::new(planner, request, key)))
    }
}
