//! The admission queue and serving under load, end to end on the `tiny` model at 48×32:
//! clients that find every slot taken wait first come first served (`session.queued`
//! with how many are ahead) instead of being refused; a full queue and a queue timeout
//! refuse with `capacity` naming the limit; clients that hang up or stop — queued or
//! mid-chunk — leave nothing behind, and every other client is served.
//!
//! No test measures speed: waits are for events, each bounded by a generous guard.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::SinkExt;
use headroom_server::{Limits, ServerConfig};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use common::*;

fn config(max_sessions: usize) -> ServerConfig {
    ServerConfig {
        max_sessions,
        ..ServerConfig::default()
    }
}

/// Waits until `n` clients wait in the queue.
async fn until_queued(ts: &TestServer, n: usize) {
    tokio::time::timeout(GUARD, async {
        while ts.server.queued() != n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the queue never reached its length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_starting_together_against_one_slot_are_both_served_the_second_after_the_first()
{
    let ts = TestServer::start(config(1), None).await;
    let (mut a, mut b) = (ts.connect().await, ts.connect().await);
    send(&mut a, start_msg(33, 1)).await;
    send(&mut b, start_msg(33, 2)).await;
    let (first_a, first_b) = (recv_json(&mut a).await, recv_json(&mut b).await);
    // Whichever the server took first streams; the other waits with nobody ahead.
    let (mut first, mut second, queued) = match (first_a["type"].as_str(), first_b["type"].as_str())
    {
        (Some("video.start"), Some("session.queued")) => (a, b, first_b),
        (Some("session.queued"), Some("video.start")) => (b, a, first_a),
        other => panic!("one starts, one queues: {other:?}"),
    };
    assert_eq!(queued["ahead"], 0, "{queued}");
    assert_eq!(queued["position"], 1);
    assert!(queued["request_id"]
        .as_str()
        .unwrap()
        .starts_with("video_stream-"));
    // Held while queued, acknowledged now, applied from the session's first chunk.
    send(&mut second, velocity("early")).await;
    assert_eq!(
        recv_json(&mut second).await["type"],
        "session.interaction.queued"
    );
    assert_eq!(ts.server.queued(), 1);
    let done = stream_to_end(&mut first).await.end.unwrap();
    assert_eq!(done["stopped"], false, "{done}");
    let start = recv_json(&mut second).await;
    assert_eq!(start["type"], "video.start", "{start}");
    assert_eq!(start["request_id"], queued["request_id"]);
    assert!(start["queue_wait_ms"].as_f64().unwrap() > 0.0, "{start}");
    let out = stream_to_end(&mut second).await;
    assert_eq!(out.end.unwrap()["stopped"], false);
    assert_eq!(out.binaries.len(), 3);
    assert_eq!(out.metadata[0]["started_event_ids"], json!(["early"]));
    ts.idle().await;
    assert_eq!(ts.metric("headroom_queue_admitted_total").await, 1.0);
    assert_eq!(ts.metric("headroom_queue_wait_seconds_count").await, 2.0);
    assert_eq!(ts.metric("headroom_sessions_rejected_total").await, 0.0);
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_naming_max_queue_and_ready_says_no_until_a_waiting_client_leaves() {
    // A queued-but-accepted client counts as served here (balancers.rs holds the default).
    let config = ServerConfig {
        max_queue: 1,
        ready_when_queueing: true,
        ..config(1)
    };
    let ts = TestServer::start(config, None).await;
    let (mut a, _) = open(&ts, 117, 1).await;
    // A queue with room: ready although every slot is taken.
    assert_eq!(ts.get("/ready").await.0, 200);
    let mut b = ts.connect().await;
    send(&mut b, start_msg(9, 2)).await;
    assert_eq!(recv_json(&mut b).await["type"], "session.queued");
    let (status, body) = ts.get("/ready").await;
    assert_eq!(status, 503);
    assert!(body.contains("--max-queue"), "{body}");
    assert_eq!(ts.metric("headroom_queue_waiting").await, 1.0);
    let mut c = ts.connect().await;
    send(&mut c, start_msg(9, 3)).await;
    let e = expect_error(&mut c, "capacity").await;
    assert!(
        e["message"].as_str().unwrap().contains("--max-queue"),
        "{e}"
    );
    // A queued client that stops leaves the queue with session.done.
    send(&mut b, json!({"type": "session.stop"})).await;
    let done = recv_json(&mut b).await;
    assert_eq!(done["type"], "session.done");
    assert_eq!(
        (done["chunks"].as_u64(), done["stopped"].as_bool()),
        (Some(0), Some(true))
    );
    until_queued(&ts, 0).await;
    assert_eq!(ts.get("/ready").await.0, 200);
    // A queued client that hangs up leaves it too.
    let mut d = ts.connect().await;
    send(&mut d, start_msg(9, 4)).await;
    assert_eq!(recv_json(&mut d).await["type"], "session.queued");
    drop(d);
    until_queued(&ts, 0).await;
    send(&mut a, json!({"type": "session.stop"})).await;
    assert_eq!(stream_to_end(&mut a).await.end.unwrap()["stopped"], true);
    ts.idle().await;
    ts.assert_pool_free();
    let (_, metrics) = ts.get("/metrics").await;
    assert!(
        metrics.contains("headroom_sessions_refused_total{reason=\"queue_full\"} 1"),
        "{metrics}"
    );
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_timeout_refuses_a_waiting_client_and_queue_time_never_counts_as_a_stall() {
    let stall = Duration::from_millis(100);
    let config = ServerConfig {
        queue_timeout: Duration::from_millis(100),
        ..config(1)
    };
    let ts = TestServer::start(config, None).await;
    // `a` holds the slot, kept alive by pings, until the test stops it.
    let (mut a, _) = open(&ts, 117, 1).await;
    let mut b = ts.connect().await;
    send(&mut b, start_msg(9, 2)).await;
    assert_eq!(recv_json(&mut b).await["type"], "session.queued");
    let e = expect_error(&mut b, "capacity").await;
    assert!(
        e["message"].as_str().unwrap().contains("--queue-timeout"),
        "{e}"
    );
    send(&mut a, json!({"type": "session.stop"})).await;
    stream_to_end(&mut a).await;
    ts.idle().await;
    let (_, metrics) = ts.get("/metrics").await;
    assert!(
        metrics.contains("headroom_sessions_refused_total{reason=\"queue_timeout\"} 1"),
        "{metrics}"
    );
    ts.stop().await;

    // With a long queue timeout, a client waits longer than the stall timeout and is
    // then served: its wait is not a stall.
    let config = ServerConfig {
        limits: Limits {
            stall_timeout: stall,
            ..Limits::default()
        },
        ..ServerConfig::default()
    };
    let ts = TestServer::start(config, None).await;
    // `a` is larger than `b` so that it lasts; the pool changes layout when `b` opens.
    let mut a = ts.connect().await;
    let mut long = start_msg(117, 1);
    long["width"] = json!(96);
    long["height"] = json!(64);
    send(&mut a, long).await;
    assert_eq!(recv_json(&mut a).await["type"], "video.start");
    let mut b = ts.connect().await;
    send(&mut b, start_msg(21, 2)).await;
    let queued_at = Instant::now();
    assert_eq!(recv_json(&mut b).await["type"], "session.queued");
    // `a` streams while `b` waits three stall timeouts; pings keep `a` itself alive
    // whatever a chunk takes.
    let hold = tokio::spawn(async move {
        let until = tokio::time::Instant::now() + stall * 3;
        let mut chunks = 0;
        while tokio::time::Instant::now() < until {
            tokio::select! {
                m = recv(&mut a) => match m {
                    In::Json(v) if v["type"] == "video.chunk_metadata" => chunks += 1,
                    In::Json(v) if v["type"] == "session.done" => return (chunks, Some(v)),
                    In::Closed => return (chunks, None),
                    _ => {}
                },
                _ = tokio::time::sleep(stall / 5) => {
                    send(&mut a, json!({"type": "session.ping"})).await;
                }
            }
        }
        send(&mut a, json!({"type": "session.stop"})).await;
        let out = stream_to_end(&mut a).await;
        (chunks + out.metadata.len(), out.end)
    });
    let start = recv_json(&mut b).await;
    assert_eq!(start["type"], "video.start", "{start}");
    let waited = queued_at.elapsed();
    // Pings keep `b` alive however long its chunks take (a slow or busy machine).
    let out = stream_to_end_pinging(&mut b, Some(stall / 5)).await;
    let stopped = out.end.as_ref().map(|e| e["stopped"].clone());
    assert_eq!(
        stopped,
        Some(json!(false)),
        "b's end {:?} after {} chunks, other messages {:?}",
        out.end,
        out.binaries.len(),
        out.others
    );
    assert_eq!(out.binaries.len(), 2);
    assert!(
        waited > stall,
        "the premise: b waited {waited:?}, longer than the {stall:?} stall timeout"
    );
    let (chunks, end) = hold.await.unwrap();
    eprintln!("a sent {chunks} chunks; b waited {waited:?}");
    assert_eq!(end.unwrap()["type"], "session.done");
    ts.stop().await;
}

/// What one load-test client does.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Plan {
    /// Reads its whole session.
    Stay,
    /// Hangs up as soon as it learns it is queued (or, admitted at once, at `video.start`,
    /// while its first chunk generates).
    LeaveQueue,
    /// Hangs up after this many chunks' metadata (0: at `video.start`), while the next
    /// chunk generates.
    HangUpAfter(usize),
    /// Sends `session.stop` after this many chunks (0: at `video.start`).
    StopAfter(usize),
}

/// Frames of a load-test session: 2 chunks.
const LOAD_FRAMES: usize = 21;

/// Runs one client to its plan; `Err` says how the server failed it.
async fn client(ts: Arc<TestServer>, plan: Plan, seed: u64) -> std::result::Result<(), String> {
    let mut ws = ts.connect().await;
    send(&mut ws, start_msg(LOAD_FRAMES, seed)).await;
    let mut chunks = 0;
    loop {
        match recv(&mut ws).await {
            In::Json(v) => match v["type"].as_str() {
                Some("session.queued" | "video.start") if plan == Plan::LeaveQueue => return Ok(()),
                Some("session.queued") => {}
                Some("video.start" | "video.chunk_metadata") => {
                    if v["type"] == "video.chunk_metadata" {
                        chunks += 1;
                    }
                    if plan == Plan::HangUpAfter(chunks) {
                        return Ok(());
                    }
                    if plan == Plan::StopAfter(chunks) {
                        let stop = json!({"type": "session.stop"}).to_string();
                        ws.send(Message::text(stop))
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                }
                Some("session.done") => {
                    let stopped = v["stopped"].as_bool() == Some(true);
                    let whole = chunks == LOAD_FRAMES.div_ceil(12) && !stopped;
                    return match plan {
                        Plan::Stay if whole => Ok(()),
                        Plan::StopAfter(_) if stopped || whole => Ok(()),
                        _ => Err(format!("{plan:?}: done after {chunks} chunks: {v}")),
                    };
                }
                _ => return Err(format!("{plan:?}: unexpected {v}")),
            },
            In::Bin(_) => {}
            In::Closed => return Err(format!("{plan:?}: closed after {chunks} chunks")),
        }
    }
}

/// A random plan.
fn any_plan(rng: &mut Lcg) -> Plan {
    match rng.below(6) {
        0 => Plan::LeaveQueue,
        1 => Plan::HangUpAfter(rng.below(2)),
        2 => Plan::StopAfter(rng.below(2)),
        _ => Plan::Stay,
    }
}

/// Runs `plans`, `together` clients at a time; checks every client was served as
/// planned and that `/health` answered during every wave.
async fn drive(ts: &Arc<TestServer>, plans: &[Plan], together: usize) {
    for (wave, plans) in plans.chunks(together).enumerate() {
        let tasks: Vec<_> = plans
            .iter()
            .enumerate()
            .map(|(i, &plan)| {
                let seed = (wave * together + i) as u64;
                tokio::spawn(client(Arc::clone(ts), plan, seed))
            })
            .collect();
        let probe = {
            let ts = Arc::clone(ts);
            tokio::spawn(async move { ts.get("/health").await.0 })
        };
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        assert_eq!(probe.await.unwrap(), 200, "/health answers under load");
    }
}

/// Allocated bytes, pool and refusals after the load: back to the floor, full, none.
async fn assert_back_to_the_floor(ts: &TestServer, floor: i64) {
    ts.idle().await;
    assert_eq!(ts.allocated_bytes(), floor, "bytes left behind");
    ts.assert_pool_free();
    assert_eq!(ts.server.queued(), 0);
    assert_eq!(ts.metric("headroom_sessions_rejected_total").await, 0.0);
    assert_eq!(ts.get("/health").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_times_the_slots_with_random_hang_ups_serves_every_survivor_and_leaks_nothing() {
    let ts = Arc::new(TestServer::start(config(2), None).await);
    run_session(&ts, 9, 0).await;
    ts.idle().await;
    let floor = ts.allocated_bytes();
    // Every kind of client, in a random order, all at once.
    let mut plans = vec![
        Plan::Stay,
        Plan::Stay,
        Plan::LeaveQueue,
        Plan::HangUpAfter(0),
        Plan::HangUpAfter(1),
        Plan::StopAfter(0),
    ];
    let mut rng = Lcg(0x10ad);
    for i in (1..plans.len()).rev() {
        plans.swap(i, rng.below(i + 1));
    }
    drive(&ts, &plans, plans.len()).await;
    assert_back_to_the_floor(&ts, floor).await;
    let ts = Arc::into_inner(ts).unwrap();
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sessions_with_random_hang_ups_and_stops_leak_nothing_and_are_never_refused() {
    let ts = Arc::new(TestServer::start(config(1), None).await);
    run_session(&ts, 9, 0).await;
    ts.idle().await;
    let floor = ts.allocated_bytes();
    let mut rng = Lcg(0x100);
    let plans: Vec<Plan> = (0..100).map(|_| any_plan(&mut rng)).collect();
    drive(&ts, &plans, 4).await;
    assert_back_to_the_floor(&ts, floor).await;
    let sessions: Value = ts.metric("headroom_connections_total").await.into();
    assert_eq!(sessions, 101.0);
    let ts = Arc::into_inner(ts).unwrap();
    ts.stop().await;
}
