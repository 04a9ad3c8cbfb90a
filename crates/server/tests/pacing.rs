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
            assert!(
                meta[k]["paced_wait_ms"].as_f64().unwrap() > 0.0,
                "{}",
                meta[k]
            );
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
