//! Properties of the allocator on random traces, for both policies.

use headroom_mem::{
    replay, AllocatorConfig, AllocatorPolicy, CachingPlatform, Platform, ReclaimPolicy, TraceOp,
    MIB,
};
use proptest::prelude::*;

const CAPACITY: u64 = 512 * MIB;

#[derive(Debug, Clone)]
enum Step {
    Alloc { size: u64, stream: u32 },
    Free { pick: usize },
    EmptyCache,
}

fn step() -> impl Strategy<Value = Step> {
    let size = prop_oneof![
        4 => 1u64..=4096,
        3 => 4097u64..=MIB,
        3 => MIB + 1..=12 * MIB,
        1 => 12 * MIB..=96 * MIB,
    ];
    prop_oneof![
        6 => (size, 0u32..2).prop_map(|(size, stream)| Step::Alloc { size, stream }),
        4 => any::<usize>().prop_map(|pick| Step::Free { pick }),
        1 => Just(Step::EmptyCache),
    ]
}

fn policy() -> impl Strategy<Value = AllocatorPolicy> {
    prop_oneof![
        Just(AllocatorPolicy::Pytorch),
        Just(AllocatorPolicy::Expandable)
    ]
}

fn platform(policy: AllocatorPolicy) -> CachingPlatform {
    CachingPlatform::sim(
        CAPACITY,
        AllocatorConfig::with_policy(policy),
        ReclaimPolicy::Never,
    )
    .unwrap()
}

/// Turns random steps into a well-formed trace (frees name live ids).
fn to_trace(steps: &[Step]) -> Vec<TraceOp> {
    let mut live: Vec<u64> = Vec::new();
    let mut next = 0;
    let mut ops = Vec::new();
    for s in steps {
        match *s {
            Step::Alloc { size, stream } => {
                ops.push(TraceOp::Alloc {
                    id: next,
                    size,
                    stream,
                });
                live.push(next);
                next += 1;
            }
            Step::Free { pick } if !live.is_empty() => {
                let id = live.swap_remove(pick % live.len());
                ops.push(TraceOp::Free { id });
            }
            Step::Free { .. } => {}
            Step::EmptyCache => ops.push(TraceOp::EmptyCache),
        }
    }
    ops
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn live_blocks_never_overlap_and_allocated_stays_within_reserved_within_capacity(
        policy in policy(),
        steps in prop::collection::vec(step(), 1..200),
    ) {
        let platform = platform(policy);
        let allocator = platform.allocator();
        let mut live = Vec::new();
        for s in &steps {
            match *s {
                Step::Alloc { size, stream } => {
                    if let Ok(a) = allocator.allocate(size, stream) {
                        prop_assert!(a.size() >= size);
                        live.push(a);
                    }
                }
                Step::Free { pick } if !live.is_empty() => {
                    let index = pick % live.len();
                    live.swap_remove(index);
                }
                Step::Free { .. } => {}
                Step::EmptyCache => allocator.empty_cache(),
            }
            let mut ranges: Vec<(u64, u64)> = live.iter().map(|a| (a.addr(), a.addr() + a.size())).collect();
            ranges.sort_unstable();
            for pair in ranges.windows(2) {
                prop_assert!(pair[0].1 <= pair[1].0, "overlap: {:?}", pair);
            }
            let stats = allocator.stats();
            let allocated = stats.allocated_bytes.all().current;
            let reserved = stats.reserved_bytes.all().current;
            prop_assert!(0 <= allocated && allocated <= reserved, "{allocated} > {reserved}");
            prop_assert!(reserved as u64 <= CAPACITY);
            prop_assert_eq!(allocated as u64, live.iter().map(|a| a.size()).sum::<u64>());
            if let Err(e) = allocator.check_invariants() {
                return Err(TestCaseError::fail(e));
            }
        }
    }

    #[test]
    fn freeing_everything_then_empty_cache_leaves_nothing_reserved(
        policy in policy(),
        steps in prop::collection::vec(step(), 1..200),
    ) {
        let platform = platform(policy);
        let ops = to_trace(&steps);
        replay(&platform, &ops);
        // replay drops what is still live at the end.
        platform.empty_cache();
        let stats = platform.memory_stats();
        prop_assert_eq!(stats.allocated_bytes.all().current, 0);
        prop_assert_eq!(stats.reserved_bytes.all().current, 0);
        prop_assert_eq!(stats.segment.all().current, 0);
        prop_assert_eq!(platform.mem_info().0, CAPACITY);
    }

    #[test]
    fn replay_is_deterministic(
        policy in policy(),
        steps in prop::collection::vec(step(), 1..200),
    ) {
        let ops = to_trace(&steps);
        let run = || {
            let platform = platform(policy);
            platform.allocator().set_history(100_000);
            let report = replay(&platform, &ops);
            (report, platform.allocator().trace())
        };
        let (first, first_trace) = run();
        let (second, second_trace) = run();
        prop_assert_eq!(first, second);
        prop_assert_eq!(first_trace, second_trace);
    }
}
