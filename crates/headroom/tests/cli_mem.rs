//! `headroom mem replay` and `headroom bench alloc` through the real binary.

mod common;
use common::headroom;

use std::path::PathBuf;

fn repo_file(path: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.join(path).display().to_string()
}

fn replay_json(args: &[&str]) -> serde_json::Value {
    let out = headroom(args);
    common::assert_ok(&out);
    serde_json::from_slice(&out.stdout).expect("--json prints one JSON object")
}

const MIB: i64 = 1 << 20;

#[test]
fn the_devlog_example_reserves_256mib_under_pytorch_and_140mib_under_expandable() {
    let trace = repo_file("examples/traces/devlog.jsonl");
    let pytorch = replay_json(&["mem", "replay", &trace, "--allocator", "pytorch", "--json"]);
    let expandable = replay_json(&[
        "mem",
        "replay",
        &trace,
        "--allocator",
        "expandable",
        "--json",
    ]);
    assert_eq!(pytorch["reserved_bytes.all.peak"], 256 * MIB);
    assert_eq!(expandable["reserved_bytes.all.peak"], 140 * MIB);
    // Planned: the trace is recorded, planned and replayed at the bound.
    let planned = replay_json(&["mem", "replay", &trace, "--allocator", "planned", "--json"]);
    assert_eq!(planned["reserved_bytes.all.peak"], 128 * MIB);
    assert_eq!(planned["reserved_over_allocated_peak"], 1.0);
    assert_eq!(planned["planned_misses"], 0);
    for report in [&pytorch, &expandable, &planned] {
        assert_eq!(report["allocated_bytes.all.peak"], 128 * MIB);
        assert_eq!(report["allocated_bytes.all.current"], 128 * MIB);
        for key in [
            "reserved_bytes.all.current",
            "num_alloc_retries",
            "num_ooms",
            "num_device_alloc",
            "num_device_free",
        ] {
            assert!(report.get(key).is_some(), "missing {key}");
        }
    }
}

#[test]
fn a_pytorch_snapshot_pickle_replays_like_its_json_lines_twin() {
    let pickle = repo_file("crates/mem/tests/fixtures/torch_snapshot_small.pickle");
    let report = replay_json(&[
        "mem",
        "replay",
        &pickle,
        "--allocator",
        "expandable",
        "--json",
    ]);
    assert_eq!(report["reserved_bytes.all.peak"], 140 * MIB);
}

#[test]
fn a_small_capacity_makes_allocations_fail_and_replay_continue() {
    let trace = repo_file("examples/traces/devlog.jsonl");
    let report = replay_json(&["mem", "replay", &trace, "--capacity", "200MiB", "--json"]);
    // 8 × 16 MiB fit; the 32 MiB requests find only 72 MiB free, flush the cache and fit.
    assert_eq!(report["num_ooms"], 0);
    assert_eq!(report["num_alloc_retries"], 1);
    let tight = replay_json(&["mem", "replay", &trace, "--capacity", "100MiB", "--json"]);
    // 6 × 16 MiB fit, 2 fail; then 3 × 32 MiB fit after a flush and the 4th fails.
    assert_eq!(tight["failed_allocs"], 3);
    assert_eq!(tight["num_ooms"], 3);
    assert_eq!(tight["ignored_frees"], 2);
}

#[test]
fn the_human_table_and_the_snapshot_file_are_written() {
    let trace = repo_file("examples/traces/devlog.jsonl");
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("snap.pickle");
    let out = headroom(&[
        "mem",
        "replay",
        &trace,
        "--max-split-size",
        "128MiB",
        "--policy",
        "before-decode",
        "--snapshot",
        snapshot.to_str().unwrap(),
    ]);
    common::assert_ok(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("reserved") && text.contains("256.0 MiB"),
        "{text}"
    );
    let bytes = std::fs::read(&snapshot).unwrap();
    assert_eq!(&bytes[..2], b"\x80\x02");
    let json_path = dir.path().join("snap.json");
    let out = headroom(&[
        "mem",
        "replay",
        &trace,
        "--snapshot",
        json_path.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    assert_eq!(json["segments"].as_array().unwrap().len(), 12);
}

#[test]
fn bad_input_is_an_error_that_names_the_field_and_the_rule() {
    let trace = repo_file("examples/traces/devlog.jsonl");
    let cases: [(&[&str], &str); 5] = [
        (
            &["mem", "replay", &trace, "--capacity", "12XB"],
            "unknown unit",
        ),
        (
            &["mem", "replay", &trace, "--allocator", "slab"],
            "pytorch, expandable or planned",
        ),
        (
            &["mem", "replay", &trace, "--policy", "sometimes"],
            "reclaim policy",
        ),
        (
            &["mem", "replay", &trace, "--max-split-size", "8MiB"],
            "max_split_size",
        ),
        (
            &["mem", "replay", "/nonexistent/trace.jsonl"],
            "cannot read trace",
        ),
    ];
    for (args, expected) in cases {
        let out = headroom(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"op\":\"alloc\",\"id\":1,\"size\":5}\n{\"op\":\"free\",\"id\":2}\n",
    )
    .unwrap();
    let out = headroom(&["mem", "replay", bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("trace line 2"), "{stderr}");
}

#[test]
fn bench_alloc_prints_both_allocators_and_their_ratio() {
    let out = headroom(&[
        "bench",
        "alloc",
        "--sizes",
        "512B,2MiB",
        "--pairs",
        "200",
        "--rounds",
        "3",
        "--json",
    ]);
    common::assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert!(row["headroom_ns"].as_f64().unwrap() > 0.0);
        assert!(row["system_ns"].as_f64().unwrap() > 0.0);
        assert!(row["speedup"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn bench_kernels_prints_every_kernel_per_path_and_compute() {
    let out = headroom(&[
        "bench", "kernels", "--shrink", "10", "--reps", "1", "--json",
    ]);
    common::assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kernels = json["kernels"].as_array().unwrap();
    // Each (path, compute) group holds the kernels in order; the packed-weight linear
    // rows only where weights are packed (bf16 on AMX).
    let mut groups: Vec<Vec<&serde_json::Value>> = Vec::new();
    for k in kernels {
        match groups.last_mut() {
            Some(g) if g[0]["path"] == k["path"] && g[0]["compute"] == k["compute"] => g.push(k),
            _ => groups.push(vec![k]),
        }
    }
    assert!(!groups.is_empty(), "no rows");
    for group in groups {
        let prefixes: Vec<&str> = group
            .iter()
            .map(|k| k["name"].as_str().unwrap().split(' ').next().unwrap())
            .collect();
        let packed = (group[0]["path"] == "amx" || group[0]["path"] == "avx512bf16")
            && group[0]["compute"] == "bf16";
        let want: &[&str] = if group[0]["compute"] == "int8" {
            // The W8A8 linears: attention's and both FFN products'.
            &["linear", "linear", "linear"]
        } else if packed {
            &[
                "matmul",
                "matmul",
                "linear",
                "linear",
                "attention",
                "conv3d",
                "conv2d",
            ]
        } else {
            &["matmul", "matmul", "attention", "conv3d", "conv2d"]
        };
        assert_eq!(
            prefixes, want,
            "{} / {}",
            group[0]["path"], group[0]["compute"]
        );
    }
    let computes: Vec<&str> = kernels
        .iter()
        .map(|k| k["compute"].as_str().unwrap())
        .collect();
    assert!(
        computes.contains(&"f32") && computes.contains(&"bf16"),
        "{computes:?}"
    );
    // int8 rows where the CPU has VNNI (and the bench's AVX-512 paths run).
    let f = headroom_tensor::kernels::cpu::features();
    assert_eq!(
        computes.contains(&"int8"),
        f.avx512 && f.avx512_vnni,
        "{computes:?}"
    );
    for k in kernels {
        for key in ["gflops", "reference_gflops", "ratio"] {
            assert!(k[key].as_f64().unwrap() > 0.0, "{key} in {k}");
        }
        assert!(k["scratch_peak_bytes"].as_u64().is_some());
        if let Some(f) = k["fraction_of_peak"].as_f64() {
            assert!(f > 0.0 && k["peak_gflops"].as_f64().unwrap() > 0.0, "{k}");
        }
        if k["compute"] == "int8" {
            assert!(
                k["peak_gflops"].as_f64().is_some(),
                "int8 rows have vpdpbusd's peak: {k}"
            );
        }
    }
}

#[test]
fn bench_models_refuses_an_unknown_mode_naming_it() {
    let out = headroom(&["bench", "models", "--modes", "fp8"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("modes") && err.contains("fp8"), "{err}");
}
