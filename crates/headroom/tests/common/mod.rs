//! Helpers shared by the CLI tests: run the real binary, check that it succeeded.
#![allow(dead_code)]

use std::process::{Command, Output};

/// The tiny model's smallest session: 48×32, 9 frames.
pub const TINY_SESSION: [&str; 8] = [
    "--model", "tiny", "--width", "48", "--height", "32", "--frames", "9",
];

/// `generate --out OUT` on [`TINY_SESSION`], each of its flags replaced by `extra`'s
/// own when `extra` sets it, then `extra`.
pub fn tiny_generate<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["generate", "--out", out];
    for pair in TINY_SESSION.chunks_exact(2) {
        if !extra.contains(&pair[0]) {
            args.extend_from_slice(pair);
        }
    }
    args.extend_from_slice(extra);
    args
}

/// Runs `headroom` with `args`.
pub fn headroom(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .output()
        .expect("the headroom binary runs")
}

/// Panics with the command's stderr unless it exited successfully.
pub fn assert_ok(res: &Output) {
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
}

/// The f32 values of an `.npy` file (a `--dump-latents` output).
pub fn npy_values(path: &std::path::Path) -> Vec<f32> {
    let device = headroom_tensor::Device::cpu().unwrap();
    headroom_tensor::io::npy::read_npy(path, &device)
        .unwrap()
        .to_f32_vec()
        .unwrap()
}

/// The largest |a − b| over the largest |a|: how far `b` is from `a`, relative.
pub fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "same number of values");
    let scale = a.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
    let diff = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max(f64::from((x - y).abs())));
    diff / scale.max(f64::MIN_POSITIVE)
}

/// `GET path` on `addr` over plain HTTP/1.1: the status code and the whole response.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    http_get_with(addr, path, "")
}

/// [`http_get`] with the API key `key` as `Authorization: Bearer`.
pub fn get_with_key(addr: &str, path: &str, key: &str) -> (u16, String) {
    http_get_with(addr, path, &format!("Authorization: Bearer {key}\r\n"))
}

/// A GET with the extra header lines `headers` (each ending in CRLF).
fn http_get_with(addr: &str, path: &str, headers: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: t\r\n{headers}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let status = text[9..12].parse().unwrap();
    (status, text)
}

/// The `(allocated, reserved, post-session reserved)` fields `keys` of each rank row.
fn triples(rows: &[serde_json::Value], keys: [&str; 3]) -> Vec<(u64, u64, u64)> {
    let field = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap();
    rows.iter()
        .map(|r| (field(r, keys[0]), field(r, keys[1]), field(r, keys[2])))
        .collect()
}

/// `(allocated peak, reserved peak, post-session reserved)` of each rank, in rank order,
/// from `headroom --threads 1 plan … --json` (one policy; scratch sizes follow the thread
/// count, so plans and runs use the same one).
pub fn plan_ranks(args: &[&str]) -> Vec<(u64, u64, u64)> {
    let keys = [
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "post_session_reserved_bytes",
    ];
    triples(&plan_report(args), keys)
}

/// Each rank's `(collective kind, calls, input bytes)` from a plan or generate report's
/// rank rows.
pub fn collective_counts(ranks: &[serde_json::Value]) -> Vec<Vec<(String, u64, u64)>> {
    ranks
        .iter()
        .map(|r| {
            r["collectives"]
                .as_object()
                .expect("collectives by kind")
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v["calls"].as_u64().unwrap(),
                        v["bytes"].as_u64().unwrap(),
                    )
                })
                .collect()
        })
        .collect()
}

/// The rank rows of `headroom --threads 1 plan … --json`.
pub fn plan_report(args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = vec!["--threads", "1", "plan", "--json"];
    all.extend_from_slice(args);
    let res = headroom(&all);
    assert_ok(&res);
    let plan: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
    plan["ranks"].as_array().unwrap().clone()
}

/// The same triples from a `generate --json` report's `ranks`.
pub fn generate_ranks(report: &serde_json::Value) -> Vec<(u64, u64, u64)> {
    let rows = report["ranks"]
        .as_array()
        .expect("a sharded report has ranks");
    let keys = [
        "allocated_peak_bytes",
        "reserved_peak_bytes",
        "post_session_reserved_bytes",
    ];
    triples(rows, keys)
}

/// `bench session` on a mesh: each rank's row, its collectives per chunk beside the
/// plan's prediction of them.
pub fn bench_session_ranks(
    cmd: &mut std::process::Command,
    out: &std::path::Path,
) -> Vec<serde_json::Value> {
    let res = cmd
        .args(["--threads", "1", "bench", "session", "--model", "tiny"])
        .args([
            "--width", "64", "--height", "32", "--frames", "21", "--tp", "2", "--sp", "2",
        ])
        .args(["--allocator", "planned", "--policies", "before-decode"])
        .args([
            "--reps",
            "1",
            "--warmup",
            "0",
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_ok(&res);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let ranks = summary["policies"][0]["ranks"].as_array().unwrap().clone();
    assert_eq!(ranks.len(), 4);
    for r in &ranks {
        let moved = r["collective_bytes_per_chunk"].as_f64().unwrap();
        assert!(moved > 0.0, "{r}");
        assert_eq!(
            moved,
            r["planned_collective_bytes_per_chunk"].as_f64().unwrap(),
            "{r}"
        );
        assert!(r["reserved_peak_bytes"].as_u64() >= r["allocated_peak_bytes"].as_u64());
    }
    ranks
}
