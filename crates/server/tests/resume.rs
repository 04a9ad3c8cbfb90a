//! Sessions that outlive their socket: a hang-up parks the session for its resume
//! token, `session.pause` parks it with its device bytes at 0, a drain moves it to the
//! shared store for another replica, and a replica's periodic snapshots let another
//! one pick its sessions up. Every resumed stream is checked byte for byte: its
//! fragments are the engine's frames of the uninterrupted session from
//! `resumed_from_chunk` on, encoded by a fresh fragmenter (a resumed stream starts with
//! a new init segment).

mod common;

use std::time::Duration;

use headroom_engine::{Engine, EngineConfig, SessionRequest};
use headroom_media::FragmentedMp4;
use headroom_mem::ReclaimPolicy;
use headroom_server::{DoorConfig, ServerConfig};
use serde_json::{json, Value};

use common::*;

const WORLD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/world");

/// A model the sessions run: its engine's `model`, the name it is served as, its size.
#[derive(Debug, Clone, Copy)]
struct Model {
    path: &'static str,
    name: &'static str,
    w: usize,
    h: usize,
}

const TINY: Model = Model {
    path: "tiny",
    name: "tiny",
    w: W,
    h: H,
};

/// An open-ended `session.start` (no `num_frames`).
fn open_ended(seed: u64) -> Value {
    open_ended_of(TINY, seed)
}

/// An open-ended `session.start` of `model`.
fn open_ended_of(model: Model, seed: u64) -> Value {
    json!({"type": "session.start", "model": model.name, "format": "m4s",
           "width": model.w, "height": model.h, "seed": seed, "fps": 16})
}

fn resume_msg(token: &str) -> Value {
    json!({"type": "session.start", "extra_params": {"resume_token": token}})
}

/// The uninterrupted session's chunks `from..to` on a fresh engine, encoded as a
/// resumed stream encodes them (a new fragmenter from chunk `from`).
fn reference(seed: u64, from: usize, to: usize) -> Vec<Vec<u8>> {
    reference_of(TINY, seed, from, to)
}

/// [`reference`] of `model`.
fn reference_of(model: Model, seed: u64, from: usize, to: usize) -> Vec<Vec<u8>> {
    let engine = Engine::new(EngineConfig {
        model: model.path.to_string(),
        reclaim: ReclaimPolicy::BeforeDecode,
        ..EngineConfig::default()
    })
    .unwrap();
    let mut session = engine
        .open_session(SessionRequest {
            seed,
            ..SessionRequest::new(model.w, model.h, 0)
        })
        .unwrap();
    let mut mp4 = FragmentedMp4::new(model.w, model.h, 16).unwrap();
    let mut out = Vec::new();
    for i in 0..to {
        let chunk = session.next_chunk().unwrap();
        if i >= from {
            let bytes = chunk.frames.to_vec::<u8>().unwrap();
            let frames: Vec<&[u8]> = bytes.chunks_exact(model.w * model.h * 3).collect();
            out.push(mp4.fragment(&frames).unwrap());
        }
    }
    out
}

/// Opens an open-ended session of `seed` on `ws` and plays `n` chunks: its token.
async fn open_and_play(ws: &mut Ws, seed: u64, n: usize) -> String {
    send(ws, open_ended(seed)).await;
    let start = recv_json(ws).await;
    assert_eq!(start["type"], "video.start", "{start}");
    let token = start["resume_token"].as_str().unwrap().to_string();
    chunks(ws, n).await;
    token
}

/// Stops the session on `ws` and waits for its end.
async fn stop(ws: &mut Ws) {
    send(ws, json!({"type": "session.stop"})).await;
    until(ws, "session.done").await;
}

/// Reads `n` chunks' binaries (skipping other messages).
async fn chunks(ws: &mut Ws, n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while out.len() < n {
        match recv(ws).await {
            In::Bin(b) => out.push(b),
            In::Json(v) => assert_ne!(v["type"], "error", "{v}"),
            In::Closed => panic!("closed while streaming"),
        }
    }
    out
}

/// Reads messages until one of type `kind`.
async fn until(ws: &mut Ws, kind: &str) -> Value {
    loop {
        match recv(ws).await {
            In::Json(v) if v["type"] == kind => return v,
            In::Json(v) => assert_ne!(v["type"], "error", "waiting for {kind}: {v}"),
            In::Bin(_) => {}
            In::Closed => panic!("closed while waiting for {kind}"),
        }
    }
}

/// Resumes `token` on `ts` and checks the next `n` chunks against the reference.
async fn resume_and_check(ts: &TestServer, token: &str, seed: u64, n: usize) -> Ws {
    let mut ws = ts.connect().await;
    send(&mut ws, resume_msg(token)).await;
    let start = recv_json(&mut ws).await;
    assert_eq!(start["type"], "video.start", "{start}");
    let k = start["resumed_from_chunk"]
        .as_u64()
        .expect("resumed_from_chunk") as usize;
    assert_ne!(
        start["resume_token"],
        json!(token),
        "a resumed session gets a new token"
    );
    let got = chunks(&mut ws, n).await;
    assert_eq!(got, reference(seed, k, k + n), "resumed chunks from {k}");
    assert!(
        boxes(&got[0]).contains(&"moov".to_string()),
        "a resumed stream starts with a new init segment"
    );
    ws
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_up_session_resumes_once_from_its_token_with_the_uninterrupted_bytes() {
    let ts = TestServer::default().await;
    let mut ws = ts.connect().await;
    send(&mut ws, open_ended(5)).await;
    let start = recv_json(&mut ws).await;
    let token = start["resume_token"].as_str().unwrap().to_string();
    assert_eq!(token.len(), 32);
    let first = chunks(&mut ws, 2).await;
    assert_eq!(first, reference(5, 0, 2), "the stream itself");
    drop(ws); // hang up
              // The session parks at its next boundary: its device bytes go, its state stays.
    tokio::time::timeout(GUARD, async {
        while ts.metric("headroom_sessions_parked").await < 1.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    assert!(ts.metric("headroom_parked_bytes").await > 0.0);
    ts.idle().await;
    ts.assert_pool_free();

    let mut ws = resume_and_check(&ts, &token, 5, 2).await;
    stop(&mut ws).await;
    assert_eq!(ts.metric("headroom_sessions_parked").await, 0.0);

    // Used once: the same token again, and a guessed one, are refused by name.
    for t in [token.as_str(), "0123456789abcdef0123456789abcdef"] {
        let mut ws = ts.connect().await;
        send(&mut ws, resume_msg(t)).await;
        let e = expect_error(&mut ws, "resume_refused").await;
        assert!(e["message"].as_str().unwrap().contains("resume"), "{e}");
    }
    let mut ws = ts.connect().await;
    send(&mut ws, resume_msg("not-a-token")).await;
    let e = expect_error(&mut ws, "invalid_request").await;
    assert!(e["message"]
        .as_str()
        .unwrap()
        .contains("extra_params.resume_token"));
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_slots_of_world_hold_eight_sessions_six_parked_and_each_resumes_byte_identically() {
    // `world`, the default model, at its own 128×96.
    let world = Model {
        path: WORLD,
        name: "world",
        w: 128,
        h: 96,
    };
    let ts = TestServer::start_model(
        WORLD,
        "world",
        EngineConfig {
            reclaim: ReclaimPolicy::BeforeDecode,
            ..EngineConfig::default()
        },
        ServerConfig {
            max_sessions: 2,
            ..ServerConfig::default()
        },
    )
    .await;
    // Eight sessions, two at a time: each makes a chunk, then pauses.
    let mut paused = Vec::new();
    for pair in 0..4u64 {
        let mut pair_ws = Vec::new();
        for k in 0..2 {
            let seed = 10 + 2 * pair + k;
            let mut ws = ts.connect().await;
            send(&mut ws, open_ended_of(world, seed)).await;
            let start = recv_json(&mut ws).await;
            assert_eq!(start["type"], "video.start", "{start}");
            chunks(&mut ws, 1).await;
            send(&mut ws, json!({"type": "session.pause"})).await;
            pair_ws.push((ws, seed));
        }
        for (mut ws, seed) in pair_ws {
            let p = until(&mut ws, "session.paused").await;
            assert!(p["parked_bytes"].as_u64().unwrap() > 0);
            paused.push((ws, seed, p["next_chunk"].as_u64().unwrap() as usize));
        }
    }
    assert_eq!(ts.metric("headroom_sessions_parked").await, 8.0);
    assert_eq!(ts.server.open_sessions(), 0, "parked sessions hold no slot");
    ts.assert_pool_free();
    // Two resume and run: 2 active, 6 parked.
    let mut active = Vec::new();
    for (mut ws, seed, next) in paused.drain(..2) {
        send(&mut ws, json!({"type": "session.resume"})).await;
        let start = until(&mut ws, "video.start").await;
        assert_eq!(start["resumed_from_chunk"], next);
        let got = chunks(&mut ws, 1).await;
        assert_eq!(got, reference_of(world, seed, next, next + 1));
        active.push(ws);
    }
    assert_eq!(ts.metric("headroom_sessions_parked").await, 6.0);
    assert_eq!(ts.server.open_sessions(), 2);
    for mut ws in active {
        send(&mut ws, json!({"type": "session.stop"})).await;
        until(&mut ws, "session.done").await;
    }
    // The other six resume in turn, each byte-identical.
    for (mut ws, seed, next) in paused {
        send(&mut ws, json!({"type": "session.resume"})).await;
        let start = until(&mut ws, "video.start").await;
        assert_eq!(start["resumed_from_chunk"], next);
        assert_eq!(
            chunks(&mut ws, 1).await,
            reference_of(world, seed, next, next + 1)
        );
        send(&mut ws, json!({"type": "session.stop"})).await;
        until(&mut ws, "session.done").await;
    }
    assert_eq!(ts.metric("headroom_sessions_parked").await, 0.0);
    ts.idle().await;
    ts.assert_pool_free();
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_resumes_only_with_the_key_that_opened_its_session() {
    let ts = TestServer::start(
        ServerConfig {
            door: DoorConfig {
                api_keys: vec!["k1".into(), "k2".into()],
                ..DoorConfig::default()
            },
            ..ServerConfig::default()
        },
        None,
    )
    .await;
    let mut ws = ts
        .connect_with(&[("authorization", "Bearer k1")])
        .await
        .unwrap();
    let token = open_and_play(&mut ws, 3, 1).await;
    drop(ws);
    let mut other = ts
        .connect_with(&[("authorization", "Bearer k2")])
        .await
        .unwrap();
    send(&mut other, resume_msg(&token)).await;
    let e = expect_error(&mut other, "resume_refused").await;
    assert!(
        e["message"].as_str().unwrap().contains("another API key"),
        "{e}"
    );
    // The refusal did not use the token up: its own key resumes it.
    let mut own = ts
        .connect_with(&[("authorization", "Bearer k1")])
        .await
        .unwrap();
    send(&mut own, resume_msg(&token)).await;
    let start = until(&mut own, "video.start").await;
    assert!(start["resumed_from_chunk"].as_u64().unwrap() >= 1);
    stop(&mut own).await;
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_sessions_to_the_store_and_another_replica_resumes_them() {
    let store = tempfile::tempdir().unwrap();
    let config = || ServerConfig {
        max_sessions: 2,
        session_store: Some(store.path().to_path_buf()),
        drain_timeout: Duration::from_secs(300),
        ..ServerConfig::default()
    };
    let a = TestServer::start(config(), None).await;
    let b = TestServer::start(config(), None).await;
    // One session running, one paused, when the drain comes.
    let mut paused = a.connect().await;
    let paused_token = open_and_play(&mut paused, 8, 1).await;
    send(&mut paused, json!({"type": "session.pause"})).await;
    until(&mut paused, "session.paused").await;
    let mut ws = a.connect().await;
    let token = open_and_play(&mut ws, 7, 1).await;
    let (status, _) = a.post("/drain").await;
    assert_eq!(status, 202);
    for (ws, token) in [(&mut ws, &token), (&mut paused, &paused_token)] {
        let moved = until(ws, "session.moved").await;
        assert_eq!(moved["resume_token"], json!(token));
    }
    // The drain ends with the sessions moved, long before --drain-timeout.
    a.served().await;
    let files: Vec<_> = std::fs::read_dir(store.path()).unwrap().collect();
    assert_eq!(files.len(), 4, "two snapshots and their records");
    let mut ws = resume_and_check(&b, &token, 7, 2).await;
    let mut paused = resume_and_check(&b, &paused_token, 8, 1).await;
    assert!(
        std::fs::read_dir(store.path()).unwrap().next().is_none(),
        "claimed: the store holds nothing"
    );
    stop(&mut ws).await;
    stop(&mut paused).await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_snapshots_let_another_replica_resume_and_a_corrupt_one_is_refused() {
    let store = tempfile::tempdir().unwrap();
    let config = || ServerConfig {
        session_store: Some(store.path().to_path_buf()),
        snapshot_every: Some(1),
        ..ServerConfig::default()
    };
    let a = TestServer::start(config(), None).await;
    let b = TestServer::start(config(), None).await;
    let mut ws = a.connect().await;
    let token = open_and_play(&mut ws, 9, 2).await;
    // Replica A is lost to the client from here (a crash, as B sees it): B resumes from
    // A's last periodic snapshot.
    let mut ws_b = resume_and_check(&b, &token, 9, 1).await;
    stop(&mut ws_b).await;
    stop(&mut ws).await;

    a.idle().await;
    assert!(
        std::fs::read_dir(store.path()).unwrap().next().is_none(),
        "a session that ended for good leaves nothing in the store"
    );

    // A hang-up on a server with a store parks there; a corrupt snapshot is refused by
    // name and leaves nothing behind.
    let mut ws = a.connect().await;
    let token = open_and_play(&mut ws, 11, 1).await;
    drop(ws);
    a.idle().await;
    let snap = std::fs::read_dir(store.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "hrsnap"))
        .expect("the hung-up session is in the store");
    let mut bytes = std::fs::read(&snap).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0xFF;
    std::fs::write(&snap, bytes).unwrap();
    let mut ws = b.connect().await;
    send(&mut ws, resume_msg(&token)).await;
    let e = expect_error(&mut ws, "resume_refused").await;
    assert!(e["message"].as_str().unwrap().contains("checksum"), "{e}");
    assert!(!snap.exists(), "the corrupt file is gone");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_up_session_is_dropped_after_its_resume_window() {
    let store = tempfile::tempdir().unwrap();
    for session_store in [None, Some(store.path().to_path_buf())] {
        let with_store = session_store.is_some();
        let ts = TestServer::start(
            ServerConfig {
                resume_window: Duration::from_millis(300),
                session_store,
                ..ServerConfig::default()
            },
            None,
        )
        .await;
        let mut ws = ts.connect().await;
        let token = open_and_play(&mut ws, 4, 1).await;
        drop(ws);
        ts.idle().await;
        // The sweeper (every second) drops it once the window passed.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(ts.metric("headroom_sessions_parked").await, 0.0);
        if with_store {
            assert!(
                std::fs::read_dir(store.path()).unwrap().next().is_none(),
                "the store dropped it too"
            );
        }
        let mut ws = ts.connect().await;
        send(&mut ws, resume_msg(&token)).await;
        expect_error(&mut ws, "resume_refused").await;
        ts.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_parked_memory_cap_a_session_parks_in_the_store_or_is_refused() {
    let store = tempfile::tempdir().unwrap();
    for session_store in [None, Some(store.path().to_path_buf())] {
        let with_store = session_store.is_some();
        let ts = TestServer::start(
            ServerConfig {
                max_parked_bytes: Some(1),
                session_store,
                ..ServerConfig::default()
            },
            None,
        )
        .await;
        let mut ws = ts.connect().await;
        let token = open_and_play(&mut ws, 6, 1).await;
        send(&mut ws, json!({"type": "session.pause"})).await;
        if with_store {
            // Parked on disk instead: host memory holds nothing, and it resumes.
            let p = until(&mut ws, "session.paused").await;
            assert_eq!(p["resume_token"], json!(token));
            assert_eq!(ts.metric("headroom_parked_bytes").await, 0.0);
            send(&mut ws, json!({"type": "session.resume"})).await;
            let start = until(&mut ws, "video.start").await;
            let next = start["resumed_from_chunk"].as_u64().unwrap() as usize;
            assert_eq!(chunks(&mut ws, 1).await, reference(6, next, next + 1));
            stop(&mut ws).await;
        } else {
            // Chunks made before the boundary may come first.
            let e = loop {
                match recv(&mut ws).await {
                    In::Json(v) if v["type"] == "error" => break v,
                    In::Closed => panic!("closed without an error"),
                    _ => {}
                }
            };
            assert_eq!(e["code"], "capacity", "{e}");
            assert!(
                e["message"]
                    .as_str()
                    .unwrap()
                    .contains("--max-parked-bytes"),
                "{e}"
            );
        }
        ts.idle().await;
        ts.assert_pool_free();
        ts.stop().await;
    }
}
