//! What a load balancer in front of several servers relies on: `/ready` turns 503 as
//! soon as a new session could not start at once (and while the server drains), the
//! gauges say why, and a drain (`POST /drain`, SIGTERM) refuses new sessions with close
//! code 1001 while the running one finishes, then `serve` returns.

mod common;

use std::time::{Duration, Instant};

use common::*;
use headroom_server::ServerConfig;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

/// Reads to the socket's close frame: (the last `error`'s code, the close code).
async fn refusal(ws: &mut Ws) -> (String, u16) {
    let mut code = String::new();
    loop {
        match recv_raw(ws).await {
            Some(Ok(Message::Text(t))) => {
                let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                if v["type"] == "error" {
                    code = v["code"].as_str().unwrap_or_default().to_string();
                }
            }
            Some(Ok(Message::Close(frame))) => {
                return (code, frame.map_or(0, |f| u16::from(f.code)));
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("socket failed before its close frame: {e}"),
            None => panic!("socket ended without a close frame"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_turns_503_as_soon_as_a_session_would_queue_and_the_gauges_say_why() {
    let ts = TestServer::start(ServerConfig::default(), None).await;
    assert_eq!(ts.get("/ready").await.0, 200);
    assert_eq!(ts.metric("headroom_session_slots_free").await, 1.0);
    let free_before = ts.metric("headroom_planned_bytes_free").await;
    assert!(free_before > 0.0);
    let (mut a, _) = open(&ts, 117, 1).await;
    // The queue has room, but a new client would wait: not ready by default.
    let (status, body) = ts.get("/ready").await;
    assert_eq!(status, 503);
    assert!(body.contains("session slots"), "{body}");
    // A balancer's fallback asks whether it would at least queue the client.
    assert_eq!(ts.get("/ready?queueing=1").await.0, 200);
    assert_eq!(ts.metric("headroom_session_slots_free").await, 0.0);
    assert_eq!(ts.metric("headroom_ready").await, 0.0);
    assert_eq!(ts.metric("headroom_draining").await, 0.0);
    assert!(ts.metric("headroom_planned_bytes_free").await < free_before);
    send(&mut a, json!({"type": "session.stop"})).await;
    stream_to_end(&mut a).await;
    ts.idle().await;
    assert_eq!(ts.get("/ready").await.0, 200);
    assert_eq!(ts.metric("headroom_session_slots_free").await, 1.0);
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_ready_when_queueing_a_server_with_queue_room_stays_ready() {
    let config = ServerConfig {
        ready_when_queueing: true,
        ..ServerConfig::default()
    };
    let ts = TestServer::start(config, None).await;
    let (mut a, _) = open(&ts, 117, 1).await;
    assert_eq!(ts.get("/ready").await.0, 200);
    send(&mut a, json!({"type": "session.stop"})).await;
    stream_to_end(&mut a).await;
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_refuses_new_and_queued_clients_finishes_the_running_session_and_returns() {
    let config = ServerConfig {
        drain_timeout: Duration::from_secs(60),
        ..ServerConfig::default()
    };
    let ts = TestServer::start(config, None).await;
    // Long enough (10 chunks) to outlast the requests below.
    let (mut running, _) = open(&ts, 117, 1).await;
    let mut queued = ts.connect().await;
    send(&mut queued, start_msg(21, 2)).await;
    assert_eq!(recv_json(&mut queued).await["type"], "session.queued");
    let asked = Instant::now();
    let (status, body) = ts.post("/drain").await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = ts.get("/ready").await;
    assert_eq!(status, 503);
    assert!(body.contains("draining"), "{body}");
    assert!(asked.elapsed() < Duration::from_secs(1));
    assert_eq!(ts.metric("headroom_draining").await, 1.0);
    // The queued client is sent on its way, and so is a new one.
    assert_eq!(refusal(&mut queued).await, ("draining".to_string(), 1001));
    let mut late = ts.connect().await;
    send(&mut late, start_msg(9, 3)).await;
    assert_eq!(refusal(&mut late).await, ("draining".to_string(), 1001));
    // (Read while the running session keeps the server up: once it ends, serve stops.)
    let (_, metrics) = ts.get("/metrics").await;
    assert!(
        metrics.contains("headroom_sessions_refused_total{reason=\"draining\"} 2"),
        "{metrics}"
    );
    // The running session ends on its own, every chunk streamed; then serve returns.
    let out = stream_to_end_pinging(&mut running, Some(Duration::from_millis(500))).await;
    assert_eq!(out.end.unwrap()["stopped"], false);
    assert_eq!(out.binaries.len(), 10);
    ts.served().await;
}
