//! Placements already made, by their input: the planner is deterministic, so a trace
//! met again (another rank of a mesh whose allocations are the same, another reclaim
//! policy, which under `planned` changes no request) gets the plan it got before
//! instead of being placed again. Threads placing the same trace at once wait for the
//! first. The inputs are compared whole, not by their hash alone, and the last
//! [`MEMO_PLANS`] placements are kept.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use super::{PlacementOrder, Plan, PlanRequest};

/// Placements kept.
const MEMO_PLANS: usize = 8;

/// What a placement depends on.
struct Input {
    requests: Vec<PlanRequest>,
    only: Option<PlacementOrder>,
    twins: Vec<Option<usize>>,
}

type Cell = Arc<OnceLock<Option<Plan>>>;

/// (hash of the input, the input, its placement), newest last.
static MEMO: Mutex<Vec<(u64, Input, Cell)>> = Mutex::new(Vec::new());

fn hash_of(requests: &[PlanRequest], only: Option<PlacementOrder>, twins: &[Option<usize>]) -> u64 {
    let mut h = DefaultHasher::new();
    for r in requests {
        (r.size, r.stream, r.start, r.end).hash(&mut h);
    }
    only.hash(&mut h);
    twins.hash(&mut h);
    h.finish()
}

/// The placement of (`requests`, `only`, `twins`): the one made before for the same
/// input, else `place()`'s, kept for the next.
pub(crate) fn memoized(
    requests: &[PlanRequest],
    only: Option<PlacementOrder>,
    twins: &[Option<usize>],
    place: impl FnOnce() -> Option<Plan>,
) -> Option<Plan> {
    let hash = hash_of(requests, only, twins);
    let cell = {
        let mut memo = MEMO.lock().unwrap_or_else(|p| p.into_inner());
        let found = memo.iter().position(|(h, input, _)| {
            *h == hash
                && input.only == only
                && input.requests[..] == *requests
                && input.twins[..] == *twins
        });
        match found {
            Some(i) => {
                let entry = memo.remove(i);
                let cell = Arc::clone(&entry.2);
                memo.push(entry);
                cell
            }
            None => {
                let cell: Cell = Arc::new(OnceLock::new());
                let input = Input {
                    requests: requests.to_vec(),
                    only,
                    twins: twins.to_vec(),
                };
                memo.push((hash, input, Arc::clone(&cell)));
                if memo.len() > MEMO_PLANS {
                    memo.remove(0);
                }
                cell
            }
        }
    };
    cell.get_or_init(place).clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn trace(n: u64) -> Vec<PlanRequest> {
        (0..n)
            .map(|i| PlanRequest {
                size: 512 * (i + 1),
                stream: 0,
                start: 2 * i,
                end: Some(2 * i + 3),
            })
            .collect()
    }

    #[test]
    fn a_trace_met_again_is_not_placed_again_and_another_is() {
        let placed = AtomicUsize::new(0);
        let place = |r: &[PlanRequest]| {
            placed.fetch_add(1, Ordering::Relaxed);
            super::super::place_with_twins(r, None, &[])
        };
        // A size no other test uses, so the process-wide memo holds nothing of it yet.
        let a: Vec<PlanRequest> = trace(7)
            .into_iter()
            .map(|r| PlanRequest {
                size: r.size + 7 * 512 * 1024,
                ..r
            })
            .collect();
        let first = memoized(&a, None, &[], || place(&a)).unwrap();
        let again = memoized(&a, None, &[], || place(&a)).unwrap();
        assert_eq!(first, again);
        assert_eq!(placed.load(Ordering::Relaxed), 1);
        let mut b = a.clone();
        b[3].end = Some(b[3].end.unwrap() + 1);
        memoized(&b, None, &[], || place(&b)).unwrap();
        assert_eq!(
            placed.load(Ordering::Relaxed),
            2,
            "a changed lifetime is another trace"
        );
    }
}
