//! A hundred sessions through one server, four at a time, of two resolutions, with
//! clients hanging up at random points: nobody is refused while the queue has room,
//! nothing runs out of memory, and once the last session ends the device holds exactly
//! the weights and the KV pool.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use headroom_engine::EngineConfig;
use headroom_mem::{AllocatorConfig, AllocatorPolicy, ReclaimPolicy};
use headroom_server::ServerConfig;
use serde_json::{json, Value};

use common::*;

const SESSIONS: usize = 100;

/// Session `i`: its size (6 or 24 tokens a frame: one KV page a frame or two), length,
/// seed and where its client hangs up (`None`: never).
fn plan(i: usize) -> (usize, usize, usize, Option<usize>) {
    // A small deterministic mix (splitmix64 of the index).
    let mut z = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let (w, h) = if z & 1 == 0 { (48, 32) } else { (96, 64) };
    let frames = if z & 2 == 0 { 9 } else { 21 };
    // One in four hangs up: before its first chunk, or after one.
    let hang_up = match (z >> 2) & 7 {
        0 => Some(0),
        1 => Some(1),
        _ => None,
    };
    (w, h, frames, hang_up)
}

/// Runs session `i` as its client would; returns every `error` the server sent.
async fn client(ts: &TestServer, i: usize) -> Vec<Value> {
    let (w, h, frames, hang_up) = plan(i);
    let mut ws = ts.connect().await;
    send(
        &mut ws,
        json!({"type": "session.start", "model": "tiny", "format": "m4s", "width": w,
               "height": h, "num_frames": frames, "seed": i, "fps": 16}),
    )
    .await;
    let mut errors = Vec::new();
    loop {
        let v = recv_json(&mut ws).await;
        match v["type"].as_str() {
            Some("video.start") => break,
            Some("session.queued") => {}
            _ => {
                errors.push(v);
                return errors;
            }
        }
    }
    if hang_up == Some(0) {
        return errors;
    }
    let mut chunks = 0;
    loop {
        match recv(&mut ws).await {
            In::Bin(_) => {
                chunks += 1;
                if hang_up == Some(chunks) {
                    return errors;
                }
            }
            In::Json(v) if v["type"] == "session.done" => {
                assert_eq!(v["chunks"], (frames + 3) / 12, "session {i}: {v}");
                return errors;
            }
            In::Json(v) if v["type"] == "error" => errors.push(v),
            In::Json(_) => {}
            In::Closed => {
                errors.push(json!({"closed": i}));
                return errors;
            }
        }
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_mixed_sessions_four_at_a_time_leave_the_weights_and_the_pool() {
    // Room for four of the larger sessions: 18 frames × 2 pages each.
    let page = 2 * 2 * 16 * 4 * 12 * 4;
    let engine = EngineConfig {
        allocator: AllocatorConfig::with_policy(AllocatorPolicy::Planned),
        reclaim: ReclaimPolicy::BeforeDecode,
        kv_budget_bytes: Some(4 * 36 * page),
        ..EngineConfig::default()
    };
    let config = ServerConfig {
        max_sessions: 4,
        max_queue: 8,
        ..ServerConfig::default()
    };
    let ts = Arc::new(TestServer::start_with(engine, config).await);
    let next = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (ts, next) = (Arc::clone(&ts), Arc::clone(&next));
            tokio::spawn(async move {
                let mut errors = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= SESSIONS {
                        return errors;
                    }
                    errors.extend(client(&ts, i).await);
                }
            })
        })
        .collect();
    let mut errors = Vec::new();
    for c in clients {
        errors.extend(c.await.unwrap());
    }
    assert!(errors.is_empty(), "{errors:?}");
    let hung_up = (0..SESSIONS).filter(|&i| plan(i).3.is_some()).count();
    let large = (0..SESSIONS).filter(|&i| plan(i).0 == 96).count();
    assert!(
        hung_up > 10 && large > 30 && large < 70,
        "{hung_up} {large}"
    );
    ts.idle().await;
    let (_, m) = ts.get("/metrics").await;
    assert_eq!(metric(&m, "headroom_sessions_refused_total"), 0.0, "{m}");
    assert_eq!(metric(&m, "headroom_ooms_total"), 0.0);
    assert_eq!(metric(&m, "headroom_sessions_failed_total"), 0.0);
    // A client that hangs up mid-session leaves it parked for its resume token (a
    // stop before the first chunk boundary ends it), off the device either way.
    assert_eq!(
        metric(&m, "headroom_sessions_completed_total")
            + metric(&m, "headroom_sessions_stopped_total")
            + metric(&m, "headroom_sessions_parked_total"),
        SESSIONS as f64,
        "every session ended: completed, stopped or parked"
    );
    ts.assert_pool_free();
    // What stays: the weights and the pool, to the byte.
    let resident = ts.server.engine().resident();
    assert_eq!(resident.kv_pool_bytes, 4 * 36 * page);
    assert_eq!(ts.allocated_bytes() as u64, resident.total());
    let reserved = metric(&m, "headroom_reserved_bytes");
    eprintln!(
        "after {SESSIONS} sessions ({hung_up} hung up, {large} at 96×64): allocated {} = weights {} + pool {}; reserved {reserved}",
        ts.allocated_bytes(),
        resident.weights_bytes,
        resident.kv_pool_bytes
    );
    // The sleep reclaim leaves only the segments that hold them (measured: 1.001×).
    assert!(
        reserved <= 1.01 * resident.total() as f64,
        "reserved {reserved} for {} resident",
        resident.total()
    );
    match Arc::try_unwrap(ts) {
        Ok(ts) => ts.stop().await,
        Err(_) => panic!("a client still holds the server"),
    }
}
