//! Offline placement of one recorded span of requests in one arena.
//!
//! Input: every request of a span in order, with its rounded size, its stream and its
//! lifetime `[start, end)` on the span's event clock (one tick per allocation or free);
//! a request still live when the span ended has no end. Output: an offset per request
//! in an arena of its stream (a stream's blocks are never handed to another stream, as in
//! the caching allocator), or `Fallback` for requests that outlive the span: those are
//! served by the caching allocator underneath, so nothing placed here is pinned past the
//! span.
//!
//! Placement is greedy: requests are taken in one order and each goes into the
//! smallest gap between the requests already placed whose lifetimes overlap its own
//! (best fit), or on top of them. Several orders are tried — size (TFLite's arena
//! planner, Pisarchyk & Lee 2020), size × lifetime, lifetime, and conflicts (the live
//! bytes while the request lives) — and the smallest arena wins, as XLA's heap simulator
//! keeps the better of its orders. The winner is checked by a sweep over time before it
//! is used. The lower bound is the span's live peak; on the engine's traces the result
//! lands within a few per cent of it.
//!
//! Cost: finding the overlapping requests uses a bucketed time index, so a placement
//! touches the requests live around it, not the whole span.

mod memo;

use std::collections::BTreeMap;
use std::fmt;

/// One recorded request of a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlanRequest {
    /// Rounded size in bytes (a multiple of 512).
    pub size: u64,
    /// Stream of the request.
    pub stream: u32,
    /// Clock tick of the allocation.
    pub start: u64,
    /// Clock tick of the free, `None` when it outlived the span.
    pub end: Option<u64>,
}

/// Where a planned request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Slot {
    /// At this offset of its stream's arena.
    Arena(u64),
    /// In the caching allocator underneath (it outlives the span).
    Fallback,
}

/// One request of a plan, in span order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlanEntry {
    /// Rounded size in bytes.
    pub size: u64,
    /// Stream of the request.
    pub stream: u32,
    /// Where it goes.
    pub slot: Slot,
}

/// The order in which greedy placement takes requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementOrder {
    /// Largest first.
    Size,
    /// Largest size × lifetime first.
    SizeLifetime,
    /// Longest-lived first.
    Lifetime,
    /// Most live bytes around the request first.
    Conflicts,
    /// In allocation order (what an online allocator would see, with best fit).
    Start,
    /// Requests living longer than this many clock ticks first, in allocation order
    /// (they stack like a bump allocator's), then the rest largest first. The planner
    /// tries thresholds at quantiles of the span's lifetimes.
    Tiered(u64),
}

impl PlacementOrder {
    /// Every order, in the order they are tried (the first of equal arenas wins).
    pub const ALL: [PlacementOrder; 5] = [
        PlacementOrder::Size,
        PlacementOrder::SizeLifetime,
        PlacementOrder::Lifetime,
        PlacementOrder::Conflicts,
        PlacementOrder::Start,
    ];

    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            PlacementOrder::Size => "size",
            PlacementOrder::SizeLifetime => "size_lifetime",
            PlacementOrder::Lifetime => "lifetime",
            PlacementOrder::Conflicts => "conflicts",
            PlacementOrder::Start => "start",
            PlacementOrder::Tiered(_) => "tiered",
        }
    }
}

impl fmt::Display for PlacementOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementOrder::Tiered(ticks) => write!(f, "tiered:{ticks}"),
            other => f.write_str(other.name()),
        }
    }
}

/// Tiered thresholds of the coarse pass (quantiles of the span's distinct lifetimes):
/// as many as [`TIER_BUDGET`] placements of the span's requests allow, within bounds.
const COARSE_TIERS: std::ops::RangeInclusive<usize> = 16..=96;
/// Requests × coarse tiers budget of one plan.
const TIER_BUDGET: usize = 500_000;
/// Distinct lifetimes on each side of the best coarse threshold tried in the fine pass.
const FINE_TIERS: usize = 6;

/// The distinct lifetimes of the requests placed in an arena, ascending.
fn lifetimes(requests: &[PlanRequest]) -> Vec<u64> {
    let mut lifetimes: Vec<u64> = requests
        .iter()
        .filter_map(|r| r.end.map(|e| e - r.start))
        .collect();
    lifetimes.sort_unstable();
    lifetimes.dedup();
    lifetimes
}

/// The coarse tiered orders for a span of `requests` requests: thresholds at evenly
/// spaced distinct lifetimes.
fn coarse_tiers(lifetimes: &[u64], requests: usize) -> Vec<PlacementOrder> {
    if lifetimes.is_empty() {
        return Vec::new();
    }
    let tiers = (TIER_BUDGET / requests.max(1)).clamp(*COARSE_TIERS.start(), *COARSE_TIERS.end());
    let n = tiers.min(lifetimes.len());
    let mut picked: Vec<u64> = (0..n)
        .map(|k| lifetimes[k * (lifetimes.len() - 1) / (n - 1).max(1)])
        .collect();
    picked.dedup();
    picked.into_iter().map(PlacementOrder::Tiered).collect()
}

/// The fine tiered orders around threshold `best`: its neighbours among the distinct
/// lifetimes, less those already tried.
fn fine_tiers(lifetimes: &[u64], best: u64, tried: &[PlacementOrder]) -> Vec<PlacementOrder> {
    let at = lifetimes.partition_point(|&l| l < best);
    let lo = at.saturating_sub(FINE_TIERS);
    let hi = (at + FINE_TIERS + 1).min(lifetimes.len());
    lifetimes[lo..hi]
        .iter()
        .map(|&l| PlacementOrder::Tiered(l))
        .filter(|o| !tried.contains(o))
        .collect()
}

/// Places every stream's arena requests in each of `orders`, on up to as many threads
/// as the machine has; the smallest total wins, the earliest of equal ones.
fn best_placement(
    requests: &[PlanRequest],
    streams: &[u32],
    orders: &[PlacementOrder],
    twins: &[Option<usize>],
) -> Option<Placement> {
    let one = |order: PlacementOrder| {
        let mut offsets = vec![0u64; requests.len()];
        let mut arenas = Vec::new();
        for &stream in streams {
            let items: Vec<usize> = (0..requests.len())
                .filter(|&i| requests[i].stream == stream && requests[i].end.is_some())
                .collect();
            let size = place(requests, &items, order, &mut offsets, twins);
            arenas.push((stream, size));
        }
        let total: u64 = arenas.iter().map(|a| a.1).sum();
        Placement {
            total,
            order,
            offsets,
            arenas,
        }
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(orders.len())
        .max(1);
    let per = orders.len().div_ceil(threads);
    let results: Vec<Placement> = std::thread::scope(|scope| {
        let handles: Vec<_> = orders
            .chunks(per.max(1))
            .map(|chunk| scope.spawn(move || chunk.iter().map(|&o| one(o)).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    results
        .into_iter()
        .reduce(|best, p| if p.total < best.total { p } else { best })
}

/// A checked placement of one span.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    /// Every request of the span, in order.
    pub entries: Vec<PlanEntry>,
    /// Arena bytes per stream, ascending by stream.
    pub arenas: Vec<(u32, u64)>,
    /// The order that won.
    pub order: PlacementOrder,
    /// Highest sum of live arena-placed bytes: the bound no placement can beat.
    pub live_peak_bytes: u64,
    /// Bytes of the requests left to the caching allocator (they outlive the span).
    pub fallback_bytes: u64,
    /// The recorded requests the plan was made from (for re-planning and inspection).
    pub requests: Vec<PlanRequest>,
    /// Clock ticks of the span's chunk boundaries (`denoise_end`), as recorded.
    #[serde(default)]
    pub marks: Vec<u64>,
    /// The entries that repeat, once the plan's entries are used up: a session's
    /// steady chunk ([`super::periodic`]); `None` for a plan of the whole span.
    #[serde(default)]
    pub period: Option<PlanPeriod>,
}

/// The last entries of a plan, which repeat for as long as the span goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlanPeriod {
    /// Index of the period's first entry; the period runs to the last entry.
    pub start: usize,
}

impl Plan {
    /// Bytes of every arena together.
    pub fn arena_bytes(&self) -> u64 {
        self.arenas.iter().map(|a| a.1).sum()
    }

    /// Device bytes the span needs beyond what is live before it: its arenas plus its
    /// long-lived requests.
    pub fn peak_bytes(&self) -> u64 {
        self.arena_bytes() + self.fallback_bytes
    }
}

/// One order's placement: arena bytes in all, offsets per request, arenas per stream.
struct Placement {
    total: u64,
    order: PlacementOrder,
    offsets: Vec<u64>,
    arenas: Vec<(u32, u64)>,
}

/// Plans `requests` with every order and keeps the smallest arena (or with `only`).
/// `None` only if the best placement fails its sweep, which would be a bug.
pub fn plan(requests: &[PlanRequest], only: Option<PlacementOrder>) -> Option<Plan> {
    plan_with_twins(requests, only, &[])
}

/// [`plan`] where request `i` and `twins[i]` (when `Some`) get one offset: their
/// lifetimes must not overlap. A trace placed lately is not placed again
/// ([`memo`]).
pub(crate) fn plan_with_twins(
    requests: &[PlanRequest],
    only: Option<PlacementOrder>,
    twins: &[Option<usize>],
) -> Option<Plan> {
    memo::memoized(requests, only, twins, || {
        place_with_twins(requests, only, twins)
    })
}

/// [`plan_with_twins`] placed now.
pub(crate) fn place_with_twins(
    requests: &[PlanRequest],
    only: Option<PlacementOrder>,
    twins: &[Option<usize>],
) -> Option<Plan> {
    let mut streams: Vec<u32> = requests.iter().map(|r| r.stream).collect();
    streams.sort_unstable();
    streams.dedup();
    // A coarse pass over every order and tiered thresholds at quantiles, then a fine
    // pass around the best threshold: a bounded number of placements (a long span gets
    // fewer coarse thresholds), so planning time stops growing with the span.
    let lifetimes = lifetimes(requests);
    let orders: Vec<PlacementOrder> = match only {
        Some(order) => vec![order],
        None => PlacementOrder::ALL
            .into_iter()
            .chain(coarse_tiers(&lifetimes, requests.len()))
            .collect(),
    };
    let mut best = best_placement(requests, &streams, &orders, twins);
    if let Some(PlacementOrder::Tiered(t)) = best.as_ref().map(|b| b.order) {
        let fine = fine_tiers(&lifetimes, t, &orders);
        if let Some(f) = best_placement(requests, &streams, &fine, twins) {
            if best.as_ref().is_none_or(|b| f.total < b.total) {
                best = Some(f);
            }
        }
    }
    let Placement {
        order,
        offsets,
        arenas,
        ..
    } = best?;
    let entries: Vec<PlanEntry> = requests
        .iter()
        .zip(&offsets)
        .map(|(r, &offset)| PlanEntry {
            size: r.size,
            stream: r.stream,
            slot: match r.end {
                Some(_) => Slot::Arena(offset),
                None => Slot::Fallback,
            },
        })
        .collect();
    let fallback_bytes = requests
        .iter()
        .filter(|r| r.end.is_none())
        .map(|r| r.size)
        .sum();
    let plan = Plan {
        entries,
        arenas,
        order,
        live_peak_bytes: live_peak(requests),
        fallback_bytes,
        requests: requests.to_vec(),
        marks: Vec::new(),
        period: None,
    };
    sweep(requests, &plan).ok()?;
    Some(plan)
}

/// Highest sum of live bytes over the span's arena-placed requests.
fn live_peak(requests: &[PlanRequest]) -> u64 {
    let mut events: Vec<(u64, i64)> = Vec::with_capacity(requests.len() * 2);
    for r in requests {
        if let Some(end) = r.end {
            events.push((r.start, r.size as i64));
            events.push((end, -(r.size as i64)));
        }
    }
    events.sort_unstable();
    let (mut live, mut peak) = (0i64, 0i64);
    for (_, delta) in events {
        live += delta;
        peak = peak.max(live);
    }
    peak as u64
}

/// Checks a plan against its requests by sweeping time: no two arena requests of a
/// stream that are live at once share a byte, and every one lies inside its arena.
pub fn sweep(requests: &[PlanRequest], plan: &Plan) -> Result<(), String> {
    if plan.entries.len() != requests.len() {
        return Err(format!(
            "plan has {} entries for {} requests",
            plan.entries.len(),
            requests.len()
        ));
    }
    // (time, is_alloc, index): at equal times frees come first (they cannot: every tick
    // is one event), so the order is only a tie-break.
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        if let (Some(end), Slot::Arena(_)) = (r.end, plan.entries[i].slot) {
            if end <= r.start {
                return Err(format!("request {i} ends at {end} before it starts"));
            }
            events.push((r.start, true, i));
            events.push((end, false, i));
        }
    }
    events.sort_unstable();
    let arena_of = |stream: u32| {
        plan.arenas
            .iter()
            .find(|a| a.0 == stream)
            .map_or(0, |a| a.1)
    };
    let mut live: BTreeMap<(u32, u64), (u64, usize)> = BTreeMap::new();
    for (_, is_alloc, i) in events {
        let r = requests[i];
        let Slot::Arena(offset) = plan.entries[i].slot else {
            continue;
        };
        if !is_alloc {
            live.remove(&(r.stream, offset));
            continue;
        }
        let end = offset + r.size;
        if end > arena_of(r.stream) {
            return Err(format!("request {i} ends past its arena"));
        }
        if let Some((&(s, o), &(e, j))) = live.range(..(r.stream, end)).next_back() {
            if s == r.stream && e > offset {
                return Err(format!(
                    "requests {j} [{o}, {e}) and {i} [{offset}, {end}) overlap while both live"
                ));
            }
        }
        live.insert((r.stream, offset), (end, i));
    }
    Ok(())
}

/// Places `items` (arena requests of one stream) in `order`; writes their offsets and
/// returns the arena size.
fn place(
    requests: &[PlanRequest],
    items: &[usize],
    order: PlacementOrder,
    offsets: &mut [u64],
    twins: &[Option<usize>],
) -> u64 {
    if items.is_empty() {
        return 0;
    }
    let span = |i: usize| {
        let r = &requests[i];
        (r.start, r.end.unwrap_or(r.start + 1))
    };
    let life = |i: usize| {
        let (s, e) = span(i);
        e - s
    };
    let mut sorted = items.to_vec();
    match order {
        PlacementOrder::Size => {
            sorted.sort_by_key(|&i| (std::cmp::Reverse(requests[i].size), requests[i].start))
        }
        PlacementOrder::SizeLifetime => sorted.sort_by_key(|&i| {
            (
                std::cmp::Reverse(u128::from(requests[i].size) * u128::from(life(i))),
                requests[i].start,
            )
        }),
        PlacementOrder::Lifetime => sorted.sort_by_key(|&i| {
            (
                std::cmp::Reverse(life(i)),
                std::cmp::Reverse(requests[i].size),
                requests[i].start,
            )
        }),
        PlacementOrder::Start => sorted.sort_by_key(|&i| requests[i].start),
        PlacementOrder::Tiered(ticks) => sorted.sort_by_key(|&i| {
            if life(i) > ticks {
                (0, 0, requests[i].start)
            } else {
                (1, u64::MAX - requests[i].size, requests[i].start)
            }
        }),
        PlacementOrder::Conflicts => {
            let conflicts = conflict_bytes(requests, items);
            sorted.sort_by_key(|&i| {
                (
                    std::cmp::Reverse(conflicts[&i]),
                    std::cmp::Reverse(requests[i].size),
                    requests[i].start,
                )
            })
        }
    }
    place_sorted(requests, &sorted, offsets, twins)
}

/// Places requests in exactly the order `sorted` (best fit), a request and its twin
/// together at one offset; returns the arena size.
fn place_sorted(
    requests: &[PlanRequest],
    sorted: &[usize],
    offsets: &mut [u64],
    twins: &[Option<usize>],
) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let span = |i: usize| {
        let r = &requests[i];
        (r.start, r.end.unwrap_or(r.start + 1))
    };
    let items = sorted;
    let horizon = items.iter().map(|&i| span(i).1).max().unwrap_or(1);
    let width = (horizon / 4096).max(32);
    let buckets = (horizon / width + 1) as usize;
    // The time buckets a request's lifetime touches.
    let touched = |i: usize| {
        let (s, e) = span(i);
        (s / width) as usize..=((e - 1) / width) as usize
    };
    let mut index: Vec<Vec<usize>> = vec![Vec::new(); buckets];
    let mut stamp = vec![usize::MAX; requests.len()];
    let mut arena = 0u64;
    let mut overlapping: Vec<(u64, u64)> = Vec::new();
    let mut placed = vec![false; requests.len()];
    for (n, &i) in sorted.iter().enumerate() {
        if placed[i] {
            continue;
        }
        let size = requests[i].size;
        let twin = twins.get(i).copied().flatten().filter(|&t| !placed[t]);
        let members = [Some(i), twin];
        overlapping.clear();
        for &m in members.iter().flatten() {
            let (s, e) = span(m);
            for bucket in &index[touched(m)] {
                for &j in bucket {
                    if stamp[j] == n {
                        continue;
                    }
                    let (sj, ej) = span(j);
                    if sj < e && s < ej {
                        stamp[j] = n;
                        overlapping.push((offsets[j], offsets[j] + requests[j].size));
                    }
                }
            }
        }
        overlapping.sort_unstable();
        // Best fit: the smallest gap that holds the request; else above everything.
        let mut best: Option<(u64, u64)> = None;
        let mut top = 0u64;
        for &(o, end) in &overlapping {
            if o >= top + size {
                let gap = o - top;
                if best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, top));
                }
            }
            top = top.max(end);
        }
        let offset = best.map_or(top, |(_, o)| o);
        arena = arena.max(offset + size);
        for &m in members.iter().flatten() {
            offsets[m] = offset;
            placed[m] = true;
            for bucket in &mut index[touched(m)] {
                bucket.push(m);
            }
        }
    }
    arena
}

/// For each item, the highest sum of live bytes (of `items`) during its lifetime.
fn conflict_bytes(
    requests: &[PlanRequest],
    items: &[usize],
) -> std::collections::HashMap<usize, u64> {
    // Live bytes after each event, on a compressed clock; a sparse table answers range
    // maxima.
    let mut events: Vec<(u64, i64)> = Vec::with_capacity(items.len() * 2);
    for &i in items {
        let r = &requests[i];
        let end = r.end.unwrap_or(r.start + 1);
        events.push((r.start, r.size as i64));
        events.push((end, -(r.size as i64)));
    }
    events.sort_unstable();
    let times: Vec<u64> = events.iter().map(|e| e.0).collect();
    let mut live = 0i64;
    let profile: Vec<u64> = events
        .iter()
        .map(|e| {
            live += e.1;
            live.max(0) as u64
        })
        .collect();
    let mut table = vec![profile];
    let mut width = 1;
    while width * 2 <= times.len() {
        let prev = &table[table.len() - 1];
        let next: Vec<u64> = (0..prev.len() - width)
            .map(|k| prev[k].max(prev[k + width]))
            .collect();
        table.push(next);
        width *= 2;
    }
    let range_max = |lo: usize, hi: usize| {
        // Inclusive lo..=hi.
        let len = hi - lo + 1;
        let level = (usize::BITS - 1 - len.leading_zeros()) as usize;
        table[level][lo].max(table[level][hi + 1 - (1 << level)])
    };
    items
        .iter()
        .map(|&i| {
            let r = &requests[i];
            let end = r.end.unwrap_or(r.start + 1);
            let lo = times.partition_point(|&t| t < r.start);
            let hi = times
                .partition_point(|&t| t < end)
                .saturating_sub(1)
                .max(lo);
            (i, range_max(lo, hi))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(size: u64, start: u64, end: u64) -> PlanRequest {
        PlanRequest {
            size,
            stream: 0,
            start,
            end: Some(end),
        }
    }

    #[test]
    fn disjoint_lifetimes_share_one_range() {
        let requests = [req(1024, 0, 1), req(1024, 2, 3), req(1024, 4, 5)];
        let plan = plan(&requests, None).unwrap();
        assert_eq!(plan.arena_bytes(), 1024);
        assert_eq!(plan.live_peak_bytes, 1024);
    }

    #[test]
    fn every_order_passes_the_sweep_and_the_best_is_kept() {
        // A ladder of overlapping lifetimes with mixed sizes.
        let mut requests = Vec::new();
        let mut t = 0;
        for k in 0..40u64 {
            let size = 512 * (1 + (k * 7) % 13);
            requests.push(req(size, t, t + 5 + (k % 4) * 3));
            t += 2;
        }
        // Re-number the clock so every tick is one event, as the recorder does.
        let mut ticks: Vec<(u64, usize, bool)> = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            ticks.push((r.start * 2, i, true));
            ticks.push((r.end.unwrap() * 2 + 1, i, false));
        }
        ticks.sort_unstable();
        for (tick, &(_, i, is_alloc)) in ticks.iter().enumerate() {
            if is_alloc {
                requests[i].start = tick as u64;
            } else {
                requests[i].end = Some(tick as u64);
            }
        }
        let best = plan(&requests, None).unwrap();
        for order in PlacementOrder::ALL {
            let p = plan(&requests, Some(order)).unwrap();
            sweep(&requests, &p).unwrap();
            assert!(best.arena_bytes() <= p.arena_bytes(), "{order}");
            assert!(p.arena_bytes() >= p.live_peak_bytes);
        }
    }

    #[test]
    fn requests_that_outlive_the_span_fall_back() {
        let requests = [
            req(2048, 0, 3),
            PlanRequest {
                size: 4096,
                stream: 0,
                start: 1,
                end: None,
            },
        ];
        let plan = plan(&requests, None).unwrap();
        assert_eq!(plan.entries[1].slot, Slot::Fallback);
        assert_eq!(plan.fallback_bytes, 4096);
        assert_eq!(plan.arena_bytes(), 2048);
        assert_eq!(plan.peak_bytes(), 6144);
    }

    #[test]
    fn streams_get_arenas_of_their_own() {
        let mut b = req(1024, 2, 3);
        b.stream = 1;
        let plan = plan(&[req(1024, 0, 1), b], None).unwrap();
        assert_eq!(plan.arenas, vec![(0, 1024), (1, 1024)]);
    }

    #[test]
    fn the_sweep_rejects_overlapping_live_ranges() {
        let requests = [req(1024, 0, 3), req(1024, 1, 2)];
        let mut p = plan(&requests, None).unwrap();
        p.entries[1].slot = Slot::Arena(512);
        assert!(sweep(&requests, &p).unwrap_err().contains("overlap"));
    }
}
