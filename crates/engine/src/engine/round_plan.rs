//! Plans for batched rounds. Sessions stepped together run work no session's own plan
//! describes: stacked forwards, batched VAE work, tensors split back after. Each round
//! runs in two planned spans of its own, shared by its members: its denoise (image
//! conditions, DMD steps, commits) and its decode, so the denoise's arena goes back
//! before the decode takes one. A round is keyed by its composition: every member's own
//! span key and the chunk it is at (counted up to where a session's chunks stop
//! changing, [`Engine::steady_blocks`], with its last chunk apart). The plans of a
//! composition never seen come from the meta twin: the members' sessions opened there
//! from their requests, each advanced alone to its chunk, then stepped together exactly
//! as the scheduler steps the real ones, recorded, placed. Later rounds of the same
//! composition replay them. So even the first batched round of a server replays a plan.
//!
//! What a round leaves for later (each session's decoder state, its frames) outlives the
//! round's spans: the plans leave it to the caching path, as a session's plan leaves
//! the KV pool. That is the rest of the waste: with the full Wan VAE a session's decoder
//! state is made during the decode, on the caching path beside the decode's arena. At
//! most [`ROUND_PLANS`] round plans are kept, the oldest forgotten first.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use headroom_mem::{AllocatorPolicy, CachingAllocator, PlanBook};

use super::planned::MetaTwin;
use super::Engine;
use crate::blocks::{frames_for_blocks, BLOCK_FRAMES};
use crate::config::EngineConfig;
use crate::error::Result;
use crate::request::SessionRequest;
use crate::round::{RoundMember, RoundPlans};
use crate::scheduler::decode_key;
use crate::session::Session;

/// Round plans kept at once (one per composition seen lately).
pub const ROUND_PLANS: usize = 64;

/// Makes and keeps the plans of an engine's batched rounds.
#[derive(Debug)]
pub(crate) struct RoundPlanner {
    meta: Arc<MetaTwin>,
    config: EngineConfig,
    pool_bytes: Option<u64>,
    /// The chunk from which a session's chunks allocate alike.
    steady: usize,
    /// Round keys with a plan in the allocator, oldest first.
    kept: Mutex<VecDeque<String>>,
}

impl RoundPlanner {
    /// The planner of `engine`'s rounds (with its meta twin and its KV pool's size).
    pub(crate) fn new(engine: &Engine, meta: Arc<MetaTwin>) -> Self {
        Self {
            meta,
            config: engine.config().clone(),
            pool_bytes: engine.kv_pool().map(|p| p.bytes()),
            steady: engine.steady_blocks(),
            kept: Mutex::new(VecDeque::new()),
        }
    }

    /// Notes that `key` has a plan now (or will, once recorded), forgetting the oldest
    /// kept plan beyond [`ROUND_PLANS`].
    fn keep(&self, key: &str, allocator: &CachingAllocator) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if kept.iter().any(|k| k == key) {
            return;
        }
        kept.push_back(key.to_string());
        while kept.len() > ROUND_PLANS {
            if let Some(old) = kept.pop_front() {
                allocator.remove_plan(&old);
                allocator.remove_plan(&decode_key(&old));
            }
        }
    }
}

/// Where a member stands in a round: its chunk (up to the steady one) and whether it is
/// its last.
fn class(n: usize, blocks: Option<usize>, steady: usize) -> (usize, bool) {
    (n.min(steady), blocks.is_some_and(|b| n + 1 == b))
}

/// The key of a round of `members`: (member, class) in the order they step.
fn round_key(members: &[(&RoundMember, (usize, bool))]) -> String {
    let parts: Vec<String> = members
        .iter()
        .map(|(m, (n, last))| format!("[{}]@{n}{}", m.key, if *last { "L" } else { "" }))
        .collect();
    format!("round {}", parts.join(" + "))
}

impl RoundPlans for RoundPlanner {
    fn prepare(
        &self,
        allocator: &CachingAllocator,
        members: &[(&RoundMember, usize, Option<usize>)],
    ) -> Option<String> {
        if allocator.policy() != AllocatorPolicy::Planned {
            return None;
        }
        let classed: Vec<(&RoundMember, (usize, bool))> = members
            .iter()
            .map(|&(m, n, blocks)| (m, class(n, blocks, self.steady)))
            .collect();
        let key = round_key(&classed);
        if allocator.wants_plan(&key) {
            // A twin that cannot plan the round leaves it to be recorded here.
            if let Ok(Some(book)) = plan(self, &key, &classed) {
                allocator.install_plans(&book);
            }
        }
        self.keep(&key, allocator);
        Some(key)
    }
}

/// The plan of round `key` from the meta twin: each member's session opened there,
/// advanced alone to its chunk, then the round stepped as the scheduler steps it.
fn plan(
    planner: &RoundPlanner,
    key: &str,
    members: &[(&RoundMember, (usize, bool))],
) -> Result<Option<PlanBook>> {
    let requests: Vec<(SessionRequest, usize)> = members
        .iter()
        .map(|(m, (n, last))| {
            let mut request = m.request.clone();
            if request.num_frames != 0 {
                // Enough blocks to reach chunk n, with it the last one or not.
                let blocks = n + if *last { 1 } else { 2 };
                request.num_frames = frames_for_blocks(blocks);
                // One key set per latent frame at most; the values do not change what
                // a chunk allocates.
                request.actions.truncate(BLOCK_FRAMES * blocks);
            }
            (request, *n)
        })
        .collect();
    planner
        .meta
        .with_twin(&planner.config, planner.pool_bytes, |twin| {
            plan_on(twin, key, &requests)
        })
}

/// [`plan`] on the twin itself.
fn plan_on(twin: &Engine, key: &str, members: &[(SessionRequest, usize)]) -> Result<PlanBook> {
    let allocator = twin.platform().allocator().clone();
    let mut sessions = Vec::with_capacity(members.len());
    for (request, n) in members {
        let mut session = twin.open_session(request.clone())?;
        for _ in 0..*n {
            session.next_chunk()?;
        }
        sessions.push(session);
    }
    let results = {
        let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
        crate::scheduler::next_chunks_in(&mut refs, Some(key))
    };
    drop(sessions);
    let mut book = PlanBook::default();
    let plans = allocator.plans();
    for key in [key.to_string(), decode_key(key)] {
        if let Some(plan) = plans.get(&key) {
            book.insert(&key, plan.clone());
        }
        allocator.remove_plan(&key);
    }
    for result in results {
        result?;
    }
    Ok(book)
}

#[cfg(test)]
mod tests {
    use super::class;

    #[test]
    fn chunks_past_the_steady_one_share_a_class_and_the_last_stands_apart() {
        assert_eq!(class(0, Some(3), 7), (0, false));
        assert_eq!(class(2, Some(3), 7), (2, true));
        assert_eq!(class(9, Some(20), 7), (7, false));
        assert_eq!(class(12, Some(20), 7), (7, false));
        assert_eq!(class(19, Some(20), 7), (7, true));
        assert_eq!(class(40, None, 7), (7, false));
    }
}
