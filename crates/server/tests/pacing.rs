//! Media-time pacing over the protocol: a paced session faster than real time releases
//! each chunk at its play time minus the lead (never earlier), the first at once; an
//! unpaced one streams as fast as it generates; both stream the same bytes.

mod common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::*;

/// A 45-frame session (4 chunks: 9, 12, 12, 12 frames) with `extra` params: each
/// chunk's arrival after the first's, its metadata and its fragment.
async fn timed(ts: &TestServer, extra: Value) -> (Vec<Duration>, Vec<Value>, Vec<Vec<u8>>) {
    let mut ws = ts.connect().await;
    let mut start = start_msg(45, 3);
    start["extra_params"] = extra;
    send(&mut ws, start).await;
    let v = recv_json(&mut ws).await;
    assert_eq!(v["type"], "video.start", "{v}");
    let (mut at, mut meta, mut bins) = (Vec::new(), Vec::new(), Vec::new());
    let mut first = None;
    loop {
        match recv(&mut ws).await {
            In::Json(v) if v["type"] == "video.chunk_metadata" => meta.push(v),
            In::Json(v) if v["type"] == "session.done" => break,
            In::Json(v) => panic!("{v}"),
            In::Bin(b) => {
                let now = Instant::now();
                let origin = *first.get_or_insert(now);
                at.push(now - origin);
                bins.push(b);
            }
            In::Closed => panic!("closed"),
        }
    }
    (at, meta, bins)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_chunks_leave_at_their_play_time_minus_the_lead_and_keep_their_bytes() {
    let ts = TestServer::default().await;
    let (fast, _, unpaced) = timed(&ts, json!({})).await;
    for lead in [0.0, 0.375] {
        let (at, meta, paced) = timed(
            &ts,
            json!({"pace_to_media_time": true, "pacing_lead_seconds": lead}),
        )
        .await;
        assert_eq!(paced, unpaced, "pacing only moves when chunks leave");
        assert_eq!(
            meta[0]["paced_wait_ms"], 0.0,
            "the first chunk is never held"
        );
        // Chunk k plays after the 9 + 12·(k − 1) frames before it, at 16 fps.
        for k in 1..at.len() {
            let media = (9 + 12 * (k - 1)) as f64 / 16.0;
            let due = media - lead;
            let got = at[k].as_secs_f64();
            assert!(
                got >= due - 0.020,
                "lead {lead}: chunk {k} arrived {got:.3} s after the first, due at {due:.3} s"
            );
            assert!(meta[k]["paced_wait_ms"].as_f64().is_some(), "{}", meta[k]);
        }
        eprintln!(
            "lead {lead}: chunks arrived at {:?} (unpaced: {:?})",
            at.iter()
                .map(|d| format!("{:.3}", d.as_secs_f64()))
                .collect::<Vec<_>>(),
            fast.iter()
                .map(|d| format!("{:.3}", d.as_secs_f64()))
                .collect::<Vec<_>>()
        );
    }
    // Bad pacing fields are refused by name.
    let mut ws = ts.connect().await;
    let mut start = start_msg(21, 1);
    start["extra_params"] = json!({"pacing_lead_seconds": "soon"});
    send(&mut ws, start).await;
    let e = expect_error(&mut ws, "invalid_request").await;
    assert!(e["message"]
        .as_str()
        .unwrap()
        .contains("extra_params.pacing_lead_seconds"));
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interaction_sent_mid_chunk_starts_on_the_frame_its_arrival_gives() {
    let ts = TestServer::default().await;
    let mut ws = ts.connect().await;
    let mut start = start_msg(0, 5);
    start["extra_params"] = json!({"pace_to_media_time": true, "pacing_lead_seconds": 0});
    send(&mut ws, start).await;
    assert_eq!(recv_json(&mut ws).await["type"], "video.start");
    // Chunks 0 and 1, with when chunk 1 began: its arrival less its wait and its making.
    next_chunk_meta(&mut ws).await;
    let (m1, arrived) = next_chunk_meta(&mut ws).await;
    let made = (m1["latency_ms"].as_f64().unwrap() + m1["paced_wait_ms"].as_f64().unwrap()) / 1e3;
    let boundary = arrived - Duration::from_secs_f64(made);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let sent = Instant::now();
    send(&mut ws, velocity("mid")).await;
    let want = ((sent - boundary).as_secs_f64() * 16.0).floor() as i64;
    // The chunk that starts it: chunk 2.
    let (m2, at) = next_chunk_meta(&mut ws).await;
    assert_eq!(m2["generation_chunk_index"], 2, "{m2}");
    assert_eq!(m2["started_event_ids"], json!(["mid"]));
    let frame = m2["started_event_frames"]["mid"].as_i64().unwrap();
    assert!(
        (frame - want).abs() <= 1 && (1..12).contains(&frame),
        "started at frame {frame}, its arrival gives {want}: {m2}"
    );
    // Key to display: to the chunk's sending, plus the frame's offset in it.
    let latency = m2["action_latency_ms"]["mid"].as_f64().unwrap() / 1e3;
    let seen = (at - sent).as_secs_f64() + frame as f64 / 16.0;
    assert!((latency - seen).abs() < 0.05, "{latency} against {seen}");
    assert!(ts.metric("headroom_action_latency_seconds_count").await >= 1.0);
    send(&mut ws, json!({"type": "session.stop"})).await;
    ts.stop().await;
}

/// The metadata of the next chunk and when its fragment (which follows it) arrived.
async fn next_chunk_meta(ws: &mut Ws) -> (Value, Instant) {
    loop {
        match recv(ws).await {
            In::Json(v) if v["type"] == "video.chunk_metadata" => {
                assert!(matches!(recv(ws).await, In::Bin(_)));
                return (v, Instant::now());
            }
            In::Json(v) => assert_ne!(v["type"], "error", "{v}"),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_prompt_before_a_boundary_wins_and_blends_over_its_transition_chunks() {
    let ts = TestServer::default().await;
    let mut ws = ts.connect().await;
    let mut start = start_msg(0, 5);
    // Paced: between two chunks there is time to queue events for one boundary.
    start["extra_params"] = json!({"pace_to_media_time": true, "pacing_lead_seconds": 0});
    send(&mut ws, start).await;
    assert_eq!(recv_json(&mut ws).await["type"], "video.start");
    let ids = |v: &Value, k: &str| v[k].clone();
    let (m0, _) = next_chunk_meta(&mut ws).await;
    assert_eq!(m0["generation_chunk_index"], 0);
    let prompt = |id: &str, text: &str, chunks: Option<u32>| {
        let mut i = json!({"event_id": id, "event": {"prompt": text}});
        if let Some(n) = chunks {
            i["transition_chunks"] = json!(n);
        }
        json!({"type": "session.interaction", "interaction": i})
    };
    send(&mut ws, prompt("p1", "a red barn", Some(2))).await;
    send(&mut ws, prompt("p2", "snow on the hills", Some(2))).await;
    // p2 wins; p1 completes at the boundary without starting; p2 blends over 2 chunks.
    let (m1, _) = next_chunk_meta(&mut ws).await;
    assert_eq!(ids(&m1, "started_event_ids"), json!(["p2"]), "{m1}");
    assert_eq!(ids(&m1, "completed_event_ids"), json!(["p1"]), "{m1}");
    assert_eq!(ids(&m1, "active_event_ids"), json!(["p2"]), "{m1}");
    let (m2, _) = next_chunk_meta(&mut ws).await;
    assert_eq!(ids(&m2, "active_event_ids"), json!([]), "{m2}");
    assert_eq!(ids(&m2, "completed_event_ids"), json!(["p2"]), "{m2}");
    // The default transition is 3 chunks; a newer prompt replaces it at its boundary.
    send(&mut ws, prompt("p3", "a quiet street", None)).await;
    let (m3, _) = next_chunk_meta(&mut ws).await;
    assert_eq!(ids(&m3, "started_event_ids"), json!(["p3"]), "{m3}");
    let (m4, _) = next_chunk_meta(&mut ws).await;
    assert_eq!(ids(&m4, "active_event_ids"), json!(["p3"]), "{m4}");
    send(&mut ws, prompt("p4", "night falls", Some(0))).await;
    let (m5, _) = next_chunk_meta(&mut ws).await;
    assert_eq!(ids(&m5, "started_event_ids"), json!(["p4"]), "{m5}");
    assert_eq!(ids(&m5, "completed_event_ids"), json!(["p3", "p4"]), "{m5}");
    assert_eq!(ids(&m5, "active_event_ids"), json!([]), "{m5}");
    send(&mut ws, json!({"type": "session.stop"})).await;
    ts.stop().await;
}
