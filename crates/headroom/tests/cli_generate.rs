//! `headroom generate` through the real binary, on the tiny built-in model.

mod common;
use common::headroom;

/// `headroom generate` on the tiny model at 48×32 with `frames` frames into `out`.
fn generate_tiny(frames: &str, out: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let out = out.to_str().expect("temp paths are UTF-8");
    let mut args = vec![
        "generate", "--model", "tiny", "--width", "48", "--height", "32", "--frames", frames,
        "--out", out,
    ];
    args.extend_from_slice(extra);
    headroom(&args)
}

#[test]
fn generate_writes_every_frame_and_reports_its_memory_story() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.y4m");
    let res = generate_tiny("21", &out, &["--policy", "before-decode", "--json"]);
    common::assert_ok(&res);
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
    for (policy, allocator) in [
        ("never", "pytorch"),
        ("before-decode", "pytorch"),
        ("always", "expandable"),
        ("never", "planned"),
    ] {
        let out = dir.path().join(format!("{policy}.mp4"));
        let res = generate_tiny("9", &out, &["--policy", policy, "--allocator", allocator]);
        common::assert_ok(&res);
        outputs.push(std::fs::read(&out).unwrap());
    }
    assert_eq!(outputs[0], outputs[1]);
    assert_eq!(outputs[0], outputs[2]);
    assert_eq!(outputs[0], outputs[3]);
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
    let res = headroom(&["generate", "--model", "tiny", "--out", "/tmp/x.avi"]);
    assert!(String::from_utf8_lossy(&res.stderr).contains(".mp4 or .y4m"));
}

#[test]
fn bad_arguments_are_one_line_errors_with_exit_code_2_and_leave_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.y4m");
    let out_s = out.to_str().unwrap();
    let not_image = dir.path().join("not.png");
    std::fs::write(&not_image, b"not an image").unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["--frames", "10"], "num_frames"),
        (&["--width", "50"], "width/height"),
        (&["--image", not_image.to_str().unwrap()], "--image"),
        (&["--model", "/nonexistent/model"], "model"),
        (&["--policy", "sometimes"], "reclaim policy"),
        (&["--actions", "wq"], "unknown key"),
    ];
    for (extra, expected) in cases {
        // Defaults for every option the case does not set itself.
        let res = headroom(&common::tiny_generate(out_s, extra));
        assert_eq!(res.status.code(), Some(2), "{extra:?}");
        let stderr = String::from_utf8_lossy(&res.stderr);
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
        assert_eq!(
            stderr
                .trim()
                .lines()
                .filter(|l| l.starts_with("error"))
                .count(),
            1,
            "{stderr}"
        );
        assert!(!out.exists(), "{extra:?} left {out:?} behind");
    }
}

#[test]
fn an_image_conditions_the_video_and_a_trace_pickle_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("first.png");
    let rgb: Vec<u8> = (0..20 * 30 * 3).map(|i| (i % 251) as u8).collect();
    image::save_buffer(&png, &rgb, 30, 20, image::ExtendedColorType::Rgb8).unwrap();
    let run = |extra: &[&str], name: &str| {
        let out = dir.path().join(name);
        let res = generate_tiny("9", &out, extra);
        common::assert_ok(&res);
        std::fs::read(out).unwrap()
    };
    let trace = dir.path().join("trace.pickle");
    let with_image = run(
        &[
            "--image",
            png.to_str().unwrap(),
            "--trace",
            trace.to_str().unwrap(),
        ],
        "a.y4m",
    );
    let without = run(&[], "b.y4m");
    assert_ne!(with_image, without);
    let pickle = std::fs::read(&trace).unwrap();
    let snapshot = headroom_mem::pickle::from_pickle(&pickle).unwrap();
    let events = snapshot
        .get("device_traces")
        .and_then(|t| t.as_list())
        .unwrap()[0]
        .as_list()
        .unwrap()
        .len();
    assert!(events > 100, "{events} trace events");
}

#[test]
fn an_upper_case_extension_names_the_same_kind_of_video() {
    let dir = tempfile::tempdir().unwrap();
    let mp4 = dir.path().join("UP.MP4");
    common::assert_ok(&generate_tiny("9", &mp4, &[]));
    assert_eq!(&std::fs::read(&mp4).unwrap()[4..8], b"ftyp", "an MP4");
    let y4m = dir.path().join("UP.Y4m");
    common::assert_ok(&generate_tiny("9", &y4m, &[]));
    assert!(
        std::fs::read(&y4m).unwrap().starts_with(b"YUV4MPEG2"),
        "a Y4M"
    );
}

#[test]
fn generate_writes_an_h264_mp4_with_the_requested_frames_and_size() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.mp4");
    let res = generate_tiny("21", &out, &[]);
    common::assert_ok(&res);
    let file = std::fs::File::open(&out).unwrap();
    let size = file.metadata().unwrap().len();
    let reader = mp4::Mp4Reader::read_header(std::io::BufReader::new(file), size).unwrap();
    let track = reader.tracks().values().next().unwrap();
    assert_eq!((track.width(), track.height()), (48, 32));
    assert_eq!(track.sample_count(), 21);
    assert_eq!(track.media_type().unwrap(), mp4::MediaType::H264);
}

#[test]
fn bench_session_writes_samples_and_a_summary_with_matching_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench");
    let res = headroom(&[
        "bench",
        "session",
        "--model",
        "tiny",
        "--width",
        "48",
        "--height",
        "32",
        "--frames",
        "9",
        "--sessions",
        "2",
        "--warmup",
        "1",
        "--reps",
        "2",
        "--sample-ms",
        "5",
        "--policies",
        "never,fit",
        "--allocator",
        "pytorch,planned",
        "--out",
        out.to_str().unwrap(),
    ]);
    common::assert_ok(&res);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["hashes_match"], true);
    assert_eq!(
        (summary["sessions"].as_u64(), summary["reps"].as_u64()),
        (Some(2), Some(2))
    );
    let policies = summary["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 4);
    let allocators: Vec<&str> = policies
        .iter()
        .map(|p| p["allocator"].as_str().unwrap())
        .collect();
    assert_eq!(allocators, ["pytorch", "pytorch", "planned", "planned"]);
    for p in policies {
        let live = p["allocated_after_session_bytes"].as_array().unwrap();
        assert_eq!(live.len(), 2);
        for key in [
            "policy",
            "allocated_peak_bytes",
            "reserved_peak_bytes",
            "sampled_peak_bytes",
            "e2e_s",
            "ttfc_s",
            "chunk_p50_s",
            "chunk_p95_s",
            "reclaims",
            "reclaim_s",
            "reclaim_share",
        ] {
            assert!(p.get(key).is_some(), "missing {key}");
        }
        let after = p["reserved_after_session_bytes"].as_array().unwrap();
        assert_eq!(after.len(), 2);
        assert_eq!(
            after[0], after[1],
            "residency does not compound across sessions"
        );
        assert_eq!(p["output_sha256"].as_array().unwrap().len(), 2);
        assert!(
            p["allocated_peak_bytes"].as_f64().unwrap()
                <= p["reserved_peak_bytes"].as_f64().unwrap()
        );
    }
    let csv = std::fs::read_to_string(out.join("samples.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("t_ms,policy,rep,session,chunk,phase,allocated_bytes,reserved_bytes,device_used_bytes,rss_bytes,last_phase"));
    assert!(lines.all(|l| l.split(',').count() == 11));
    let png = std::fs::read(out.join("memory.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    assert!(std::fs::read_to_string(out.join("summary.md"))
        .unwrap()
        .contains("Output hashes match"));
}

#[test]
fn a_capacity_emulates_a_small_device_and_running_out_is_a_clean_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.mp4");
    let res = generate_tiny("9", &out, &["--capacity", "1MiB"]);
    assert_eq!(res.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&res.stderr).contains("out of memory"));
    assert!(!out.exists());
    let res = generate_tiny("9", &out, &["--capacity", "256MiB", "--json"]);
    common::assert_ok(&res);
}

#[test]
fn the_planned_allocator_runs_at_its_peak_and_refuses_what_its_plan_says_will_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.y4m");
    let planned = ["--allocator", "planned", "--policy", "never", "--json"];
    let res = generate_tiny("21", &out, &planned);
    common::assert_ok(&res);
    let report: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
    let allocated = report["allocated_peak_bytes"].as_f64().unwrap();
    let reserved = report["reserved_peak_bytes"].as_f64().unwrap();
    assert!(
        reserved <= allocated * 1.05,
        "{reserved} reserved for {allocated}"
    );
    // 1.06 × the allocated peak is enough.
    let roomy = format!("{}B", (allocated * 1.06) as u64);
    let res = generate_tiny(
        "21",
        &out,
        &[&planned[..], &["--capacity", &roomy]].concat(),
    );
    common::assert_ok(&res);
    // Below the planned peak the session is refused before its first chunk.
    std::fs::remove_file(&out).unwrap();
    let tight = format!("{}B", (allocated * 0.8) as u64);
    let res = generate_tiny(
        "21",
        &out,
        &[&planned[..], &["--capacity", &tight]].concat(),
    );
    assert_eq!(res.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(
        stderr.contains("planned peak") && stderr.contains("capacity"),
        "{stderr}"
    );
    assert!(!stderr.contains("chunk 1/"), "{stderr}");
    assert!(!out.exists());
}

#[test]
fn plain_generate_runs_the_embedded_world_model_at_its_size_from_its_first_frame() {
    let cache = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("frames");
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args(["generate", "--frames", "9", "--json", "--out"])
            .arg(&out)
            .env("HEADROOM_CACHE", cache.path())
            .output()
            .unwrap()
    };
    let res = run();
    common::assert_ok(&res);
    let report: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
    assert_eq!(
        (report["width"].as_u64(), report["height"].as_u64()),
        (Some(128), Some(96))
    );
    let first = image::open(out.join("frame_00000.png")).unwrap().to_rgb8();
    assert_eq!(first.dimensions(), (128, 96));
    // The model's own first frame conditions the video: frame 0 comes back close to it,
    // in its own colours (this model's VAE gives 30.2 dB; the first `world` gave ~20).
    let own = image::open(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/world/first_frame.png"),
    )
    .unwrap()
    .to_rgb8();
    let mse = first
        .as_raw()
        .iter()
        .zip(own.as_raw())
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum::<f64>()
        / own.as_raw().len() as f64;
    let psnr = 10.0 * (255.0f64 * 255.0 / mse).log10();
    assert!(
        psnr > 28.0,
        "frame 0 is {psnr:.1} dB from the model's first frame"
    );
    // The extracted folder is reused, not rewritten, by the next run.
    let folders: Vec<_> = std::fs::read_dir(cache.path()).unwrap().collect();
    assert_eq!(folders.len(), 1);
    common::assert_ok(&run());
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 1);
}
