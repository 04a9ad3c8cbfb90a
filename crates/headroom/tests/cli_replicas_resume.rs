//! Sessions that outlive their replica: three `headroom serve` replicas of `world`
//! behind HAProxy (`deploy/haproxy.cfg`) share one `--session-store` and write each
//! session's snapshot there after every chunk (`--snapshot-every 1`). Four open-ended
//! sessions run; one replica is drained and another SIGKILLed; every client reconnects
//! through the balancer with its resume token and goes on, and every stream it played
//! is, fragment for fragment, the uninterrupted session's frames from that stream's
//! `resumed_from_chunk` on. The drained replica exits 0 without waiting for its
//! `--drain-timeout`.
//!
//! Needs Debian's `haproxy`: skipped where it is missing, failed under `CI=true` (or
//! `HEADROOM_REQUIRE_HAPROXY=1`).

#[path = "common/balancer.rs"]
mod balancer;

use std::time::{Duration, Instant};

use balancer::{haproxy, Replica};

use futures_util::{SinkExt, StreamExt};
use headroom_engine::{Engine, EngineConfig, SessionRequest};
use headroom_media::FragmentedMp4;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const WORLD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/world");
const DRAIN_TIMEOUT_S: u64 = 120;
/// Chunks each client plays in all (over its streams).
const CHUNKS: usize = 5;

/// One stream a client played: where it started and its fragments.
#[derive(Debug)]
struct Played {
    from: usize,
    fragments: Vec<Vec<u8>>,
}

/// What one client did: its streams, and how each ended (`moved`, `closed`, `done`).
#[derive(Debug)]
struct Client {
    seed: u64,
    streams: Vec<Played>,
    ends: Vec<String>,
    /// Each chunk's generate + encode time on its replica, ms (`latency_ms`).
    chunk_ms: Vec<f64>,
}

/// One client through the balancer: an open-ended session of `seed`, reconnecting with
/// its latest resume token whenever its stream ends before `CHUNKS` chunks, until it
/// has played chunk `CHUNKS - 1`; `go` tells it the replicas are about to go away once
/// it played `first` chunks.
async fn client(lb: String, seed: u64, played_first: tokio::sync::mpsc::Sender<u64>) -> Client {
    let mut out = Client {
        seed,
        streams: Vec::new(),
        ends: Vec::new(),
        chunk_ms: Vec::new(),
    };
    let mut token: Option<String> = None;
    let mut told = false;
    'streams: loop {
        let deadline = Instant::now() + Duration::from_secs(300);
        let ws = loop {
            let url = format!("ws://{lb}/v1/realtime/video");
            if let Ok((ws, _)) = tokio_tungstenite::connect_async(url).await {
                break ws;
            }
            assert!(Instant::now() < deadline, "client {seed} cannot connect");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let mut ws = ws;
        let start = match &token {
            None => json!({"type": "session.start", "model": "world", "seed": seed, "fps": 16}),
            Some(t) => json!({"type": "session.start", "extra_params": {"resume_token": t}}),
        };
        ws.send(Message::text(start.to_string())).await.unwrap();
        let mut stream: Option<Played> = None;
        loop {
            let message = tokio::time::timeout(Duration::from_secs(300), ws.next())
                .await
                .expect("client waited 300 s");
            let v: Value = match message {
                Some(Ok(Message::Text(t))) => serde_json::from_str(t.as_str()).unwrap(),
                Some(Ok(Message::Binary(b))) => {
                    let s = stream.as_mut().expect("a fragment before video.start");
                    s.fragments.push(b.to_vec());
                    let played = s.from + s.fragments.len();
                    if !told && played >= 2 {
                        told = true;
                        let _ = played_first.send(seed).await;
                    }
                    if played >= CHUNKS {
                        let _ = ws
                            .send(Message::text(json!({"type": "session.stop"}).to_string()))
                            .await;
                    }
                    continue;
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => {
                    out.ends.push("closed".into());
                    out.streams.extend(stream.take());
                    continue 'streams;
                }
            };
            match v["type"].as_str() {
                Some("video.chunk_metadata") => out.chunk_ms.extend(v["latency_ms"].as_f64()),
                Some("video.start") => {
                    token = v["resume_token"].as_str().map(str::to_string);
                    let from = v["resumed_from_chunk"].as_u64().unwrap_or(0) as usize;
                    stream = Some(Played {
                        from,
                        fragments: Vec::new(),
                    });
                }
                Some("session.moved") => {
                    token = v["resume_token"].as_str().map(str::to_string);
                    out.ends.push("moved".into());
                    out.streams.extend(stream.take());
                    continue 'streams;
                }
                Some("session.done") => {
                    out.ends.push("done".into());
                    out.streams.extend(stream.take());
                    return out;
                }
                Some("error") if v["code"] == "draining" || v["code"] == "capacity" => {
                    // Landed on a replica going away or full: try again.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue 'streams;
                }
                Some("error") => panic!("client {seed}: {v}"),
                _ => {}
            }
        }
    }
}

/// The uninterrupted session's chunks of `seed` on `world`, `0..to`, as frames.
fn frames(seed: u64, to: usize) -> Vec<Vec<u8>> {
    let engine = Engine::new(EngineConfig {
        model: WORLD.to_string(),
        ..EngineConfig::default()
    })
    .unwrap();
    let mut session = engine
        .open_session(SessionRequest {
            seed,
            ..SessionRequest::new(128, 96, 0)
        })
        .unwrap();
    (0..to)
        .map(|_| session.next_chunk().unwrap().frames.to_vec::<u8>().unwrap())
        .collect()
}

/// `chunks[from..]` fragmented as a stream that starts at `from` does.
fn fragments(chunks: &[Vec<u8>], from: usize, n: usize) -> Vec<Vec<u8>> {
    let mut mp4 = FragmentedMp4::new(128, 96, 16).unwrap();
    chunks[from..from + n]
        .iter()
        .map(|c| {
            let frames: Vec<&[u8]> = c.chunks_exact(128 * 96 * 3).collect();
            mp4.fragment(&frames).unwrap()
        })
        .collect()
}

#[test]
fn drained_and_killed_replicas_sessions_resume_elsewhere_byte_for_byte() {
    let store = tempfile::tempdir().unwrap();
    let drain = DRAIN_TIMEOUT_S.to_string();
    let store_dir = store.path().to_str().unwrap();
    let args = [
        "--model",
        "world",
        "--max-sessions",
        "2",
        "--drain-timeout",
        &drain,
        "--stall-timeout",
        "600",
        "--snapshot-every",
        "1",
        "--session-store",
        store_dir,
    ];
    let mut replicas: Vec<Replica> = (0..3).map(|_| Replica::start(&args, None)).collect();
    let Some((mut lb_child, lb)) = haproxy(&replicas) else {
        return;
    };
    std::thread::sleep(Duration::from_secs(1));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let (clients, drained, drain_s) = runtime.block_on(async {
        let mut tasks = Vec::new();
        for seed in 1..=4u64 {
            tasks.push(tokio::spawn(client(lb.clone(), seed, tx.clone())));
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        // Every client has played two chunks: drain one busy replica, kill another.
        for _ in 0..4 {
            rx.recv().await.unwrap();
        }
        let busy: Vec<usize> = (0..3)
            .filter(|&i| replicas[i].metric("headroom_sessions_open") > 0.0)
            .collect();
        assert!(busy.len() >= 2, "sessions on {busy:?} only");
        let (drained, killed) = (busy[0], busy[1]);
        let asked = Instant::now();
        assert_eq!(replicas[drained].request("POST", "/drain").0, 202);
        replicas[killed].child.kill().unwrap();
        replicas[killed].child.wait().unwrap();
        let status = loop {
            if let Some(status) = replicas[drained].child.try_wait().unwrap() {
                break status;
            }
            assert!(
                asked.elapsed() < Duration::from_secs(DRAIN_TIMEOUT_S),
                "the drain waited for its timeout"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(status.success(), "the drained replica exits 0: {status:?}");
        let drain_s = asked.elapsed().as_secs_f64();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        (out, drained, drain_s)
    });
    let mut chunk_ms: Vec<f64> = clients.iter().flat_map(|c| c.chunk_ms.clone()).collect();
    chunk_ms.sort_by(f64::total_cmp);
    eprintln!(
        "the drained replica {drained} exited {drain_s:.2} s after POST /drain; a chunk took {:.2} s (median of {}, under this test's load)",
        chunk_ms[chunk_ms.len() / 2] / 1e3,
        chunk_ms.len()
    );
    let mut moved = 0;
    let mut reconnected = 0;
    for c in &clients {
        eprintln!(
            "client {}: streams from {:?}, ends {:?}",
            c.seed,
            c.streams.iter().map(|s| s.from).collect::<Vec<_>>(),
            c.ends
        );
        moved += c.ends.iter().filter(|e| *e == "moved").count();
        reconnected += usize::from(c.streams.len() > 1);
        let last = c.streams.last().unwrap();
        assert!(
            last.from + last.fragments.len() >= CHUNKS,
            "client {} played to the end",
            c.seed
        );
        let truth = frames(c.seed, CHUNKS + 1);
        for s in &c.streams {
            assert_eq!(
                s.fragments,
                fragments(&truth, s.from, s.fragments.len()),
                "client {}: the stream from chunk {}",
                c.seed,
                s.from
            );
        }
        // A resumed stream loses at most the one chunk after the last snapshot.
        for pair in c.streams.windows(2) {
            let played = pair[0].from + pair[0].fragments.len();
            assert!(pair[1].from <= played + 1 && pair[1].from >= played.saturating_sub(1));
        }
    }
    assert!(moved >= 1, "the drain moved a session");
    assert!(
        reconnected >= 2,
        "the drained and the killed replicas' clients came back"
    );
    let _ = lb_child.kill();
    let _ = lb_child.wait();
}
