//! `WS /v1/realtime/video` end to end with a real WebSocket client, on the `tiny` model at
//! 48×32: the message sequence and its fragmented MP4, interactions, every error code,
//! admission, and that every way a session ends gives back what it held.
//!
//! No test measures time: waits are for events, each bounded by a generous guard so a
//! broken server fails the test instead of hanging it.

mod common;

use std::io::Cursor;
use std::time::Duration;

use base64::Engine as _;
use futures_util::SinkExt;
use headroom_server::{Limits, ServerConfig};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_session_streams_start_metadata_binary_pairs_and_done_forming_one_valid_mp4() {
    let ts = TestServer::default().await;
    let (mut ws, start) = open(&ts, 33, 1).await;
    let request_id = start["request_id"].as_str().unwrap().to_string();
    assert!(request_id.starts_with("video_stream-"));
    assert_eq!(start["format"], "m4s");
    assert_eq!(start["config"]["chunks"], 3);
    assert_eq!(start["config"]["num_frames"], 33);
    let out = stream_to_end(&mut ws).await;
    let done = out.end.unwrap();
    assert_eq!(
        done,
        json!({"type": "session.done", "request_id": request_id, "chunks": 3, "stopped": false})
    );
    assert!(matches!(recv(&mut ws).await, In::Closed));
    let frames: Vec<u64> = out
        .metadata
        .iter()
        .map(|m| m["num_frames"].as_u64().unwrap())
        .collect();
    assert_eq!(frames, [9, 12, 12]);
    for (i, (meta, bin)) in out.metadata.iter().zip(&out.binaries).enumerate() {
        assert_eq!(meta["request_id"], request_id.as_str());
        assert_eq!(meta["kind"], "media");
        assert_eq!(meta["transport_chunk_index"], i);
        assert_eq!(meta["generation_chunk_index"], i);
        assert_eq!(meta["byte_length"], bin.len());
        let expected: &[&str] = if i == 0 {
            &["ftyp", "moov", "moof", "mdat"]
        } else {
            &["moof", "mdat"]
        };
        assert_eq!(boxes(bin), expected, "chunk {i}");
    }
    let stream: Vec<u8> = out.binaries.concat();
    let mp4 = mp4::Mp4Reader::read_header(Cursor::new(&stream), stream.len() as u64).unwrap();
    assert!(mp4.is_fragmented());
    let track = mp4.tracks().values().next().unwrap();
    assert_eq!((track.width(), track.height()), (W as u16, H as u16));
    let samples: u32 = mp4
        .moofs
        .iter()
        .map(|m| m.trafs[0].trun.as_ref().unwrap().sample_count)
        .sum();
    assert_eq!(samples, 33);
    ts.stop().await;
}

/// A client that keeps sending while its session ends (pings every millisecond) reads
/// its `session.done` and then the close frame: the server reads what is on its way until
/// the client's close reply, so no reset discards the end before the client read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_as_its_session_ends_reads_the_end_and_a_clean_close() {
    let ts = TestServer::default().await;
    for seed in 0..6 {
        let (mut ws, _) = open(&ts, 9, seed).await;
        let out = stream_to_end_pinging(&mut ws, Some(Duration::from_millis(1))).await;
        let end = out.end.as_ref().map(|e| e["type"].clone());
        assert_eq!(
            end,
            Some(json!("session.done")),
            "seed {seed}: {:?}",
            out.others
        );
        loop {
            match recv_raw(&mut ws).await {
                Some(Ok(Message::Close(frame))) => {
                    assert_eq!(frame.map(|f| u16::from(f.code)), Some(1000));
                    break;
                }
                Some(Ok(_)) => continue,
                other => panic!("seed {seed}: expected the close frame, got {other:?}"),
            }
        }
    }
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactions_are_acknowledged_and_change_the_chunks_from_their_boundary_on() {
    let ts = TestServer::default().await;
    let baseline = run_session(&ts, 69, 5).await.binaries;
    assert_eq!(baseline.len(), 6);

    let (mut ws, start) = open(&ts, 69, 5).await;
    send(&mut ws, velocity("forward")).await;
    let out = stream_to_end(&mut ws).await;
    let queued: Vec<&Value> = out
        .others
        .iter()
        .filter(|v| v["type"] == "session.interaction.queued")
        .collect();
    assert_eq!(queued.len(), 1, "{:?}", out.others);
    assert_eq!(queued[0]["event_id"], "forward");
    assert_eq!(queued[0]["request_id"], start["request_id"]);
    let n = out
        .metadata
        .iter()
        .position(|m| m["started_event_ids"] == json!(["forward"]))
        .expect("the interaction starts at a chunk boundary");
    for (i, (meta, bin)) in out.metadata.iter().zip(&out.binaries).enumerate() {
        if i < n {
            assert_eq!(*bin, baseline[i], "chunk {i} precedes the interaction");
        } else {
            assert_ne!(*bin, baseline[i], "chunk {i} follows the interaction");
            assert_eq!(meta["active_event_ids"], json!(["forward"]));
        }
    }
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_code_comes_from_the_input_that_should_produce_it() {
    let ts = TestServer::default().await;
    let cases: Vec<(Message, &str, &str)> = vec![
        (Message::text(r#"{"type":"session.dance"}"#), "unknown_type", "session.dance"),
        (Message::text("{not json"), "invalid_json", "JSON"),
        (Message::binary(vec![0u8, 1, 2]), "invalid_json", "binary"),
        (Message::text(r#"{"type":"session.interaction","interaction":{}}"#), "invalid_state", "session.start"),
        (
            Message::text(json!({"type": "session.start", "image_reference": {"image_url": "https://example.com/a.png"}}).to_string()),
            "invalid_request",
            "not fetched",
        ),
        (
            Message::text(json!({"type": "session.start", "model": "lingbot"}).to_string()),
            "invalid_request",
            "model",
        ),
        (
            Message::text(json!({"type": "session.start", "width": 50, "height": 32, "num_frames": 9}).to_string()),
            "invalid_request",
            "multiples of 16",
        ),
        (
            Message::text(json!({"type": "session.start", "num_frames": 10}).to_string()),
            "invalid_request",
            "num_frames",
        ),
        (
            // The test server loads no tiny decoder.
            Message::text(json!({"type": "session.start", "extra_params": {"decoder": "tiny"}}).to_string()),
            "invalid_request",
            "extra_params.decoder",
        ),
        (
            Message::text(json!({"type": "session.start", "pad": "x".repeat((4 << 20) + 1)}).to_string()),
            "message_too_large",
            "session.start",
        ),
    ];
    for (message, code, says) in cases {
        let mut ws = ts.connect().await;
        ws.send(message).await.unwrap();
        let e = expect_error(&mut ws, code).await;
        assert!(e["message"].as_str().unwrap().contains(says), "{e}");
        assert!(
            matches!(recv(&mut ws).await, In::Closed),
            "{code} ends the connection"
        );
    }

    // Inside a session: errors answer the message and the session goes on.
    let (mut ws, start) = open(&ts, 117, 3).await;
    send(&mut ws, json!({"type": "session.dance", "extra": [1, 2]})).await;
    send(
        &mut ws,
        json!({"type": "session.ping", "pad": "x".repeat(200 << 10)}),
    )
    .await;
    send(&mut ws, velocity("e1")).await;
    send(&mut ws, velocity("e1")).await;
    ws.send(Message::binary(vec![7u8; 16])).await.unwrap();
    send(&mut ws, start_msg(9, 1)).await;
    send(&mut ws, json!({"type": "session.interaction", "interaction": {"event_id": "p", "event": {"prompt": "turn left"}}})).await;
    send(&mut ws, json!({"type": "session.ping"})).await;
    // The new prompt (the tiny model's built-in text encoder) starts with a chunk.
    let mut before_stop = Vec::new();
    loop {
        match recv(&mut ws).await {
            In::Json(v)
                if v["type"] == "video.chunk_metadata"
                    && v["started_event_ids"]
                        .as_array()
                        .is_some_and(|ids| ids.contains(&json!("p"))) =>
            {
                before_stop.push(v);
                // The chunk's video follows its metadata.
                assert!(matches!(recv(&mut ws).await, In::Bin(_)));
                break;
            }
            In::Json(v) => before_stop.push(v),
            In::Bin(_) => {}
            In::Closed => panic!("closed before the prompt was applied"),
        }
    }
    send(&mut ws, json!({"type": "session.stop"})).await;
    let mut out = stream_to_end(&mut ws).await;
    out.others.extend(before_stop);
    let codes: Vec<(&str, &str)> = out
        .others
        .iter()
        .filter(|v| v["type"] == "error")
        .map(|v| {
            (
                v["code"].as_str().unwrap(),
                v["event_id"].as_str().unwrap_or(""),
            )
        })
        .collect();
    for expected in [
        ("unknown_type", ""),
        ("message_too_large", ""),
        ("event_id_conflict", "e1"),
        ("invalid_json", ""),
        ("invalid_state", ""),
    ] {
        assert!(
            codes.contains(&expected),
            "{expected:?} missing from {codes:?}"
        );
    }
    for v in out.others.iter().filter(|v| v["type"] == "error") {
        assert_eq!(v["request_id"], start["request_id"], "{v}");
    }
    assert!(out.others.iter().any(|v| v["type"] == "session.pong"));
    let done = out.end.unwrap();
    assert_eq!(done["type"], "session.done");
    assert_eq!(done["stopped"], true);
    assert!(done["chunks"].as_u64().unwrap() < 10);
    ts.idle().await;
    ts.assert_pool_free();
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_and_stall_timeouts_end_the_socket_with_their_codes() {
    let config = ServerConfig {
        limits: Limits {
            start_timeout: Duration::from_millis(100),
            stall_timeout: Duration::ZERO,
            ..Limits::default()
        },
        ..ServerConfig::default()
    };
    let ts = TestServer::start(config, None).await;
    let mut ws = ts.connect().await;
    expect_error(&mut ws, "start_timeout").await;
    assert!(matches!(recv(&mut ws).await, In::Closed));

    let mut ws = ts.connect().await;
    send(&mut ws, start_msg(117, 1)).await;
    let mut stalled = false;
    loop {
        match recv(&mut ws).await {
            In::Json(v) if v["type"] == "error" => {
                assert_eq!(v["code"], "stall_timeout", "{v}");
                stalled = true;
            }
            In::Json(v) if v["type"] == "session.done" => {
                assert_eq!(v["stopped"], true);
                break;
            }
            In::Closed => panic!("closed without session.done"),
            _ => {}
        }
    }
    assert!(stalled);
    ts.idle().await;
    ts.assert_pool_free();
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_queue_a_full_server_refuses_with_capacity_at_once_and_is_not_ready_until_a_slot_frees(
) {
    let config = ServerConfig {
        max_queue: 0,
        ..ServerConfig::default()
    };
    let ts = TestServer::start(config, None).await;
    assert_eq!(ts.get("/ready").await.0, 200);
    let (mut a, _) = open(&ts, 117, 1).await;
    let (status, body) = ts.get("/ready").await;
    assert_eq!(status, 503);
    assert!(body.contains("session slots"), "{body}");
    let mut b = ts.connect().await;
    send(&mut b, start_msg(9, 2)).await;
    let e = expect_error(&mut b, "capacity").await;
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("--max-sessions") && message.contains("--max-queue"),
        "{e}"
    );
    send(&mut a, json!({"type": "session.stop"})).await;
    let done = stream_to_end(&mut a).await.end.unwrap();
    assert_eq!(done["stopped"], true);
    // The slot is free before session.done is sent.
    assert_eq!(ts.get("/ready").await.0, 200);
    assert_eq!(run_session(&ts, 9, 3).await.binaries.len(), 1);
    let (_, metrics) = ts.get("/metrics").await;
    assert!(
        metrics.contains("headroom_sessions_rejected_total 1"),
        "{metrics}"
    );
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_queue_a_kv_pool_with_room_for_one_session_refuses_the_second_whatever_the_slots()
{
    // One page = 2 (K, V) · 2 layers · 16 tokens · 4 heads · 12 dims · 4 B; tiny at 48×32
    // has 6 tokens a frame (one page), and a session takes the 18-frame window.
    let page = 2 * 2 * 16 * 4 * 12 * 4;
    let config = ServerConfig {
        max_sessions: 2,
        max_queue: 0,
        ..ServerConfig::default()
    };
    let ts = TestServer::start(config, Some(page * 18 + page / 2)).await;
    let (mut a, _) = open(&ts, 117, 1).await;
    let (status, body) = ts.get("/ready").await;
    assert_eq!(status, 503);
    assert!(body.contains("KV pool"), "{body}");
    let mut b = ts.connect().await;
    send(&mut b, start_msg(9, 2)).await;
    let e = expect_error(&mut b, "capacity").await;
    assert!(e["message"].as_str().unwrap().contains("pages"), "{e}");
    send(&mut a, json!({"type": "session.stop"})).await;
    stream_to_end(&mut a).await;
    ts.idle().await;
    assert_eq!(ts.get("/ready").await.0, 200);
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sequential_sessions_leave_the_same_reserved_bytes_after_each() {
    let ts = TestServer::default().await;
    let mut after = Vec::new();
    for seed in 0..100 {
        assert_eq!(run_session(&ts, 9, seed).await.binaries.len(), 1);
        ts.idle().await;
        after.push(reserved_from_metrics(&ts).await);
    }
    assert!(after.iter().all(|&r| r == after[0]), "{after:?}");
    ts.assert_pool_free();
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_vanish_mid_stream_leave_no_pages_and_no_device_bytes_behind() {
    let ts = TestServer::default().await;
    run_session(&ts, 9, 1).await;
    ts.idle().await;
    let idle = ts.allocated_bytes();
    let reserved = reserved_from_metrics(&ts).await;
    // 20 clients vanish at pseudo-random points: after video.start, after a chunk's
    // metadata (before its binary, while the next chunk is being generated), after a
    // whole chunk, …
    let mut rng = Lcg(0xd15c);
    for client in 0..20u64 {
        let point = 1 + rng.below(9);
        let mut ws = ts.connect().await;
        send(&mut ws, start_msg(117, 10 + client)).await;
        let mut seen = 0;
        while seen < point {
            match recv(&mut ws).await {
                In::Json(v)
                    if v["type"] == "video.start" || v["type"] == "video.chunk_metadata" =>
                {
                    seen += 1
                }
                In::Bin(_) => seen += 1,
                other => panic!("{other:?}"),
            }
        }
        drop(ws);
        ts.idle().await;
        assert_eq!(
            ts.allocated_bytes(),
            idle,
            "client {client} vanished at point {point}"
        );
        assert_eq!(
            reserved_from_metrics(&ts).await,
            reserved,
            "client {client}"
        );
        ts.assert_pool_free();
    }
    assert_eq!(run_session(&ts, 21, 2).await.binaries.len(), 2);
    let (_, metrics) = ts.get("/metrics").await;
    // Each vanished client's session parked for its resume token: its device bytes and
    // pages went back (checked above), its state is in host memory.
    assert!(
        metrics.contains("headroom_sessions_parked_total 20")
            && metrics.contains("headroom_sessions_parked 20"),
        "{metrics}"
    );
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_oom_fails_that_session_with_an_error_and_the_next_one_succeeds() {
    let ts = TestServer::default().await;
    run_session(&ts, 9, 1).await;
    ts.idle().await;
    let idle = ts.allocated_bytes();
    let (mut ws, _) = open(&ts, 117, 2).await;
    assert_eq!(recv_json(&mut ws).await["type"], "video.chunk_metadata");
    assert!(matches!(recv(&mut ws).await, In::Bin(_)));
    ts.server
        .engine()
        .platform()
        .allocator()
        .inject_oom_after(Some(300));
    let out = stream_to_end(&mut ws).await;
    ts.server
        .engine()
        .platform()
        .allocator()
        .inject_oom_after(None);
    let end = out.end.unwrap();
    assert_eq!(end["code"], "generation_failed", "{end}");
    assert!(
        end["message"].as_str().unwrap().contains("out of memory"),
        "{end}"
    );
    ts.idle().await;
    assert_eq!(ts.allocated_bytes(), idle);
    ts.assert_pool_free();
    assert_eq!(run_session(&ts, 21, 3).await.binaries.len(), 2);
    let (_, metrics) = ts.get("/metrics").await;
    assert!(
        metrics.contains("headroom_sessions_failed_total 1"),
        "{metrics}"
    );
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_the_viewer_are_served_with_headroom_names() {
    let ts = TestServer::default().await;
    assert_eq!(ts.get("/health").await.0, 200);
    let (status, page) = ts.get("/").await;
    assert_eq!(status, 200);
    assert!(page.contains("MediaSource") && page.contains("/v1/realtime/video"));
    run_session(&ts, 21, 1).await;
    let (status, metrics) = ts.get("/metrics").await;
    assert_eq!(status, 200);
    for line in metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        assert!(line.starts_with("headroom_"), "{line}");
    }
    for name in [
        "headroom_allocated_bytes ",
        "headroom_reserved_bytes ",
        "headroom_allocated_peak_bytes ",
        "headroom_reserved_peak_bytes ",
        "headroom_reclaims_total ",
        "headroom_sessions_open 0",
        "headroom_sessions_admitted_total 1",
        "headroom_sessions_rejected_total 0",
        "headroom_sessions_failed_total 0",
        "headroom_sessions_completed_total 1",
        "headroom_chunks_sent_total 2",
        "headroom_chunk_latency_seconds_count 2",
        "headroom_time_to_first_chunk_seconds_count 1",
        "headroom_kv_pages_free ",
        "headroom_planned_spans 0",
        "headroom_committed_bytes ",
        "headroom_planned_unattributed_total ",
        "headroom_weights_bytes ",
        "headroom_kv_pool_bytes ",
        "headroom_prompt_cache_bytes 0",
    ] {
        assert!(metrics.contains(name), "{name} missing");
    }
    let (_, stats) = ts.get("/stats").await;
    let stats: Value = serde_json::from_str(&stats).unwrap();
    assert!(stats["reserved_bytes"].as_i64().unwrap() > 0);
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_sessions_with_done_stopped_and_serve_returns() {
    let ts = TestServer::default().await;
    let (mut ws, start) = open(&ts, 117, 1).await;
    let engine = ts.server.engine().clone();
    let server = ts.server.clone();
    let reader = tokio::spawn(async move { stream_to_end(&mut ws).await });
    ts.stop().await;
    let done = reader.await.unwrap().end.unwrap();
    assert_eq!(done["type"], "session.done");
    assert_eq!(done["request_id"], start["request_id"]);
    assert_eq!(done["stopped"], true);
    assert_eq!(server.open_sessions(), 0);
    let pool = engine.kv_pool().unwrap();
    assert_eq!(pool.free_pages(), pool.total_pages());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_reference_and_an_action_script_condition_the_session() {
    let ts = TestServer::default().await;
    let plain = run_session(&ts, 21, 4).await.binaries;

    let img = image::RgbImage::from_fn(96, 48, |x, y| {
        image::Rgb([(x * 2) as u8, (y * 5) as u8, 90])
    });
    let mut png = Vec::new();
    img.write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&png)
    );
    let mut msg = start_msg(21, 4);
    msg["image_reference"] = json!({"image_url": url});
    let mut ws = ts.connect().await;
    send(&mut ws, msg).await;
    assert_eq!(recv_json(&mut ws).await["config"]["image_reference"], true);
    let with_image = stream_to_end(&mut ws).await.binaries;
    assert_eq!(with_image.len(), 2);
    assert_ne!(with_image[0], plain[0]);

    let mut msg = start_msg(69, 4);
    msg["extra_params"] =
        json!({"camera_action_script": [[["w"], ["w"], ["w", "d"]], ["a", "", "l"]]});
    let mut ws = ts.connect().await;
    send(&mut ws, msg).await;
    assert_eq!(recv_json(&mut ws).await["type"], "video.start");
    send(&mut ws, velocity("mixed")).await;
    let out = stream_to_end(&mut ws).await;
    assert_eq!(out.end.unwrap()["stopped"], false);
    let refused = out
        .others
        .iter()
        .find(|v| v["type"] == "error")
        .expect("an interaction cannot mix with an action script");
    assert_eq!(refused["event_id"], "mixed");
    assert!(refused["message"]
        .as_str()
        .unwrap()
        .contains("action script"));
    // Refused at once: never acknowledged first and rejected at the next chunk.
    assert!(
        !out.others
            .iter()
            .any(|v| v["type"] == "session.interaction.queued" && v["event_id"] == "mixed"),
        "{:?}",
        out.others
    );
    ts.stop().await;
}

fn fuzz_message(rng: &mut Lcg) -> Message {
    let valid = [
        start_msg(9, 1).to_string(),
        velocity("f").to_string(),
        json!({"type": "session.ping"}).to_string(),
        json!({"type": "session.stop"}).to_string(),
    ];
    match rng.below(9) {
        0 => {
            let s = &valid[rng.below(valid.len())];
            Message::text(s[..rng.below(s.len())].to_string())
        }
        1 => Message::text(
            (0..rng.below(300))
                .map(|_| (b' ' + rng.below(95) as u8) as char)
                .collect::<String>(),
        ),
        2 => Message::binary((0..rng.below(5000)).map(|_| rng.next() as u8).collect::<Vec<u8>>()),
        3 => Message::text(json!({"type": "session.start", "width": "wide", "num_frames": [1], "seed": -5}).to_string()),
        4 => Message::text(json!({"type": "session.start", "width": 1e30, "height": null, "fps": 1e9}).to_string()),
        5 => Message::text(json!({"type": "session.interaction", "interaction": {"event_id": "x".repeat(300 + rng.below(2000)),
            "event": {"multi_modal_data": {"camera": {"data": {"translation": "up", "rotation": [0, 0, 0, 0]}}}}}}).to_string()),
        6 => Message::text(json!({"type": ["session.start"], "interaction": 5}).to_string()),
        7 => Message::text(json!({"type": "session.start", "extra_params": {"camera_action_script": "wasd"},
            "image_reference": {"image_url": format!("data:image/png;base64,{}", "A".repeat(rng.below(4000)))}}).to_string()),
        _ => Message::text(valid[rng.below(valid.len())].clone()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_messages_never_crash_the_server_or_leak_a_session() {
    let ts = TestServer::default().await;
    run_session(&ts, 9, 1).await;
    ts.idle().await;
    let idle = ts.allocated_bytes();
    let mut rng = Lcg(0x5eed);
    for round in 0..40 {
        let mut ws = ts.connect().await;
        if rng.below(2) == 0 {
            send(&mut ws, start_msg(9, round)).await;
        }
        for _ in 0..1 + rng.below(6) {
            if ws.send(fuzz_message(&mut rng)).await.is_err() {
                break;
            }
        }
        if rng.below(2) == 0 {
            // Read to the end (the server closes after done or a fatal error).
            while !matches!(recv(&mut ws).await, In::Closed) {}
        }
        drop(ws);
    }
    ts.idle().await;
    assert_eq!(ts.allocated_bytes(), idle);
    ts.assert_pool_free();
    assert_eq!(ts.get("/health").await.0, 200);
    assert_eq!(run_session(&ts, 21, 2).await.binaries.len(), 2);
    ts.stop().await;
}
