//! Sessions stepped together by the scheduler (their forwards batched) stream the bytes
//! each gives alone: 1, 2 and 4 sessions with different prompts, camera scripts, seeds,
//! lengths and start times, camera guidance or none, one of them hung up mid-stream; and
//! under the planned allocator, batched rounds replaying the plans of their compositions
//! (tiny model).

use headroom_engine::{scheduler, Engine, EngineConfig, EngineError, Session, SessionRequest};
use headroom_mem::{AllocatorConfig, AllocatorPolicy, PlannedOptions};
use headroom_model::camera::Keys;
use headroom_model::DecoderKind;
use headroom_tensor::{DType, Device, Tensor};

fn engine() -> Engine {
    engine_with(AllocatorPolicy::Pytorch)
}

fn engine_with(policy: AllocatorPolicy) -> Engine {
    engine_for(policy, DecoderKind::Full)
}

fn engine_for(policy: AllocatorPolicy, decoder: DecoderKind) -> Engine {
    let engine = Engine::new(EngineConfig {
        model: "tiny".to_string(),
        kv_budget_bytes: Some(64 << 20),
        max_sessions: 4,
        allocator: AllocatorConfig::with_policy(policy),
        decoder,
        ..EngineConfig::default()
    })
    .unwrap();
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

/// Four different sessions: two sizes (ragged token runs in one forward, token pages of
/// one KV pool), two lengths, prompts or none, keys or none, two camera guidance scales
/// (their still-camera forwards ride in the same batch) or none.
fn request(k: usize) -> SessionRequest {
    let keys = |s: &str| s.split(' ').map(|k| Keys::parse(k).unwrap()).collect();
    let dev = Device::cpu().unwrap();
    let frames = [33, 21, 21, 33][k];
    SessionRequest {
        seed: 10 + k as u64,
        text_embeds: (k % 2 == 1)
            .then(|| Tensor::randn(&[3 + k, 16], 50 + k as u64, 0, DType::F32, &dev).unwrap()),
        actions: match k {
            0 => keys("w w d d j j l l i"),
            2 => keys("a s k"),
            _ => Vec::new(),
        },
        camera_guidance: [Some(2.0), None, Some(0.5), None][k],
        ..SessionRequest::new([48, 64, 48, 64][k], [32, 48, 32, 48][k], frames)
    }
}

fn frames(chunk: Result<headroom_engine::Chunk, EngineError>) -> Vec<u8> {
    chunk.unwrap().frames.to_vec::<u8>().unwrap()
}

/// Each request's chunks, run alone.
fn alone(engine: &Engine, n: usize) -> Vec<Vec<Vec<u8>>> {
    alone_as(engine, n, request)
}

/// The chunks of `request(k)` for k < n, each run alone.
fn alone_as(
    engine: &Engine,
    n: usize,
    request: impl Fn(usize) -> SessionRequest,
) -> Vec<Vec<Vec<u8>>> {
    (0..n)
        .map(|k| {
            let mut s = engine.open_session(request(k)).unwrap();
            (0..s.chunks_total().unwrap())
                .map(|_| frames(s.next_chunk()))
                .collect()
        })
        .collect()
}

#[test]
fn sessions_stepped_together_stream_the_bytes_each_streams_alone() {
    let expected = alone(&engine(), 4);
    for policy in [AllocatorPolicy::Pytorch, AllocatorPolicy::Planned] {
        stepped_together(&engine_with(policy), &expected);
    }
}

/// Runs 1, 2 and 4 sessions stepped together and checks each against `expected`; under
/// the planned allocator, every span ends with its session and reserved memory goes
/// back to what one session alone leaves.
fn stepped_together(engine: &Engine, expected: &[Vec<Vec<u8>>]) {
    alone(engine, 1);
    let floor = engine.platform().memory_stats();
    for n in [1, 2, 4] {
        let mut sessions: Vec<Session> = (0..n)
            .map(|k| engine.open_session(request(k)).unwrap())
            .collect();
        let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(); n];
        loop {
            let mut live: Vec<(usize, &mut Session)> = sessions
                .iter_mut()
                .enumerate()
                .filter(|(_, s)| s.chunks_total().is_some_and(|t| s.chunks_done() < t))
                .collect();
            if live.is_empty() {
                break;
            }
            let (ids, mut refs): (Vec<usize>, Vec<&mut Session>) = live.drain(..).unzip();
            for (k, chunk) in ids.into_iter().zip(scheduler::next_chunks(&mut refs)) {
                got[k].push(frames(chunk));
            }
        }
        for k in 0..n {
            assert_eq!(got[k].len(), expected[k].len(), "{n} sessions, session {k}");
            for (c, (a, b)) in got[k].iter().zip(&expected[k]).enumerate() {
                assert!(
                    a == b,
                    "{n} sessions: session {k} chunk {c} differs from alone"
                );
            }
        }
        drop(sessions);
        let c = engine.platform().allocator().span_commitments();
        assert_eq!((c.live_spans, c.arena_bytes), (0, 0), "{n} sessions");
        let after = engine.platform().memory_stats();
        assert_eq!(
            after.allocated_bytes.all().current,
            floor.allocated_bytes.all().current,
            "{n} sessions"
        );
    }
}

#[test]
fn a_late_start_and_a_hang_up_leave_the_other_streams_unchanged() {
    let engine = engine();
    let expected = alone(&engine, 4);
    let floor = engine
        .platform()
        .memory_stats()
        .allocated_bytes
        .all()
        .current;
    let mut a = engine.open_session(request(0)).unwrap();
    let mut b = engine.open_session(request(1)).unwrap();
    let hang_up = headroom_engine::CancelToken::new();
    b.set_cancel(hang_up.clone());
    // Round 1: a and b together.
    let r = scheduler::next_chunks(&mut [&mut a, &mut b]);
    let mut got_a = Vec::new();
    let mut results = r.into_iter();
    got_a.push(frames(results.next().unwrap()));
    assert!(frames(results.next().unwrap()) == expected[1][0]);
    // b hangs up; c and d join.
    hang_up.cancel();
    let mut c = engine.open_session(request(2)).unwrap();
    let mut d = engine.open_session(request(3)).unwrap();
    let r = scheduler::next_chunks(&mut [&mut a, &mut b, &mut c, &mut d]);
    let mut results = r.into_iter();
    got_a.push(frames(results.next().unwrap()));
    assert!(matches!(
        results.next().unwrap(),
        Err(EngineError::Cancelled { .. })
    ));
    let got_c = frames(results.next().unwrap());
    let got_d = frames(results.next().unwrap());
    assert!(got_c == expected[2][0] && got_d == expected[3][0]);
    let r = scheduler::next_chunks(&mut [&mut a, &mut c, &mut d]);
    let mut results = r.into_iter();
    got_a.push(frames(results.next().unwrap()));
    assert!(frames(results.next().unwrap()) == expected[2][1]);
    assert!(frames(results.next().unwrap()) == expected[3][1]);
    assert_eq!(got_a, expected[0]);
    // A finished session in a batch says so; the others go on.
    let r = scheduler::next_chunks(&mut [&mut a, &mut d]);
    assert!(matches!(r[0], Err(EngineError::Finished(_))));
    assert!(r[1]
        .as_ref()
        .is_ok_and(|c| c.frames.to_vec::<u8>().unwrap() == expected[3][2]));
    drop(r);
    for s in [a, b, c, d] {
        s.close();
    }
    assert_eq!(
        engine
            .platform()
            .memory_stats()
            .allocated_bytes
            .all()
            .current,
        floor,
        "every session's bytes are back"
    );
}

/// Four sessions of one shape; two follow key scripts as long as they are (the twin
/// plans a round on shorter sessions, their scripts cut to fit).
fn round_request(k: usize) -> SessionRequest {
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
                sessions[k] = Some(engine.open_session(round_request(k)).unwrap());
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
        let engine = engine_for(AllocatorPolicy::Planned, decoder);
        engine.set_batched_steps(true);
        let alone = alone_as(&engine, 4, round_request);
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
