//! Every CUDA kernel module compiles with NVRTC for sm_80 and sm_90 (no GPU needed) with
//! no register spills, no local stack frame and static shared memory within the limit.
//! Skips, saying why, when NVRTC is not installed (see `HEADROOM_CUDA_LIB_DIR`), unless
//! `HEADROOM_REQUIRE_NVRTC=1` (CI installs NVRTC and sets it, so it never skips there).

use headroom_tensor::cuda::compile::{compile_module, STATIC_SHARED_LIMIT_BYTES};
use headroom_tensor::cuda::{CudaError, DiskCache, Nvrtc, Op, MODULES};

fn nvrtc() -> Option<&'static Nvrtc> {
    match Nvrtc::get() {
        Ok(n) => Some(n),
        Err(e @ CudaError::NvrtcNotFound { .. }) => {
            headroom_mem::required::missing(
                "nvrtc",
                &e.to_string(),
                "pip install nvidia-cuda-nvrtc==13.0.88, then HEADROOM_CUDA_LIB_DIR",
            );
            None
        }
        Err(e) => panic!("NVRTC present but unusable: {e}"),
    }
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90_without_spills() {
    let Some(nvrtc) = nvrtc() else { return };
    for arch in ["sm_80", "sm_90"] {
        let mut ops = Vec::new();
        for module in MODULES {
            let compiled =
                compile_module(nvrtc, module, arch, None).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                !compiled.cubin.is_empty(),
                "{} {arch}: empty cubin",
                module.name
            );
            for k in &compiled.kernels {
                assert_eq!(k.spill_bytes, 0, "{arch} {}: spills", k.name);
                assert_eq!(k.stack_bytes, 0, "{arch} {}: local stack frame", k.name);
                assert!(
                    k.shared_bytes <= STATIC_SHARED_LIMIT_BYTES,
                    "{arch} {}: {} B shared",
                    k.name,
                    k.shared_bytes
                );
                assert!(k.registers > 0 && k.registers <= 255, "{arch} {}", k.name);
                ops.push(k.op);
            }
        }
        for op in Op::ALL {
            assert!(
                ops.contains(&op.name()),
                "{arch}: no kernel for {}",
                op.name()
            );
        }
    }
}

#[test]
fn a_second_compile_is_read_from_the_disk_cache() {
    let Some(nvrtc) = nvrtc() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = DiskCache::new(dir.path());
    let noise = headroom_tensor::cuda::modules::module("noise").expect("noise module");
    let first = compile_module(nvrtc, noise, "sm_90", Some(&cache)).expect("compile");
    assert!(!first.cached && first.cache_error.is_none());
    let second = compile_module(nvrtc, noise, "sm_90", Some(&cache)).expect("cached");
    assert!(second.cached);
    assert_eq!(first.cubin, second.cubin);
    assert_eq!(first.kernels, second.kernels);
    // Another arch is another key.
    let other = compile_module(nvrtc, noise, "sm_80", Some(&cache)).expect("compile");
    assert!(!other.cached);
}

#[test]
fn a_source_error_is_reported_with_the_nvrtc_log() {
    let Some(nvrtc) = nvrtc() else { return };
    let err = nvrtc
        .compile(
            "broken",
            "sm_90",
            "extern \"C\" __global__ void k() { nope; }",
            &[],
            &["--gpu-architecture=sm_90".into()],
        )
        .expect_err("does not compile");
    let text = err.to_string();
    assert!(text.contains("broken") && text.contains("nope"), "{text}");
}
