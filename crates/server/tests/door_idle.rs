//! Idle sockets past the cap are closed first and a real client is served beside them,
//! without the idle sockets growing the server's memory. In a test process of its own:
//! its resident-memory reading must count no other test's server.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use headroom_server::{DoorConfig, ServerConfig};

/// A WebSocket opened by hand and left silent: the upgrade's request and its 101, and
/// no buffers on this end, so resident memory counts the server's side.
async fn upgraded_socket(ts: &TestServer) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(ts.addr).await.unwrap();
    let request = format!(
        "GET /v1/realtime/video HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        ts.addr
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    stream
}

/// Idle sockets cannot crowd a real client out, nor grow the server's memory: this
/// many sockets never send `session.start`.
const IDLE: usize = 500;

/// Resident memory the idle sockets may add to the server: the cap's sockets with their
/// 16 KiB read chunks, and room for the allocator's own slack (measured: about 1 MiB
/// for 500 sockets, and the same for 1,500).
const IDLE_RSS_BOUND: u64 = 8 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_past_the_cap_are_closed_first_and_a_real_client_is_served() {
    let config = ServerConfig {
        door: DoorConfig {
            max_connections: Some(40),
            ..DoorConfig::default()
        },
        ..ServerConfig::default()
    };
    let ts = TestServer::start(config, None).await;
    // One session first, so the KV pool and the model's working set are there before
    // resident memory is read.
    run_session(&ts, 21, 2).await;
    ts.idle().await;
    let rss_before = headroom_mem::rss::process_rss_bytes().unwrap_or(0);
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        idle.push(upgraded_socket(&ts).await);
    }
    // The server holds at most its cap once the sockets it closed are gone.
    let metrics = ts.server.metrics();
    tokio::time::timeout(GUARD, async {
        while metrics.connections_open.load(Ordering::Relaxed) > 40 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the closed idle sockets never went");
    // A real client comes in past them all and is served normally.
    let out = run_session(&ts, 21, 2).await;
    assert_eq!(out.end.as_ref().unwrap()["type"], "session.done");
    let rss_after = headroom_mem::rss::process_rss_bytes().unwrap_or(0);
    let grown = rss_after.saturating_sub(rss_before);
    assert!(
        grown < IDLE_RSS_BOUND,
        "{IDLE} idle sockets grew resident memory by {grown} B"
    );
    let (_, text) = ts.get("/metrics").await;
    // Every idle socket past the cap, and one more for the real client, was closed.
    assert_eq!(refusals(&text, "idle_evicted"), (IDLE - 40 + 1) as u64);
    assert_eq!(refusals(&text, "connections"), 0);
    drop(idle);
    ts.idle().await;
    ts.stop().await;
}
