//! `generate --snapshot-every`, `generate --resume` and `snapshot inspect` through the
//! real binary on the tiny built-in model.

mod common;
use common::{assert_ok, headroom};

/// The frames of a Y4M file (the planes after each `FRAME\n`, 4:4:4 or 4:2:0).
fn y4m_frames(path: &std::path::Path, width: usize, height: usize) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(path).unwrap();
    let header = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    let full = String::from_utf8_lossy(&bytes[..header]).contains("C444");
    let frame = if full {
        width * height * 3
    } else {
        width * height * 3 / 2
    };
    bytes[header..]
        .chunks(6 + frame)
        .map(|c| {
            assert_eq!(&c[..6], b"FRAME\n");
            c[6..].to_vec()
        })
        .collect()
}

#[test]
fn a_resumed_generate_writes_the_frames_of_the_uninterrupted_one_from_the_next_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole.y4m");
    let snaps = dir.path().join("snaps");
    let (w, s) = (whole.to_str().unwrap(), snaps.to_str().unwrap());
    let base = ["--model", "tiny", "--width", "48", "--height", "32"];
    let mut args = vec!["generate", "--frames", "45", "--out", w];
    args.extend(base);
    args.extend(["--snapshot-every", "2", "--snapshot-dir", s, "--overlap"]);
    assert_ok(&headroom(&args));
    // Every 2 chunks, not after the last: chunk-1 only (chunk-3 is the last).
    let mut names: Vec<_> = std::fs::read_dir(&snaps)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["chunk-1.hrsnap"]);
    let snap = snaps.join("chunk-1.hrsnap");
    let tail = dir.path().join("tail.y4m");
    let mut args = vec!["generate", "--resume", snap.to_str().unwrap()];
    args.extend(["--model", "tiny", "--out", tail.to_str().unwrap()]);
    assert_ok(&headroom(&args));
    let (all, rest) = (y4m_frames(&whole, 48, 32), y4m_frames(&tail, 48, 32));
    assert_eq!(all.len(), 45);
    assert_eq!(rest.len(), 24, "chunks 2 and 3");
    assert_eq!(rest, all[21..], "the frames from chunk 2 on, byte for byte");

    // Another dtype is refused by name, and writes nothing.
    let refused = dir.path().join("refused.y4m");
    let res = headroom(&[
        "generate",
        "--resume",
        snap.to_str().unwrap(),
        "--model",
        "tiny",
        "--dtype",
        "bf16",
        "--out",
        refused.to_str().unwrap(),
    ]);
    assert!(!res.status.success());
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(err.contains("dtype: snapshot f32, here bf16"), "{err}");
    assert!(!refused.exists());

    // inspect: parts, progress and the flags to resume with.
    let res = headroom(&["snapshot", "inspect", snap.to_str().unwrap(), "--json"]);
    assert_ok(&res);
    let report: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
    assert_eq!(report["progress"]["chunks_done"], 2);
    assert_eq!(report["identity"]["width"], 48);
    let parts: Vec<&str> = report["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for part in ["kv", "text", "condition", "decoder", "pending", "session"] {
        assert!(parts.contains(&part), "{parts:?}");
    }
    let sum: u64 = report["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, report["state_bytes"].as_u64().unwrap());
    assert!(report["resume_flags"]
        .as_str()
        .unwrap()
        .contains("--model tiny --dtype f32"));
    let text = headroom(&["snapshot", "inspect", snap.to_str().unwrap()]);
    assert_ok(&text);
    assert!(String::from_utf8_lossy(&text.stdout).contains("resumes on an engine with"));

    // A truncated file is refused by name.
    let cut = dir.path().join("cut.hrsnap");
    let bytes = std::fs::read(&snap).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let res = headroom(&["snapshot", "inspect", cut.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&res.stderr).contains("snapshot (truncated)"));
}

/// Runs `script` (sh) in a mount namespace of its own where `dir` is a 256 KiB tmpfs
/// (`unshare -rm`); where namespaces are not allowed, under `ulimit -f 256` (KiB)
/// instead, with SIGXFSZ ignored: either way a snapshot write runs out of room.
fn in_a_small_filesystem(dir: &std::path::Path, script: &str) -> std::process::Output {
    let d = dir.display();
    let tmpfs = format!("mount -t tmpfs -o size=256k tmpfs {d} && {script}");
    let out = std::process::Command::new("unshare")
        .args(["-rm", "sh", "-c", &tmpfs])
        .output();
    match out {
        Ok(o)
            if !String::from_utf8_lossy(&o.stderr).contains("unshare:")
                && !String::from_utf8_lossy(&o.stderr).contains("mount:") =>
        {
            o
        }
        _ => {
            eprintln!("no mount namespace here: a file size limit stands for the full disk");
            let limited = format!("trap '' XFSZ; ulimit -f 512; {script}");
            std::process::Command::new("bash")
                .args(["-c", &limited])
                .output()
                .unwrap()
        }
    }
}

#[test]
fn a_full_disk_during_a_snapshot_fails_by_name_and_leaves_no_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let snaps = dir.path().join("snaps");
    std::fs::create_dir_all(&snaps).unwrap();
    let out = dir.path().join("v.y4m");
    let bin = env!("CARGO_BIN_EXE_headroom");
    let script = format!(
        "{bin} generate --model tiny --width 48 --height 32 --frames 33 --out {} --snapshot-every 1 --snapshot-dir {}; echo rc=$?; ls -A {}",
        out.display(),
        snaps.display(),
        snaps.display()
    );
    let res = in_a_small_filesystem(&snaps, &script);
    let stdout = String::from_utf8_lossy(&res.stdout);
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(stdout.contains("rc=2"), "generate fails: {stdout} {stderr}");
    assert!(
        stderr.contains("snapshot after chunk 0") && stderr.contains("snapshot (io)"),
        "{stderr}"
    );
    let listed: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("rc="))
        .skip(1)
        .collect();
    assert!(
        listed.is_empty(),
        "no partial file in the snapshot folder: {listed:?}"
    );
    assert!(!out.exists(), "a failed run leaves no video either");
}

#[test]
fn a_thread_mesh_snapshots_a_shard_per_rank_and_resumes_from_them() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole.y4m");
    let snaps = dir.path().join("snaps");
    let mesh = ["--tp", "2", "--sp", "2", "--comm", "threads"];
    let base = ["--model", "tiny", "--width", "64", "--height", "32"];
    let mut args = vec![
        "generate",
        "--frames",
        "33",
        "--out",
        whole.to_str().unwrap(),
    ];
    args.extend(base);
    args.extend(mesh);
    args.extend([
        "--snapshot-every",
        "1",
        "--snapshot-dir",
        snaps.to_str().unwrap(),
    ]);
    assert_ok(&headroom(&args));
    for name in [
        "chunk-0.hrsnap",
        "chunk-0.rank-1.hrsnap",
        "chunk-0.rank-3.hrsnap",
    ] {
        assert!(snaps.join(name).is_file(), "{name}");
    }
    let snap = snaps.join("chunk-0.hrsnap");
    let tail = dir.path().join("tail.y4m");
    let mut args = vec!["generate", "--resume", snap.to_str().unwrap()];
    args.extend(["--model", "tiny", "--out", tail.to_str().unwrap()]);
    args.extend(mesh);
    assert_ok(&headroom(&args));
    let (all, rest) = (y4m_frames(&whole, 64, 32), y4m_frames(&tail, 64, 32));
    assert_eq!(rest, all[9..], "chunks 1 and 2 of the mesh, byte for byte");
    // Another mesh shape is refused by name.
    let other = dir.path().join("other.y4m");
    let mut args = vec!["generate", "--resume", snap.to_str().unwrap()];
    args.extend(["--model", "tiny", "--out", other.to_str().unwrap()]);
    args.extend(["--tp", "2", "--comm", "threads"]);
    let res = headroom(&args);
    assert!(!res.status.success());
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(
        err.contains("mesh: snapshot tp 2 sp 2 rank 0, here tp 2 sp 1 rank 0"),
        "{err}"
    );
}
