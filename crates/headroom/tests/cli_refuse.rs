//! Bad input is refused up front: exit 2, one line naming the field, the rule and the
//! value, before any chunk runs, with no file left behind; help texts list every value
//! their flag accepts.

mod common;
use common::headroom;

use std::path::Path;

/// `generate` on tiny at 48×32, 9 frames, into `dir/v.y4m`, with `extra` (which may
/// replace any of those flags).
fn generate(dir: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let out = dir.join("v.y4m");
    let res = headroom(&common::tiny_generate(out.to_str().unwrap(), extra));
    (
        res.status.code(),
        String::from_utf8_lossy(&res.stderr).into_owned(),
    )
}

/// Asserts a clean refusal: exit 2, one error line holding every `expected` text, no
/// repeated phrase or run of spaces, no chunk run, nothing written.
fn assert_refused(dir: &Path, extra: &[&str], expected: &[&str]) {
    let before: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
    let (code, stderr) = generate(dir, extra);
    assert_eq!(code, Some(2), "{extra:?}: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{extra:?}: {stderr}");
    let line = errors[0];
    for text in expected {
        assert!(line.contains(text), "{extra:?}: {line}");
    }
    assert!(!line.contains("  "), "a run of spaces: {line}");
    assert!(
        !line.contains("TokenGrid") && !line.contains("{ "),
        "{line}"
    );
    let words: Vec<&str> = line.split(": ").collect();
    for (i, w) in words.iter().enumerate() {
        assert!(!words[i + 1..].contains(w), "repeats {w:?}: {line}");
    }
    assert!(
        !stderr.contains("chunk 1/"),
        "{extra:?} ran a chunk: {stderr}"
    );
    let after: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
    assert_eq!(before.len(), after.len(), "{extra:?} left a file behind");
}

#[test]
fn a_model_that_is_not_there_or_not_whole_is_named_for_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert_refused(
        d,
        &["--model", "nonesuch"],
        &["unknown model", "world", "tiny"],
    );
    assert_refused(d, &["--model", "./no/such/model"], &["no such folder"]);
    let half = d.join("half");
    std::fs::create_dir_all(half.join("transformer")).unwrap();
    assert_refused(
        d,
        &["--model", half.to_str().unwrap()],
        &["vae/ is missing"],
    );
    std::fs::create_dir_all(half.join("vae")).unwrap();
    assert_refused(
        d,
        &["--model", half.to_str().unwrap()],
        &["transformer/config.json is missing"],
    );
    let empty = d.join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert_refused(
        d,
        &["--model", empty.to_str().unwrap()],
        &["not a model folder"],
    );
}

#[test]
fn sizes_and_lengths_that_cannot_work_are_refused_before_the_weights_load() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert_refused(
        d,
        &["--width", "48", "--height", "100000"],
        &["width/height", "48x100000", "at most 16384"],
    );
    // A file needs an end; sessions without one run under `serve`.
    assert_refused(
        d,
        &["--frames", "until-stop"],
        &["--frames until-stop", "needs an end", "headroom serve"],
    );
    assert_refused(d, &["--frames", "lots"], &["frame count", "until-stop"]);
    assert_refused(d, &["--frames", "10"], &["num_frames", "12·K − 3"]);
    assert_refused(
        d,
        &["--kv-budget", "0"],
        &["--kv-budget", "at least one page"],
    );
    assert_refused(d, &["--kv-budget", "0.25B"], &["--kv-budget", "whole"]);
    assert_refused(d, &["--kv-budget", "1.5"], &["--kv-budget", "(0, 1]"]);
}

#[test]
fn a_kv_budget_fraction_is_a_share_of_the_capacity_and_says_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stderr) = generate(dir.path(), &["--kv-budget", "0.25", "--capacity", "64MiB"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("16.0 MiB of KV pages"), "{stderr}");
}

#[test]
fn a_backend_that_cannot_run_where_the_ranks_are_is_refused_before_the_weights_load() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // NCCL needs GPUs; host ranks run on threads or MPI.
    assert_refused(
        d,
        &["--tp", "2", "--comm", "nccl"],
        &["--comm nccl runs on GPUs", "--device cuda"],
    );
    // GPU ranks run their collectives on NCCL, never on host threads.
    assert_refused(
        d,
        &["--device", "cuda-check", "--tp", "2", "--comm", "threads"],
        &["--comm threads on a GPU", "--comm nccl"],
    );
    assert_refused(
        d,
        &["--device", "cuda-check", "--tp", "2", "--comm", "mpi"],
        &["--comm mpi on a GPU"],
    );
    if !cfg!(all(feature = "cuda", feature = "mpi")) {
        // The default on a GPU is NCCL, which this build does not carry.
        assert_refused(
            d,
            &["--device", "cuda-check", "--tp", "2"],
            &["--features cuda,mpi"],
        );
    }
}

#[test]
fn threads_past_the_cores_are_capped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.y4m");
    let mut args = vec![
        "--threads",
        "100000",
        "generate",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(&common::TINY_SESSION);
    let res = headroom(&args);
    common::assert_ok(&res);
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(stderr.contains("warning: --threads 100000"), "{stderr}");
}

fn jpeg_bytes() -> Vec<u8> {
    let img = image::RgbImage::from_fn(48, 32, |x, y| image::Rgb([x as u8 * 5, y as u8 * 7, 90]));
    let mut bytes = Vec::new();
    img.write_to(
        &mut std::io::Cursor::new(&mut bytes),
        image::ImageFormat::Jpeg,
    )
    .unwrap();
    bytes
}

#[test]
fn images_are_read_by_their_content_and_a_cut_short_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bytes = jpeg_bytes();
    // A JPEG named .png is a JPEG: read by its content.
    let named_png = d.join("photo.png");
    std::fs::write(&named_png, &bytes).unwrap();
    let (code, stderr) = generate(d, &["--image", named_png.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    std::fs::remove_file(d.join("v.y4m")).unwrap();
    let truncated = d.join("cut.jpg");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    assert_refused(
        d,
        &["--image", truncated.to_str().unwrap()],
        &["--image", "truncated"],
    );
    let not_image = d.join("not.png");
    std::fs::write(&not_image, b"not an image at all").unwrap();
    assert_refused(
        d,
        &["--image", not_image.to_str().unwrap()],
        &["--image", "not a PNG or JPEG"],
    );
}

#[test]
fn every_value_a_flag_accepts_is_in_its_help() {
    let help = |cmd: &str| {
        let res = headroom(&[cmd, "--help"]);
        common::assert_ok(&res);
        String::from_utf8_lossy(&res.stdout).into_owned()
    };
    let generate = help("generate");
    for value in [
        "cuda-check",
        "fit[:slack=F]",
        "threads",
        "mpi",
        "nccl",
        "planned",
        "pytorch",
    ] {
        assert!(generate.contains(value), "generate --help lacks {value}");
    }
    let serve = help("serve");
    for value in ["fit[:slack=F]", "before-decode", "bounded"] {
        assert!(serve.contains(value), "serve --help lacks {value}");
    }
}

#[test]
fn a_plan_that_does_not_fit_reports_what_it_needs_instead_of_failing() {
    // What `headroom plan` with no arguments does for the 14B on one 64 GiB card, on a
    // model a debug build plans in seconds.
    let small = [
        "plan", "--model", "small", "--width", "416", "--height", "240", "--frames", "21",
    ];
    let run = |extra: &[&str]| {
        let mut args = small.to_vec();
        args.extend_from_slice(extra);
        let res = headroom(&args);
        common::assert_ok(&res);
        String::from_utf8_lossy(&res.stdout).into_owned()
    };
    let table = run(&["--capacity", "200MiB"]);
    assert!(table.contains("DOES NOT FIT"), "{table}");
    assert!(table.contains("--tp/--sp"), "{table}");
    let fits = |capacity: &str| {
        let v: serde_json::Value =
            serde_json::from_str(&run(&["--capacity", capacity, "--json"])).unwrap();
        v["fits"].clone()
    };
    assert_eq!(fits("200MiB"), false);
    assert_eq!(fits("2GiB"), true);
}
