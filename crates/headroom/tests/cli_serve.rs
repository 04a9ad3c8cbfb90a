//! `headroom serve` through the real binary: it listens, answers health and readiness,
//! and exits 0 on SIGTERM. (The WebSocket protocol is tested in `crates/server`.)

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use common::{get_with_key, http_get as get};

#[test]
fn serve_answers_health_and_ready_then_exits_zero_on_sigterm() {
    // A key from the environment, as an operator passes a secret.
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args([
            "serve", "--model", "tiny", "--port", "0", "--width", "48", "--height", "32",
        ])
        .env("HEADROOM_API_KEY", "cli-key.1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("the headroom binary runs");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap() > 0 {
        if let Some(rest) = line.split("listening on http://").nth(1) {
            addr = rest.split_whitespace().next().map(str::to_string);
            break;
        }
        line.clear();
    }
    let addr = addr.expect("serve prints the address it listens on");
    assert_eq!(get(&addr, "/health").0, 200);
    let (status, body) = get(&addr, "/ready");
    assert_eq!(status, 200, "{body}");
    // Without the key: 401, before any work.
    let (status, body) = get(&addr, "/metrics");
    assert_eq!(status, 401, "{body}");
    // `bench serve --api-key` sends it, as vLLM-Omni's client sends its header.
    let (status, metrics) = get_with_key(&addr, "/metrics", "cli-key.1");
    assert_eq!(status, 200);
    assert!(metrics.contains("headroom_allocated_bytes "));
    // `headroom bench serve` measures the running server.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ws://{addr}/v1/realtime/video");
    let bench = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args([
            "bench",
            "serve",
            "--url",
            &url,
            "--sessions",
            "2",
            "--concurrency",
            "2",
            "--frames",
            "21",
            "--width",
            "48",
            "--height",
            "32",
            "--out",
            dir.path().to_str().unwrap(),
            "--api-key",
            "cli-key.1",
        ])
        .output()
        .unwrap();
    common::assert_ok(&bench);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).unwrap()).unwrap();
    // Two clients at once against one slot: both served, the second from the queue.
    assert_eq!(summary["sessions"], 2);
    assert_eq!(summary["clients"], 2);
    assert_eq!(summary["all_served"], true);
    for key in [
        "queue_wait_p50_s",
        "queue_wait_max_s",
        "ttfc_p50_s",
        "interval_mean_s",
        "interval_p50_s",
        "interval_p95_s",
        "interval_p99_s",
        "interval_max_s",
        "realtime_factor",
        "deadline_attainment",
    ] {
        assert!(summary[key].as_f64().is_some(), "missing {key}");
    }
    let sessions = summary["per_session"].as_array().unwrap();
    assert!(sessions
        .iter()
        .all(|s| s["chunk_frames"] == serde_json::json!([9, 12])));
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: kill only sends a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "{status:?}: {rest}");
    assert!(rest.contains("stopped"), "{rest}");
}

#[test]
fn serve_refuses_bad_flags_with_the_flag_and_the_rule() {
    for (flag, value, says) in [
        ("--max-sessions", "0", "--max-sessions"),
        ("--kv-budget", "1.5", "--kv-budget"),
        ("--stall-timeout", "0", "--stall-timeout"),
        ("--queue-timeout", "0", "--queue-timeout"),
        ("--api-key", "has space", "--api-key"),
        ("--max-connections", "0", "--max-connections"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args(["serve", "--model", "tiny", "--port", "0", flag, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains(says), "{flag}: {err}");
    }
}
