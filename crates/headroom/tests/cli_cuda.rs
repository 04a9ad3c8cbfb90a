//! `headroom cuda kernels` and `headroom cuda selftest` through the real binary: the
//! compile report covers every op with no spills; a missing NVRTC or GPU is exit code 2
//! with the reason.

mod common;

use std::process::{Command, Output};

fn run(args: &[&str], env: &[(&str, &std::path::Path)], clear: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_headroom"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    for k in clear {
        cmd.env_remove(k);
    }
    cmd.output().expect("the headroom binary runs")
}

#[test]
fn kernels_json_reports_every_op_without_spills() {
    let cache = tempfile::tempdir().expect("temp dir");
    let out = run(
        &["cuda", "kernels", "--arch", "sm_90", "--json"],
        &[("HEADROOM_CUDA_CACHE", cache.path())],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(2) && stderr.contains("not found; looked in") {
        headroom_mem::required::missing(
            "nvrtc",
            &stderr,
            "pip install nvidia-cuda-nvrtc==13.0.88, then HEADROOM_CUDA_LIB_DIR",
        );
        return;
    }
    common::assert_ok(&out);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["arch"], "sm_90");
    assert!(report["nvrtc_version"]
        .as_str()
        .is_some_and(|v| v.starts_with("13.")));
    let kernels = report["kernels"].as_array().expect("kernels");
    let mut ops: Vec<&str> = kernels.iter().filter_map(|k| k["op"].as_str()).collect();
    ops.sort_unstable();
    ops.dedup();
    assert_eq!(
        ops,
        [
            "attention",
            "cast",
            "conv3d",
            "copy",
            "elementwise",
            "layer_norm",
            "noise",
            "quantize",
            "reduce",
            "resample",
            "rms_norm",
            "rope",
            "softmax"
        ]
    );
    for k in kernels {
        for field in [
            "module",
            "name",
            "op",
            "registers",
            "spill_bytes",
            "shared_bytes",
        ] {
            assert!(!k[field].is_null(), "{k} lacks {field}");
        }
        assert_eq!(k["spill_bytes"], 0, "{k}");
    }
}

#[test]
fn kernels_without_nvrtc_exit_2_and_say_where_they_looked() {
    let empty = tempfile::tempdir().expect("temp dir");
    let out = run(
        &["cuda", "kernels", "--arch", "sm_90", "--no-cache"],
        &[
            ("HEADROOM_CUDA_LIB_DIR", empty.path()),
            ("CUDA_HOME", empty.path()),
            ("HOME", empty.path()),
        ],
        &["VIRTUAL_ENV", "CONDA_PREFIX"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        // A system-wide NVRTC (/usr/local/cuda or the system Python) was found after
        // the empty folders: the fallback order worked.
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            !stdout.contains(&*empty.path().to_string_lossy()),
            "{stdout}"
        );
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("HEADROOM_CUDA_LIB_DIR"), "{stderr}");
    assert!(
        stderr.contains(&*empty.path().to_string_lossy()),
        "{stderr}"
    );
    assert!(stderr.contains("/usr/local/cuda/lib64"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn an_unknown_arch_is_exit_2_naming_the_choices() {
    let out = run(&["cuda", "kernels", "--arch", "sm_70"], &[], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("expected sm_80, sm_86, sm_89, sm_90 or sm_90a"),
        "{stderr}"
    );
}

#[test]
fn selftest_without_a_gpu_exits_2_with_the_reason() {
    let out = run(&["cuda", "selftest"], &[], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if cfg!(feature = "cuda") && out.status.success() {
        return; // a GPU machine: the self-test passed
    }
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    if cfg!(feature = "cuda") {
        assert!(
            stderr.contains("no CUDA device") || stderr.contains("NVRTC"),
            "{stderr}"
        );
    } else {
        assert!(
            stderr.contains("this build has no CUDA support (build with --features cuda)"),
            "{stderr}"
        );
    }
}
