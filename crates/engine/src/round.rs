//! A batched round's side of a session: what the session brings to the plan of a round
//! it joins, and the interface the scheduler asks for that plan through (the engine's
//! round planner implements it, so the scheduler needs no engine).

use std::fmt::Debug;
use std::sync::Arc;

use headroom_mem::CachingAllocator;

use crate::request::SessionRequest;

/// Makes the plans of batched rounds: the engine's round planner.
pub(crate) trait RoundPlans: Debug + Send + Sync {
    /// The key of the round of `members` ((member, chunk, blocks of its session) in the
    /// order they step), with the plans of its two halves installed in `allocator` when
    /// there are none yet; `None` where the round runs on the caching path.
    fn prepare(
        &self,
        allocator: &CachingAllocator,
        members: &[(&RoundMember, usize, Option<usize>)],
    ) -> Option<String>;
}

/// What a session brings to the plan of a round it joins: its request as admitted and
/// its own span key, with the planner of its engine's rounds.
#[derive(Debug)]
pub(crate) struct RoundMember {
    /// The planner of the rounds this session may join.
    pub planner: Arc<dyn RoundPlans>,
    /// The session's request (without its latent sink: a twin never reads values).
    pub request: SessionRequest,
    /// The session's own span key.
    pub key: String,
}

impl RoundMember {
    /// The member of `planner`'s rounds that a session of `request` (span key `key`) is.
    pub(crate) fn new(planner: Arc<dyn RoundPlans>, request: &SessionRequest, key: String) -> Self {
        Self {
            planner,
            request: SessionRequest {
                latent_sink: None,
                ..request.clone()
            },
            key,
        }
    }

    /// Whether two members' rounds are planned by one planner.
    pub(crate) fn shares_planner(&self, other: &RoundMember) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.planner), Arc::as_ptr(&other.planner))
    }
}
