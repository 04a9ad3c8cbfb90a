//! The deadline scheduler's admission over the protocol: once a round has been
//! measured, a session that would make the rounds late queues, `/ready` says why, and
//! it is admitted when room frees; the arrival scheduler admits by slots alone. The
//! real-time gauges are on `/metrics`.

mod common;

use serde_json::json;

use common::*;
use headroom_server::pacer::Pacing;
use headroom_server::{Defaults, Scheduler, ServerConfig};

/// A real-time server (paced by default) whose default fps makes a chunk play for
/// 1.2 ms: no round fits in it.
async fn server(scheduler: Scheduler) -> TestServer {
    TestServer::start(
        ServerConfig {
            max_sessions: 4,
            scheduler,
            defaults: Defaults {
                fps: 10_000,
                pacing: Pacing {
                    enabled: true,
                    ..Pacing::default()
                },
                ..Defaults::default()
            },
            ..ServerConfig::default()
        },
        None,
    )
    .await
}

/// Opens a paced open-ended session and reads its first chunk.
async fn paced(ts: &TestServer, seed: u64) -> Ws {
    let mut ws = ts.connect().await;
    let mut start = start_msg(0, seed);
    start["extra_params"] = json!({"pace_to_media_time": true});
    send(&mut ws, start).await;
    assert_eq!(recv_json(&mut ws).await["type"], "video.start");
    loop {
        if let In::Bin(_) = recv(&mut ws).await {
            return ws;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_would_make_the_rounds_late_queues_until_room_frees() {
    let ts = server(Scheduler::Deadline).await;
    assert_eq!(ts.get("/ready").await.0, 200, "nothing measured yet");
    let mut a = paced(&ts, 1).await;
    // A round has run: one more session cannot fit in 1.2 ms.
    let (code, body) = ts.get("/ready").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("real-time capacity"), "{body}");
    assert_eq!(ts.metric("headroom_realtime_sessions").await, 1.0);
    assert!(ts.metric("headroom_deadline_misses_total").await >= 0.0);
    let mut b = ts.connect().await;
    send(&mut b, start_msg(21, 2)).await;
    let queued = recv_json(&mut b).await;
    assert_eq!(queued["type"], "session.queued", "{queued}");
    // A leaves: B is admitted and streams.
    send(&mut a, json!({"type": "session.stop"})).await;
    stream_to_end(&mut a).await;
    assert_eq!(recv_json(&mut b).await["type"], "video.start");
    let out = stream_to_end(&mut b).await;
    assert_eq!(out.binaries.len(), 2);
    assert_eq!(ts.metric("headroom_realtime_sessions").await, 0.0);
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_arrival_scheduler_admits_by_slots_alone() {
    let ts = server(Scheduler::Arrival).await;
    let mut a = paced(&ts, 1).await;
    assert_eq!(ts.get("/ready").await.0, 200);
    let mut b = ts.connect().await;
    send(&mut b, start_msg(21, 2)).await;
    assert_eq!(recv_json(&mut b).await["type"], "video.start");
    stream_to_end(&mut b).await;
    send(&mut a, json!({"type": "session.stop"})).await;
    stream_to_end(&mut a).await;
    ts.stop().await;
}
