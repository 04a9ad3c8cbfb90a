//! `headroom generate` leaves nothing behind: a run stopped by SIGINT or SIGTERM, or
//! one whose output cannot be written, ends cleanly and removes every file it created.

mod common;
use common::headroom;

use std::path::Path;
use std::process::{Command, Stdio};

/// Names in `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Frames of a session long enough that a signal always lands mid-run (100 chunks).
const LONG: &str = "1197";

/// Starts a long `generate` on tiny writing `out`, latents and a trace into `dir`, waits
/// until its first partial output exists (an event, not a delay), then sends `signal`.
fn stop_mid_run(dir: &Path, out: &str, signal: i32) -> std::process::ExitStatus {
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .current_dir(dir)
        .args(common::tiny_generate(
            out,
            &[
                "--frames",
                LONG,
                "--dump-latents",
                "l.npy",
                "--trace",
                "t.pickle",
            ],
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while entries(dir).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "it ended before writing"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: kill(2) on our own child's pid, which has not been waited for yet.
    unsafe {
        libc::kill(child.id() as i32, signal);
    }
    let res = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(stderr.contains("stopped by SIG"), "{stderr}");
    assert!(stderr.contains("chunks"), "{stderr}");
    res.status
}

#[test]
fn a_signal_mid_run_exits_130_or_143_and_leaves_no_output_of_any_kind() {
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        for out in ["v.mp4", "v.y4m", "frames"] {
            let dir = tempfile::tempdir().unwrap();
            let status = stop_mid_run(dir.path(), out, signal);
            assert_eq!(status.code(), Some(code), "{out}");
            assert_eq!(entries(dir.path()), Vec::<String>::new(), "{out}");
        }
    }
}

#[test]
fn a_signal_never_touches_frames_already_in_an_existing_folder() {
    let dir = tempfile::tempdir().unwrap();
    let frames = dir.path().join("frames");
    std::fs::create_dir(&frames).unwrap();
    std::fs::write(frames.join("mine.txt"), b"kept").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .current_dir(dir.path())
        .args(common::tiny_generate("frames", &["--frames", LONG]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    while entries(dir.path()).len() < 2 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "it ended before writing"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: kill(2) on our own child's pid, which has not been waited for yet.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    assert_eq!(child.wait().unwrap().code(), Some(143));
    assert_eq!(entries(dir.path()), ["frames"]);
    assert_eq!(entries(&frames), ["mine.txt"]);
}

#[test]
fn every_output_path_is_checked_before_any_work_and_a_failed_run_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let missing = format!("{d}/no/such/folder");
    let cases: [(&[&str], &str); 5] = [
        (&["--out", &format!("{missing}/v.mp4")], "--out"),
        (
            &["--dump-latents", &format!("{missing}/l.npy")],
            "--dump-latents",
        ),
        (&["--trace", &format!("{missing}/t.pickle")], "--trace"),
        (&["--trace", d], "is a folder"),
        (
            &["--width", "4096", "--height", "4096"],
            "OpenH264 encodes at most",
        ),
    ];
    for (extra, expected) in cases {
        let out = format!("{d}/v.mp4");
        let mut args = vec!["generate", "--model", "tiny", "--frames", "9"];
        if !extra.contains(&"--out") {
            args.extend(["--out", &out]);
        }
        if !extra.contains(&"--width") {
            args.extend(["--width", "48", "--height", "32"]);
        }
        args.extend_from_slice(extra);
        let res = headroom(&args);
        let stderr = String::from_utf8_lossy(&res.stderr);
        assert_eq!(res.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
        // Refused before the weights load: no chunk ran.
        assert!(!stderr.contains("chunk 1/"), "{extra:?}: {stderr}");
        assert_eq!(entries(dir.path()), Vec::<String>::new(), "{extra:?}");
    }
}

#[test]
fn a_finished_run_renames_every_output_into_place_and_leaves_no_partial_name() {
    let dir = tempfile::tempdir().unwrap();
    let res = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .current_dir(dir.path())
        .arg("generate")
        .args(common::TINY_SESSION)
        .args([
            "--out",
            "v.y4m",
            "--dump-latents",
            "l.npy",
            "--trace",
            "t.pickle",
        ])
        .output()
        .unwrap();
    common::assert_ok(&res);
    assert_eq!(entries(dir.path()), ["l.npy", "t.pickle", "v.y4m"]);
}
