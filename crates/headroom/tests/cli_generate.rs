//! `headroom generate` through the real binary, on the tiny built-in model.

use std::process::Command;

fn headroom(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .output()
        .expect("the headroom binary runs")
}

#[test]
fn generate_writes_every_frame_and_reports_its_memory_story() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.y4m");
    let res = headroom(&[
        "generate",
        "--model",
        "tiny",
        "--width",
        "48",
        "--height",
        "32",
        "--frames",
        "21",
        "--policy",
        "before-decode",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
    assert_eq!(report["frames"], 21);
    for key in [
        "ttfc_s",
        "chunk_mean_s",
        "allocated_peak_bytes",
        "reserved_peak_bytes",
        "post_session_reserved_bytes",
        "reclaims",
        "reclaim_s",
        "output",
        "width",
        "height",
    ] {
        assert!(report.get(key).is_some(), "missing {key}");
    }
    assert_eq!(
        report["reclaims"], 2,
        "one reclaim before each chunk's decode"
    );
    let bytes = std::fs::read(&out).unwrap();
    let frames = bytes.windows(6).filter(|w| w == b"FRAME\n").count();
    assert_eq!(frames, 21);
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(stderr.contains("chunk 2/2"), "{stderr}");
}

#[test]
fn generate_is_byte_identical_across_reclaim_policies_and_allocators() {
    let dir = tempfile::tempdir().unwrap();
    let mut outputs = Vec::new();
    for (policy, allocator) in [("never", "pytorch"), ("always", "expandable")] {
        let out = dir.path().join(format!("{policy}.y4m"));
        let res = headroom(&[
            "generate",
            "--model",
            "tiny",
            "--width",
            "48",
            "--height",
            "32",
            "--frames",
            "9",
            "--policy",
            policy,
            "--allocator",
            allocator,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(
            res.status.success(),
            "{}",
            String::from_utf8_lossy(&res.stderr)
        );
        outputs.push(std::fs::read(&out).unwrap());
    }
    assert_eq!(outputs[0], outputs[1]);
}

#[test]
fn generate_refuses_bad_requests_with_the_field() {
    let res = headroom(&[
        "generate",
        "--model",
        "tiny",
        "--frames",
        "10",
        "--out",
        "/tmp/never.y4m",
    ]);
    assert!(!res.status.success());
    assert!(String::from_utf8_lossy(&res.stderr).contains("num_frames"));
    let res = headroom(&["generate", "--model", "tiny", "--out", "/tmp/x.mp4"]);
    assert!(String::from_utf8_lossy(&res.stderr).contains(".y4m"));
}
