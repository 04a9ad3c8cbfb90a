//! Plans whose last chunk repeats: a session streamed past its steady state (its KV
//! window full, its image condition settled) allocates the same requests, in the same
//! order, with the same lifetimes, chunk after chunk. Its plan is made from a bounded
//! recording and replayed for any length.
//!
//! The recording ends with two steady runs `A` and `B` of `P` chunks each (between
//! `denoise_end` marks) whose requests match one for one. Everything recorded before
//! `B` ends is placed as one span, with each request of `A` and its match in `B` at one
//! offset (their lifetimes must not overlap). Then `B` can follow `B` for ever: when the
//! next run starts, what `B` carries over sits where `A`'s carried-over tensors sat when
//! `B` was placed, and everything older that is still live sat there too, so `B`'s
//! offsets are free when `B` asks again. `P` is the smallest of 1..=[`MAX_CHUNKS`] that
//! works: a cache whose successor is made before it is freed (a decoder's feature cache)
//! alternates between two offsets, so its period is two chunks.

/// Most chunks one period may span.
pub const MAX_CHUNKS: usize = 2;

/// Chunk boundaries a recording needs for a period of `chunks` chunks.
pub fn marks_needed(chunks: usize) -> usize {
    2 * chunks + 1
}

use super::planner::{plan_with_twins, PlacementOrder, Plan, PlanPeriod, PlanRequest};

/// The plan of `requests` (a recording with chunk boundaries `marks`) with its last
/// steady run of chunks repeating, or `None` when no run of 1..=[`MAX_CHUNKS`] chunks
/// matches the run before it with every request gone before its match comes.
pub fn periodic(
    requests: &[PlanRequest],
    marks: &[u64],
    only: Option<PlacementOrder>,
) -> Option<Plan> {
    (1..=MAX_CHUNKS).find_map(|chunks| periodic_of(requests, marks, chunks, only))
}

/// [`periodic`] with a period of exactly `chunks` chunks.
fn periodic_of(
    requests: &[PlanRequest],
    marks: &[u64],
    chunks: usize,
    only: Option<PlacementOrder>,
) -> Option<Plan> {
    let n = marks.len();
    if n < marks_needed(chunks) {
        return None;
    }
    let (a, b, c) = (
        marks[n - 1 - 2 * chunks],
        marks[n - 1 - chunks],
        marks[n - 1],
    );
    let period = b.checked_sub(a)?;
    if c.checked_sub(b)? != period || period == 0 {
        return None;
    }
    let in_range = |lo: u64, hi: u64| -> Vec<usize> {
        (0..requests.len())
            .filter(|&i| (lo..hi).contains(&requests[i].start))
            .collect()
    };
    let (first, second) = (in_range(a, b), in_range(b, c));
    if first.len() != second.len() || first.is_empty() {
        return None;
    }
    // Recorded in allocation order: everything up to the end of `B` is a prefix.
    let kept = requests
        .iter()
        .position(|r| r.start >= c)
        .unwrap_or(requests.len());
    if second.last().is_some_and(|&l| l + 1 != kept) {
        return None;
    }
    let mut twins = vec![None; kept];
    for (&i, &j) in first.iter().zip(&second) {
        let (ri, rj) = (requests[i], requests[j]);
        let same = ri.size == rj.size
            && ri.stream == rj.stream
            && ri.start - a == rj.start - b
            && ri.end.map(|e| e.checked_sub(a)) == rj.end.map(|e| e.checked_sub(b));
        if !same {
            return None;
        }
        match ri.end {
            // A request still live when its match is made cannot share its offset.
            Some(end) if end > rj.start => return None,
            Some(_) => {
                twins[i] = Some(j);
                twins[j] = Some(i);
            }
            None => {}
        }
    }
    let mut plan = plan_with_twins(&requests[..kept], only, &twins)?;
    plan.marks = marks.to_vec();
    plan.period = Some(PlanPeriod { start: second[0] });
    Some(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::planner::{sweep, Slot};

    /// A session: a prologue, then `chunks` chunks, each allocating a carried cache
    /// (freed in the next chunk after the new one exists), a large scratch and a small
    /// one; one request lives through everything.
    fn session(chunks: usize) -> (Vec<PlanRequest>, Vec<u64>) {
        let mut requests = Vec::new();
        let mut clock = 0u64;
        let mut tick = || {
            clock += 1;
            clock - 1
        };
        let whole = tick();
        requests.push(PlanRequest {
            size: 4096,
            stream: 0,
            start: whole,
            end: None,
        });
        let mut carried: Option<usize> = None;
        let mut marks = Vec::new();
        for _ in 0..chunks {
            marks.push(tick());
            let scratch = requests.len();
            requests.push(PlanRequest {
                size: 8192,
                stream: 0,
                start: tick(),
                end: None,
            });
            let cache = requests.len();
            requests.push(PlanRequest {
                size: 2048,
                stream: 0,
                start: tick(),
                end: None,
            });
            if let Some(old) = carried.replace(cache) {
                requests[old].end = Some(tick());
            }
            let small = requests.len();
            requests.push(PlanRequest {
                size: 1024,
                stream: 0,
                start: tick(),
                end: None,
            });
            requests[small].end = Some(tick());
            requests[scratch].end = Some(tick());
        }
        let end = tick();
        for r in requests.iter_mut().filter(|r| r.end.is_none()) {
            r.end = Some(end);
        }
        (requests, marks)
    }

    #[test]
    fn the_last_chunk_repeats_at_the_offsets_of_the_one_before() {
        let (requests, marks) = session(6);
        let plan = periodic(&requests, &marks, None).unwrap();
        let start = plan.period.unwrap().start;
        let len = plan.entries.len() - start;
        // The cache's successor is made before it goes: a period of two chunks.
        assert_eq!(len, 6);
        for k in 0..len {
            assert_eq!(
                plan.entries[start + k].slot,
                plan.entries[start - len + k].slot
            );
        }
        // Unrolled to 40 chunks with the period's offsets, every live range stays apart.
        let (long, _) = session(40);
        let mut unrolled = plan.clone();
        unrolled.entries = (0..long.len())
            .map(|i| {
                let i = if i < start {
                    i
                } else {
                    start + (i - start) % len
                };
                plan.entries[i]
            })
            .collect();
        assert!(unrolled
            .entries
            .iter()
            .all(|e| matches!(e.slot, Slot::Arena(_))));
        sweep(&long, &unrolled).unwrap();
    }

    #[test]
    fn chunks_that_differ_or_outlive_their_successor_give_no_period() {
        let (mut requests, marks) = session(6);
        // A request of the last steady chunk changes size.
        let i = requests.iter().position(|r| r.start > marks[4]).unwrap();
        requests[i].size = 512;
        assert!(periodic(&requests, &marks, None).is_none());
        let (requests, marks) = session(4);
        assert!(
            periodic(&requests, &marks, None).is_none(),
            "too few chunks"
        );
    }
}
