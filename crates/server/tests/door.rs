//! The door over real sockets: API keys (a Bearer header, or the subprotocol a browser
//! offers), the origin check on WebSocket upgrades, and the cap on open sockets
//! (`door_idle.rs` holds idle sockets closed first, in a process of its own so that its
//! resident-memory reading counts no other test).

mod common;

use std::sync::atomic::Ordering;

use common::*;
use headroom_server::{DoorConfig, ServerConfig};

const KEY: &str = "sk-test.1";

fn keyed() -> ServerConfig {
    ServerConfig {
        door: DoorConfig {
            api_keys: vec![KEY.to_string(), "second-key".to_string()],
            ..DoorConfig::default()
        },
        ..ServerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_every_protected_route_answers_401_and_refusals_are_counted_without_it() {
    let ts = TestServer::start(keyed(), None).await;
    for path in ["/metrics", "/stats"] {
        let (status, body) = ts.get(path).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert!(body.contains("unauthorized"), "{body}");
    }
    let (status, _) = ts
        .get_with("/stats", &["Authorization: Bearer sk-test.2"])
        .await;
    assert_eq!(status, 401);
    assert_eq!(ts.connect_with(&[]).await.err(), Some(401));
    let wrong = [("authorization", "Bearer not-it")];
    assert_eq!(ts.connect_with(&wrong).await.err(), Some(401));
    // The viewer page, liveness and readiness stay open.
    for path in ["/", "/health", "/ready"] {
        assert_eq!(ts.get(path).await.0, 200, "{path}");
    }
    let (status, metrics) = ts
        .get_with("/metrics", &["Authorization: Bearer second-key"])
        .await;
    assert_eq!(status, 200);
    assert_eq!(refusals(&metrics, "key"), 5);
    for secret in [KEY, "second-key", "sk-test.2", "not-it"] {
        assert!(!metrics.contains(secret), "/metrics shows {secret}");
    }
    // Nothing ran: no socket was served, no session opened.
    assert_eq!(
        ts.server
            .metrics()
            .connections_total
            .load(Ordering::Relaxed),
        0
    );
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_key_a_session_streams_by_header_or_by_subprotocol() {
    let ts = TestServer::start(keyed(), None).await;
    let bearer = format!("Bearer {KEY}");
    let browser = "headroom, headroom.bearer.second-key".to_string();
    for headers in [
        vec![("authorization", bearer.as_str())],
        vec![("sec-websocket-protocol", browser.as_str())],
    ] {
        let mut ws = ts
            .connect_with(&headers)
            .await
            .expect("the key opens the door");
        send(&mut ws, start_msg(9, 3)).await;
        assert_eq!(recv_json(&mut ws).await["type"], "video.start");
        let out = stream_to_end(&mut ws).await;
        assert_eq!(out.end.as_ref().unwrap()["type"], "session.done");
        assert!(!out.binaries.is_empty());
    }
    ts.idle().await;
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_a_foreign_origin_is_refused_and_the_servers_own_is_not() {
    let ts = TestServer::default().await;
    assert_eq!(
        ts.connect_with(&[("origin", "http://evil.example")])
            .await
            .err(),
        Some(403)
    );
    assert_eq!(
        ts.connect_with(&[("origin", "null")]).await.err(),
        Some(403)
    );
    let own = format!("http://{}", ts.addr);
    let mut ws = ts.connect_with(&[("origin", own.as_str())]).await.unwrap();
    send(&mut ws, start_msg(9, 1)).await;
    assert_eq!(recv_json(&mut ws).await["type"], "video.start");
    stream_to_end(&mut ws).await;
    // No Origin: not a browser, not refused for it.
    drop(ts.connect_with(&[]).await.unwrap());
    let (_, metrics) = ts.get("/metrics").await;
    assert_eq!(refusals(&metrics, "origin"), 2);
    ts.idle().await;
    ts.stop().await;

    let allowed = ServerConfig {
        door: DoorConfig {
            allowed_origins: vec!["https://app.example".to_string()],
            ..DoorConfig::default()
        },
        ..ServerConfig::default()
    };
    let ts = TestServer::start(allowed, None).await;
    assert!(ts
        .connect_with(&[("origin", "https://app.example")])
        .await
        .is_ok());
    assert_eq!(
        ts.connect_with(&[("origin", "http://evil.example")])
            .await
            .err(),
        Some(403)
    );
    ts.idle().await;
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_past_the_cap_with_every_socket_in_a_session_is_closed_at_once() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let config = ServerConfig {
        door: DoorConfig {
            max_connections: Some(1),
            ..DoorConfig::default()
        },
        ..ServerConfig::default()
    };
    let ts = TestServer::start(config, None).await;
    let (mut busy, _) = open(&ts, 45, 4).await;
    let mut late = ts.connect().await;
    let close = tokio::time::timeout(GUARD, late.next()).await.unwrap();
    let Some(Ok(Message::Close(Some(frame)))) = close else {
        panic!("expected a close frame, got {close:?}");
    };
    assert_eq!(u16::from(frame.code), 1013);
    assert!(
        frame.reason.contains("--max-connections"),
        "{}",
        frame.reason
    );
    let out = stream_to_end(&mut busy).await;
    assert_eq!(out.end.as_ref().unwrap()["type"], "session.done");
    let (_, text) = ts.get("/metrics").await;
    assert_eq!(refusals(&text, "connections"), 1);
    drop(late);
    ts.idle().await;
    ts.stop().await;
}
