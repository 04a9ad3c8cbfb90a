//! `headroom plan` through the real binary: the JSON schema, the plot and snapshots, and
//! clear errors for layouts the model cannot take.

mod common;
use common::headroom;

const TINY: [&str; 12] = [
    "plan",
    "--model",
    "tiny",
    "--height",
    "32",
    "--width",
    "64",
    "--frames",
    "21",
    "--capacity",
    "1GiB",
    "--dtype=f32",
];

#[test]
fn plan_prints_one_row_per_rank_and_policy_with_every_field() {
    let dir = tempfile::tempdir().unwrap();
    let (plot, trace) = (dir.path().join("plan.png"), dir.path().join("traces"));
    let mut args = TINY.to_vec();
    args.extend_from_slice(&[
        "--tp",
        "2",
        "--sp",
        "2",
        "--policies",
        "never,fit",
        "--json",
        "--plot",
        plot.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    let res = headroom(&args);
    common::assert_ok(&res);
    let json: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
    let ranks = json["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 8, "4 ranks × 2 policies");
    for r in ranks {
        for key in [
            "rank",
            "policy",
            "weights_bytes",
            "kv_bytes",
            "decoder_state_bytes",
            "conditioning_bytes",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "post_session_reserved_bytes",
            "headroom_bytes",
            "peak_phase",
        ] {
            assert!(r.get(key).is_some(), "missing {key}");
        }
        assert_eq!(
            r["headroom_bytes"].as_i64().unwrap(),
            (1i64 << 30) - r["peak_reserved_bytes"].as_i64().unwrap()
        );
    }
    assert_eq!(&std::fs::read(&plot).unwrap()[1..4], b"PNG");
    let pickles = std::fs::read_dir(&trace).unwrap().count();
    assert_eq!(pickles, 8);
}

#[test]
fn plan_prints_a_table_and_refuses_layouts_the_model_cannot_take() {
    let res = headroom(&TINY);
    common::assert_ok(&res);
    let out = String::from_utf8_lossy(&res.stdout);
    assert!(out.contains("| rank | policy | weights GB"), "{out}");
    assert!(out.contains("- before-decode: per-card peak"), "{out}");
    let mut args = TINY.to_vec();
    args.extend_from_slice(&["--tp", "3"]);
    let res = headroom(&args);
    assert_eq!(res.status.code(), Some(2));
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(err.contains("heads must divide by tp·sp"), "{err}");
}

#[test]
fn plan_and_generate_with_the_same_flags_and_no_allocator_agree_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    for (model, width, height, frames) in [("tiny", "48", "32", "21"), ("small", "64", "48", "9")] {
        let shape = [
            "--model", model, "--width", width, "--height", height, "--frames", frames,
        ];
        let mut plan_args = shape.to_vec();
        plan_args.extend(["--policies", "before-decode"]);
        let rows = common::plan_report(&plan_args);
        let out = dir.path().join(format!("{model}.y4m"));
        let mut gen_args = vec![
            "--threads",
            "1",
            "generate",
            "--json",
            "--out",
            out.to_str().unwrap(),
        ];
        gen_args.extend_from_slice(&shape);
        let res = headroom(&gen_args);
        common::assert_ok(&res);
        let report: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
        let plan = &rows[0];
        for (planned, measured) in [
            ("peak_allocated_bytes", "allocated_peak_bytes"),
            ("peak_reserved_bytes", "reserved_peak_bytes"),
            ("post_session_reserved_bytes", "post_session_reserved_bytes"),
        ] {
            assert_eq!(plan[planned], report[measured], "{model}: {planned}");
        }
    }
}

#[test]
fn plan_and_generate_given_only_a_model_describe_and_measure_the_same_session() {
    // Neither command is told a size or a frame count: both take the model's own size
    // and the same frames, and the plan's figures for generate's reclaim policy are the
    // run's (one kernel thread for both: scratch sizes follow the thread count).
    let res = headroom(&["--threads", "1", "plan", "--model", "world"]);
    common::assert_ok(&res);
    let table = String::from_utf8_lossy(&res.stdout);
    let heading = table.lines().next().unwrap_or_default().to_string();
    let rows = common::plan_report(&["--model", "world"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("world.mp4");
    let res = headroom(&[
        "--threads",
        "1",
        "generate",
        "--model",
        "world",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    common::assert_ok(&res);
    let report: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
    let shape = format!(
        " at {}x{}, {} frames,",
        report["width"], report["height"], report["frames"]
    );
    assert!(
        heading.contains(&shape),
        "{heading:?} plans another session than{shape}"
    );
    let plan = rows
        .iter()
        .find(|r| r["policy"] == "before-decode")
        .expect("plan's default policies include generate's");
    for (planned, measured) in [
        ("peak_allocated_bytes", "allocated_peak_bytes"),
        ("peak_reserved_bytes", "reserved_peak_bytes"),
        ("post_session_reserved_bytes", "post_session_reserved_bytes"),
    ] {
        assert_eq!(plan[planned], report[measured], "{planned}");
    }
}
