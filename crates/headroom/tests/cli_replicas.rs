//! Three `headroom serve` replicas of `tiny` (`--max-sessions 1`) behind HAProxy with
//! the committed `deploy/haproxy.cfg`: six clients arriving over two seconds are all
//! served, each replica serves at least one, and a replica drained mid-session finishes
//! its session, takes no new one while the others serve, and exits 0.
//!
//! Needs Debian's `haproxy`: skipped where it is missing, failed under `CI=true` (or
//! `HEADROOM_REQUIRE_HAPROXY=1`).

#[path = "common/balancer.rs"]
mod balancer;
mod common;

use balancer::{haproxy, Replica};

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const KEY: &str = "lb-key.1";
/// The health checks' interval in deploy/haproxy.cfg.
const CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// What one client saw.
#[derive(Debug, Default)]
struct Client {
    queued: bool,
    chunks: usize,
    end: Value,
}

/// One client through the balancer: a 21-frame session, pinging while it waits.
async fn client(lb: String, seed: u64) -> Client {
    let mut request = format!("ws://{lb}/v1/realtime/video")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let start = json!({"type": "session.start", "model": "tiny", "width": 48, "height": 32,
                       "num_frames": 21, "seed": seed});
    ws.send(Message::text(start.to_string())).await.unwrap();
    let mut out = Client::default();
    let mut ping = tokio::time::interval(Duration::from_millis(500));
    loop {
        let message = tokio::select! {
            m = ws.next() => m,
            _ = ping.tick() => {
                let _ = ws.send(Message::text(json!({"type": "session.ping"}).to_string())).await;
                continue;
            }
        };
        match message {
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                match v["type"].as_str() {
                    Some("session.queued") => out.queued = true,
                    Some("video.chunk_metadata") => out.chunks += 1,
                    Some("session.done") | Some("error") => {
                        out.end = v;
                        return out;
                    }
                    _ => {}
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("client {seed}: {e}"),
            None => return out,
        }
    }
}

#[test]
fn three_replicas_behind_haproxy_serve_every_client_and_one_drains_cleanly() {
    let args = [
        "--model",
        "tiny",
        "--width",
        "48",
        "--height",
        "32",
        "--max-sessions",
        "1",
        "--drain-timeout",
        "60",
    ];
    let replicas: Vec<Replica> = (0..3).map(|_| Replica::start(&args, Some(KEY))).collect();
    let Some((mut lb_child, lb)) = haproxy(&replicas) else {
        return;
    };
    // The checks see every replica ready before the clients come.
    std::thread::sleep(4 * CHECK_INTERVAL);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // Six clients over two seconds.
    let clients: Vec<Client> = runtime.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..6u64 {
            tasks.push(tokio::spawn(client(lb.clone(), i + 1)));
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let completed = |r: &Replica| r.metric("headroom_sessions_completed_total") as u64;
    let served: Vec<u64> = replicas.iter().map(completed).collect();
    let queued = clients.iter().filter(|c| c.queued).count();
    eprintln!("sessions per replica {served:?}; {queued} of 6 clients waited in a queue");
    for (i, c) in clients.iter().enumerate() {
        assert_eq!(c.end["type"], "session.done", "client {i}: {:?}", c.end);
        assert_eq!(c.end["stopped"], false, "client {i}: {:?}", c.end);
        assert_eq!(c.chunks, 2, "client {i}");
    }
    assert_eq!(served.iter().sum::<u64>(), 6, "{served:?}");
    assert!(
        served.iter().all(|&n| n >= 1),
        "every replica serves: {served:?}"
    );

    // Drain replica 0 mid-session: its session finishes, no new session lands on it.
    let (running, drained) = runtime.block_on(async {
        // Occupy every replica, then drain the one whose slot is taken first.
        let first = tokio::spawn(client(lb.clone(), 100));
        let deadline = Instant::now() + Duration::from_secs(60);
        let busy = loop {
            if let Some(i) = (0..3).find(|&i| replicas[i].request("GET", "/ready").0 == 503) {
                break i;
            }
            assert!(Instant::now() < deadline, "no replica took the session");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let asked = Instant::now();
        assert_eq!(replicas[busy].request("POST", "/drain").0, 202);
        let (status, body) = replicas[busy].request("GET", "/ready");
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("draining"), "{body}");
        assert!(asked.elapsed() < Duration::from_secs(1));
        // New clients while it drains go to the others.
        let mut later = Vec::new();
        for i in 0..3u64 {
            later.push(tokio::spawn(client(lb.clone(), 200 + i)));
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let first = first.await.unwrap();
        let mut rest = Vec::new();
        for t in later {
            rest.push(t.await.unwrap());
        }
        ((first, rest), busy)
    });
    let (first, rest) = running;
    assert_eq!(first.end["type"], "session.done", "{:?}", first.end);
    assert_eq!(
        (first.end["stopped"].as_bool(), first.chunks),
        (Some(false), 2)
    );
    for c in &rest {
        assert_eq!(c.end["type"], "session.done", "{:?}", c.end);
        assert_eq!(c.end["stopped"], false);
    }
    // The drained replica exits 0 once its session is done (well within --drain-timeout).
    let mut replicas = replicas;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = replicas[drained].child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the drained replica never exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let others: u64 = (0..3)
        .filter(|&i| i != drained)
        .map(|i| completed(&replicas[i]))
        .sum();
    let before: u64 = (0..3).filter(|&i| i != drained).map(|i| served[i]).sum();
    assert_eq!(
        others - before,
        3,
        "the three later clients went to the other replicas"
    );
    let _ = lb_child.kill();
    let _ = lb_child.wait();
}

#[test]
fn the_kubernetes_manifests_parse_probe_ready_and_drain_before_they_stop() {
    // No cluster here: the manifests' syntax and the settings the drain relies on.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes.json");
    let list: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let items = list["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().filter_map(|i| i["kind"].as_str()).collect();
    assert_eq!(kinds, ["Deployment", "Service"]);
    for item in items {
        assert!(item["apiVersion"].is_string() && item["metadata"]["name"].is_string());
    }
    let pod = &items[0]["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/ready");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/health");
    let stop = container["lifecycle"]["preStop"]["exec"]["command"].to_string();
    assert!(
        stop.contains("/drain") && stop.contains("Authorization"),
        "{stop}"
    );
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let drain: u64 = args[args.iter().position(|a| *a == "--drain-timeout").unwrap() + 1]
        .parse()
        .unwrap();
    // Kubernetes kills the pod after its grace period: it must outlast the drain.
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > drain);
    // The flags exist as written.
    let mut help = args.clone();
    help.push("--help");
    common::assert_ok(&common::headroom(&help));
}
