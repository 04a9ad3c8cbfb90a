//! `--device cpu|cuda[:N]|cuda-check` through the real binary: every way `cuda` cannot be
//! used is a clear error with exit code 2, never a panic and never a silent run on the
//! CPU; `cuda-check` runs `generate` through the GPU path with every launch checked.

use std::process::Command;

fn headroom(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .output()
        .expect("the headroom binary runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Why `cuda` cannot run the engine in this build on this machine.
fn assert_cuda_refused(args: &[&str]) {
    let (code, stderr) = headroom(args);
    assert_eq!(code, Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    if cfg!(feature = "cuda") {
        assert!(
            stderr.contains("no CUDA device: ") || stderr.contains("runs on the host only"),
            "{stderr}"
        );
    } else {
        assert!(
            stderr.contains("this build has no CUDA support (build with --features cuda)"),
            "{stderr}"
        );
    }
}

#[test]
fn generate_and_bench_session_refuse_cuda_with_the_reason() {
    assert_cuda_refused(&["generate", "--device", "cuda", "--model", "tiny"]);
    assert_cuda_refused(&["bench", "session", "--device", "cuda:0", "--model", "tiny"]);
}

#[test]
fn plan_on_cuda_needs_the_feature_and_a_device() {
    let args = [
        "plan", "--device", "cuda", "--model", "tiny", "--chunks", "1",
    ];
    if cfg!(feature = "cuda") {
        let (code, stderr) = headroom(&args);
        // With a GPU the plan runs on the card's capacity; without one it is NoDevice.
        assert!(
            code == Some(0) || (code == Some(2) && stderr.contains("no CUDA device: ")),
            "{code:?}: {stderr}"
        );
    } else {
        assert_cuda_refused(&args);
    }
}

#[test]
fn an_unknown_device_is_a_usage_error() {
    let (code, stderr) = headroom(&["plan", "--device", "gpu"]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("must be cpu, cuda, cuda:N or cuda-check"),
        "{stderr}"
    );
}

#[test]
fn generate_on_cuda_check_runs_every_op_through_checked_launches() {
    for dtype in ["f32", "bf16"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("check.mp4");
        let output = Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args([
                "generate",
                "--device",
                "cuda-check",
                "--model",
                "tiny",
                "--frames",
                "9",
            ])
            .args(["--dtype", dtype, "--json", "--out"])
            .arg(&out)
            .output()
            .expect("the headroom binary runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        let report: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("one JSON report");
        let checked = &report["checked_launches"];
        let launches = checked["launches"].as_object().expect("launch counts");
        for kernel in [
            "conv3d_f32",
            "layer_norm_f32",
            "rope_f32",
            "randn_f32",
            "f32_to_pixels",
        ] {
            assert!(
                launches.contains_key(kernel),
                "{dtype}: {kernel} never launched: {checked}"
            );
        }
        assert!(checked["gemms"].as_u64() > Some(10), "{checked}");
        assert!(out.exists(), "the video is written");
    }
}

#[test]
fn the_tiny_decoder_on_cuda_check_runs_its_ops_through_checked_launches() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("tiny.mp4");
    let output = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(["generate", "--device", "cuda-check", "--model", "tiny"])
        .args(["--frames", "21", "--width", "48", "--height", "32"])
        .args(["--decoder", "tiny", "--json", "--out"])
        .arg(&out)
        .output()
        .expect("the headroom binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("one JSON report");
    let launches = report["checked_launches"]["launches"]
        .as_object()
        .expect("launch counts");
    // The memory blocks' 3×3 convs, the latents' tanh clamp, the ReLUs (clamp) and the
    // output's pixels.
    for kernel in ["conv3d_f32", "tanh_f32", "clamp_f32", "f32_to_pixels"] {
        assert!(
            launches.contains_key(kernel),
            "{kernel} never launched: {launches:?}"
        );
    }
    assert!(out.exists(), "the video is written");
}

#[test]
fn eight_bit_weights_on_cuda_check_run_the_dit_linears_on_8bit_gemms() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("8bit.mp4");
    let run = |weights: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args(["generate", "--device", "cuda-check", "--model", "tiny"])
            .args([
                "--frames", "9", "--width", "48", "--height", "32", "--dtype", "bf16",
            ])
            .args(["--weights", weights, "--json", "--out"])
            .arg(&out)
            .output()
            .expect("the headroom binary runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{weights}: {stderr}");
        serde_json::from_slice::<serde_json::Value>(&output.stdout).expect("one JSON report")
    };
    let native = run("native");
    let weights = |r: &serde_json::Value| r["weights_bytes"].as_u64().expect("weights_bytes");
    for (format, quantizer) in [("fp8", "quantize_rows_e4m3"), ("int8", "quantize_rows_i8")] {
        let report = run(format);
        let launches = report["checked_launches"]["launches"]
            .as_object()
            .expect("launch counts");
        // Each DiT linear's weight is quantized once on the device, and every product
        // quantizes its input per row and scales its sums after the GEMM.
        let count = |k: &str| launches.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        let quantized = count(&format!("{quantizer}_bf16")) + count(&format!("{quantizer}_f32"));
        let products = count("scale_bias_act_f32");
        assert!(
            products > 0 && quantized > products,
            "{format}: {launches:?}"
        );
        assert!(weights(&report) < weights(&native), "{report} vs {native}");
    }
}

#[test]
fn bench_kernels_on_cuda_check_runs_every_row_through_the_gpu_path() {
    let output = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args([
            "bench",
            "kernels",
            "--device",
            "cuda-check",
            "--shrink",
            "16",
            "--reps",
            "1",
        ])
        .arg("--json")
        .output()
        .expect("the headroom binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let rows = report["kernels"].as_array().expect("rows");
    // Five kernels in f32 and bf16, then three linears each with fp8 and int8 weights.
    assert_eq!(rows.len(), 16, "{report}");
    assert!(rows.iter().all(|r| r["path"] == "cuda"), "{report}");
    let computes: Vec<&str> = rows.iter().filter_map(|r| r["compute"].as_str()).collect();
    assert_eq!(
        computes.iter().filter(|&&c| c == "fp8").count(),
        3,
        "{report}"
    );
    assert_eq!(
        computes.iter().filter(|&&c| c == "int8").count(),
        3,
        "{report}"
    );
}
