//! Sessions generating at once on one server step together (one batched forward per
//! DMD step, batched VAE work) and stream the bytes each streams alone.

mod common;
use common::*;

use headroom_server::ServerConfig;

fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from {metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sessions_step_together_and_stream_the_bytes_each_streams_alone() {
    step_together(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_batch_steps_the_chunks_due_soonest_and_keeps_the_bytes() {
    step_together(Some(2)).await;
}

/// Three sessions at once (and each alone first) under `max_batch`.
async fn step_together(max_batch: Option<usize>) {
    let config = ServerConfig {
        max_sessions: 3,
        max_batch,
        ..ServerConfig::default()
    };
    let ts = TestServer::start(config, None).await;
    let requests = [(33, 41), (21, 42), (33, 43)];
    let mut alone = Vec::new();
    for (frames, seed) in requests {
        alone.push(run_session(&ts, frames, seed).await.binaries);
        ts.idle().await;
    }
    let (_, before) = ts.get("/metrics").await;
    let (mut a, _) = open(&ts, requests[0].0, requests[0].1).await;
    let (mut b, _) = open(&ts, requests[1].0, requests[1].1).await;
    let (mut c, _) = open(&ts, requests[2].0, requests[2].1).await;
    let mut late_seen = 0;
    let (ra, rb, rc) = tokio::join!(
        stream_to_end(&mut a),
        stream_to_end(&mut b),
        stream_to_end(&mut c)
    );
    for (k, streamed) in [ra, rb, rc].into_iter().enumerate() {
        assert_eq!(streamed.end.as_ref().unwrap()["type"], "session.done");
        assert!(
            streamed.binaries == alone[k],
            "session {k} differs from alone"
        );
        // Each chunk says how far behind its client's playback clock it was ready
        // (the clock starts with the first chunk).
        let behind: Vec<f64> = streamed
            .metadata
            .iter()
            .map(|m| m["behind_playback_ms"].as_f64().unwrap())
            .collect();
        assert_eq!(behind[0], 0.0, "{behind:?}");
        assert!(behind.iter().all(|b| *b >= 0.0), "{behind:?}");
        late_seen += behind.iter().filter(|b| **b > 0.0).count() as u64;
    }
    ts.idle().await;
    ts.assert_pool_free();
    let (_, after) = ts.get("/metrics").await;
    let batches = counter(&after, "headroom_step_batches_total")
        - counter(&before, "headroom_step_batches_total");
    let stepped = counter(&after, "headroom_stepped_session_chunks_total")
        - counter(&before, "headroom_stepped_session_chunks_total");
    assert_eq!(
        stepped,
        3 + 2 + 3,
        "every chunk went through the step queue"
    );
    assert!(
        batches < stepped,
        "some chunks ran together: {batches} steps"
    );
    if let Some(max) = max_batch {
        assert!(
            batches * max as u64 >= stepped,
            "no batch over {max}: {batches} steps"
        );
    }
    // Every chunk that was ready behind its playback deadline is counted.
    let late = counter(&after, "headroom_chunks_behind_playback_total")
        - counter(&before, "headroom_chunks_behind_playback_total");
    assert_eq!(late, late_seen, "{after}");
    ts.stop().await;
}
