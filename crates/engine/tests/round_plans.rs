//! Batched rounds under the planned allocator replay plans of their own: four sessions
//! stepped together, started together and staggered, each round's allocations placed by
//! the plan the meta twin made for its composition (no misses), the bytes those of each
//! session alone (tiny model).

use headroom_engine::{scheduler, Engine, EngineConfig, Session, SessionRequest};
use headroom_mem::{AllocatorConfig, AllocatorPolicy, PlannedOptions};
use headroom_model::camera::Keys;
use headroom_model::DecoderKind;

fn engine(decoder: DecoderKind) -> Engine {
    let engine = Engine::new(EngineConfig {
        model: "tiny".to_string(),
        kv_budget_bytes: Some(64 << 20),
        max_sessions: 4,
        allocator: AllocatorConfig::with_policy(AllocatorPolicy::Planned),
        decoder,
        ..EngineConfig::default()
    })
    .unwrap();
    engine.set_batched_steps(true);
    // A tensor that read a freed arena range would turn to NaN and change the frames.
    engine
        .platform()
        .allocator()
        .set_planned_options(PlannedOptions {
            poison: true,
            ..PlannedOptions::default()
        });
    engine
}

/// Four sessions of one shape; two follow key scripts as long as they are (the twin
/// plans a round on shorter sessions, their scripts cut to fit).
fn request(k: usize) -> SessionRequest {
    let keys = |s: &str| s.split(' ').map(|k| Keys::parse(k).unwrap()).collect();
    SessionRequest {
        seed: 30 + k as u64,
        actions: match k {
            1 => keys("w w w d d d j j j l l l"),
            3 => keys("a s a s a s i i i k k k"),
            _ => Vec::new(),
        },
        ..SessionRequest::new(48, 32, 45)
    }
}

/// Runs `requests` stepped together, session k joining at round `starts[k]`; returns
/// each session's frames.
fn together(engine: &Engine, starts: &[usize]) -> Vec<Vec<Vec<u8>>> {
    let mut sessions: Vec<Option<Session>> = (0..starts.len()).map(|_| None).collect();
    let mut out = vec![Vec::new(); starts.len()];
    for round in 0.. {
        for (k, &start) in starts.iter().enumerate() {
            if start == round {
                sessions[k] = Some(engine.open_session(request(k)).unwrap());
            }
        }
        let live: Vec<usize> = (0..starts.len())
            .filter(|&k| {
                sessions[k]
                    .as_ref()
                    .is_some_and(|s| s.chunks_done() < s.chunks_total().unwrap())
            })
            .collect();
        if live.is_empty() && starts.iter().all(|&s| s < round) {
            break;
        }
        let mut refs: Vec<&mut Session> = sessions
            .iter_mut()
            .enumerate()
            .filter(|(k, _)| live.contains(k))
            .filter_map(|(_, s)| s.as_mut())
            .collect();
        for (k, chunk) in live.iter().zip(scheduler::next_chunks(&mut refs)) {
            out[*k].push(chunk.unwrap().frames.to_vec::<u8>().unwrap());
        }
    }
    out
}

#[test]
fn batched_rounds_replay_the_plans_of_their_compositions() {
    for decoder in [DecoderKind::Full, DecoderKind::Tiny] {
        let engine = engine(decoder);
        let alone: Vec<Vec<Vec<u8>>> = (0..4)
            .map(|k| {
                let mut s = engine.open_session(request(k)).unwrap();
                (0..s.chunks_total().unwrap())
                    .map(|_| s.next_chunk().unwrap().frames.to_vec::<u8>().unwrap())
                    .collect()
            })
            .collect();
        for starts in [[0, 0, 0, 0], [0, 1, 1, 2]] {
            // The first run meets every composition new, the second replays the plans
            // the first installed: the same hits, so the first run's plans came from
            // the twin too (a round recorded here would count none).
            let mut hits = Vec::new();
            for _ in 0..2 {
                let before = engine.platform().memory_stats();
                let got = together(&engine, &starts);
                let after = engine.platform().memory_stats();
                assert_eq!(got, alone, "{decoder:?} {starts:?}: bytes as alone");
                let misses = after.planned_misses - before.planned_misses;
                hits.push(after.planned_hits - before.planned_hits);
                eprintln!("{decoder:?} {starts:?}: {hits:?} hits, {misses} misses");
                assert_eq!(
                    misses, 0,
                    "{decoder:?} {starts:?}: every round replays its plan"
                );
            }
            assert!(hits[0] > 0);
            assert_eq!(
                hits[0], hits[1],
                "{decoder:?} {starts:?}: a round was recorded"
            );
        }
    }
}
