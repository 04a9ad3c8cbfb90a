//! Every tensor op on a GPU device goes through the launch path, and each launch is one
//! the compiled kernels take: run here against the checked launcher (no GPU), which holds
//! argument sizes to the sm_90 cubins' parameter tables (when NVRTC is installed; CI sets
//! `HEADROOM_REQUIRE_NVRTC=1`), pointers to live blocks and inputs to bytes written before.

use std::sync::Arc;

use headroom_mem::{AllocatorConfig, CachingPlatform, ReclaimPolicy};
use headroom_tensor::cuda::check::{CheckReport, CheckedLauncher, ParamSource};
use headroom_tensor::cuda::launch::{Access, Arg, Launch, Launcher};
use headroom_tensor::kernels::activation::Activation;
use headroom_tensor::kernels::resample::PadMode;
use headroom_tensor::kernels::rope::RopeTable;
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::ops::conv::Conv3dOptions;
use headroom_tensor::{DType, Device, Tensor};

fn gpu() -> (Device, Arc<CheckedLauncher>) {
    let platform = CachingPlatform::sim(64 << 30, AllocatorConfig::default(), ReclaimPolicy::Never)
        .expect("sim platform");
    let checker = Arc::new(CheckedLauncher::new().expect("checked launcher"));
    let device = Device::with_launcher(Arc::new(platform), checker.clone());
    (device, checker)
}

fn seeded(shape: &[usize], seed: u64, dtype: DType, device: &Device) -> Tensor {
    Tensor::randn(shape, seed, 0, dtype, device).expect("randn")
}

/// Runs `f` on the GPU device and on the host and checks the results have one shape and
/// dtype.
fn same_shape(gpu: &Device, f: impl Fn(&Device) -> Tensor) {
    let cpu = Device::cpu().expect("cpu");
    let (g, c) = (f(gpu), f(&cpu));
    assert_eq!(g.shape(), c.shape());
    assert_eq!(g.dtype(), c.dtype());
    assert_eq!(g.to_f32_vec().expect("download").len(), c.numel());
}

#[test]
fn every_op_runs_on_the_launch_path_with_the_host_ops_shapes() {
    let (device, checker) = gpu();
    for dtype in [DType::F32, DType::BF16] {
        let x = |d: &Device| seeded(&[2, 6, 4, 64], 1, dtype, d);
        same_shape(&device, |d| {
            x(d).add(&seeded(&[1, 6, 1, 64], 2, dtype, d)).unwrap()
        });
        same_shape(&device, |d| x(d).mul(&x(d)).unwrap());
        same_shape(&device, |d| {
            x(d).transpose(1, 2)
                .unwrap()
                .sub(&x(d).transpose(1, 2).unwrap())
                .unwrap()
        });
        same_shape(&device, |d| {
            x(d).div(&x(d).add_scalar(3.0).unwrap()).unwrap()
        });
        same_shape(&device, |d| {
            x(d).mul_scalar(0.5).unwrap().affine(2.0, 1.0).unwrap()
        });
        for f in [
            Tensor::exp,
            Tensor::sin,
            Tensor::cos,
            Tensor::sqrt,
            Tensor::rsqrt,
            Tensor::silu,
            Tensor::gelu_tanh,
            Tensor::gelu_erf,
        ] {
            same_shape(&device, |d| f(&x(d)).unwrap());
        }
        same_shape(&device, |d| x(d).clamp(-1.0, 1.0).unwrap());
        let w = |d: &Device| seeded(&[64], 3, DType::F32, d);
        same_shape(&device, |d| {
            x(d).layer_norm(Some(&w(d)), Some(&w(d)), 1e-6).unwrap()
        });
        same_shape(&device, |d| x(d).rms_norm(Some(&w(d)), 1e-6).unwrap());
        same_shape(&device, |d| {
            x(d).rms_norm_channels(&seeded(&[6], 4, dtype, d)).unwrap()
        });
        let mod_ = |d: &Device| seeded(&[2, 1, 1, 64], 5, dtype, d);
        same_shape(&device, |d| {
            x(d).layer_norm_modulate(&mod_(d), &mod_(d), 1e-6).unwrap()
        });
        same_shape(&device, |d| x(d).add_mul(&mod_(d), &x(d)).unwrap());
        same_shape(&device, |d| x(d).softmax().unwrap());
        same_shape(&device, |d| x(d).sum(3, false).unwrap());
        same_shape(&device, |d| x(d).mean(1, true).unwrap());
        same_shape(&device, |d| x(d).max(2, false).unwrap());
        same_shape(&device, |d| x(d).to_pixels().unwrap());
        same_shape(&device, |d| Tensor::cat(&[&x(d), &x(d)], 2).unwrap());
        same_shape(&device, |d| Tensor::stack(&[&x(d), &x(d)], 0).unwrap());
        same_shape(&device, |d| {
            x(d).pad(&[(0, 0), (1, 2), (0, 1), (3, 0)], PadMode::Zeros)
                .unwrap()
        });
        same_shape(&device, |d| {
            x(d).pad(&[(0, 0), (2, 0), (0, 0), (1, 1)], PadMode::Replicate)
                .unwrap()
        });
        same_shape(&device, |d| x(d).upsample_nearest2x().unwrap());
        same_shape(&device, |d| {
            x(d).pixel_unshuffle(2).unwrap().pixel_shuffle(2).unwrap()
        });
        // Linear and batched matmul through the GEMM, attention, RoPE, convolutions.
        let wl = |d: &Device| seeded(&[96, 64], 6, dtype, d);
        same_shape(&device, |d| {
            x(d).linear(&wl(d), Some(&seeded(&[96], 7, DType::F32, d)))
                .unwrap()
        });
        same_shape(&device, |d| {
            let b = seeded(&[96], 7, DType::F32, d);
            x(d).linear_gelu_tanh(&wl(d), &b).unwrap()
        });
        same_shape(&device, |d| {
            x(d).matmul(&seeded(&[1, 64, 32], 8, dtype, d)).unwrap()
        });
        let q = |d: &Device| seeded(&[1, 40, 2, 64], 9, dtype, d);
        let kv = |d: &Device| seeded(&[1, 72, 2, 64], 10, dtype, d);
        let mask = Mask::BlockCausal {
            block_len: 16,
            q_start: 32,
        };
        same_shape(&device, |d| {
            Tensor::scaled_dot_product_attention(&q(d), &kv(d), &kv(d), mask, None).unwrap()
        });
        let table = RopeTable::new(64, 32, 10_000.0);
        let positions: Vec<[usize; 3]> = (0..40).map(|i| [i / 20, (i / 5) % 4, i % 5]).collect();
        same_shape(&device, |d| q(d).rope(&table, &positions).unwrap());
        let v = |d: &Device| seeded(&[1, 6, 3, 10, 12], 11, dtype, d);
        let cw = |d: &Device| seeded(&[8, 6, 3, 3, 3], 12, dtype, d);
        same_shape(&device, |d| {
            v(d).conv3d(
                &cw(d),
                Some(&seeded(&[8], 13, DType::F32, d)),
                Conv3dOptions::causal([1, 1, 1]),
            )
            .unwrap()
        });
        let im = |d: &Device| seeded(&[1, 6, 10, 12], 14, dtype, d);
        same_shape(&device, |d| {
            im(d)
                .conv2d(&seeded(&[8, 6, 3, 3], 15, dtype, d), None, [2, 2], [1, 1])
                .unwrap()
        });
        same_shape(&device, |d| {
            Tensor::zeros(&[3, 5], dtype, d)
                .unwrap()
                .add_scalar(1.0)
                .unwrap()
        });
        same_shape(&device, |d| {
            Tensor::full(&[3, 5], 2.5, dtype, d).unwrap().exp().unwrap()
        });
    }
    let report = checker.report();
    for kernel in [
        "add_f32",
        "add_contig_f32",
        "sub_f32",
        "f32_to_bf16",
        "bf16_to_f32",
        "copy_strided_b4",
        "copy_strided_b2",
        "layer_norm_f32",
        "rms_norm_f32",
        "rms_norm_channels_f32",
        "softmax_f32",
        "sum_rows_f32",
        "sum_axis_f32",
        "max_axis_f32",
        "randn_f32",
        "f32_to_pixels",
        "pad_f32",
        "upsample_nearest2x_f32",
        "pixel_shuffle_f32",
        "pixel_unshuffle_f32",
        "attention_f32",
        "attention_bf16_d64",
        "rope_f32",
        "conv3d_f32",
        "affine_f32",
        "clamp_f32",
        "gelu_erf_f32",
    ] {
        assert!(
            report.launches.contains_key(kernel),
            "{kernel} never launched: {report:?}"
        );
    }
    assert!(report.gemms >= 2 * (2 + 6), "{report:?}");
    match checker.source() {
        ParamSource::Cubins => {}
        ParamSource::NamesOnly(why) => eprintln!("argument sizes unchecked: {why}"),
    }
}

#[test]
fn an_input_nothing_wrote_is_refused() {
    let (device, _) = gpu();
    let never_written = Tensor::empty(&[4, 8], DType::F32, &device).unwrap();
    let err = never_written.exp().unwrap_err().to_string();
    assert!(err.contains("nothing wrote"), "{err}");
}

#[test]
fn launches_are_held_to_the_kernels_parameters_and_blocks() {
    let (device, checker) = gpu();
    let x = seeded(&[256], 1, DType::F32, &device);
    let out = Tensor::empty(&[256], DType::F32, &device).unwrap();
    let ptr = |t: &Tensor, bytes: u64, access| Arg::Ptr {
        addr: t.device_addr(),
        bytes,
        access,
    };
    let exp = |x_bytes: u64, n: Arg| {
        Launch::elements(
            "exp_f32",
            256,
            vec![
                ptr(&x, x_bytes, Access::Read),
                ptr(&out, 1024, Access::Write),
                n,
            ],
        )
    };
    checker.launch(&exp(1024, Arg::i64(256))).unwrap();
    let err = checker
        .launch(&exp(4096, Arg::i64(256)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("run past the block"), "{err}");
    let unknown = Launch {
        kernel: "no_such_kernel",
        ..exp(1024, Arg::i64(256))
    };
    assert!(checker.launch(&unknown).is_err());
    if *checker.source() == ParamSource::Cubins {
        let err = checker
            .launch(&exp(1024, Arg::i32(256)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("argument sizes [8, 8, 4]"), "{err}");
    }
}

#[test]
fn the_selftest_runs_every_case_through_checked_launches() {
    let (device, checker) = gpu();
    let report = headroom_tensor::ops::selftest::run_on(&device).unwrap();
    assert!(report.ops.len() >= 25, "{report:?}");
    assert!(report.device.contains("checked"), "{}", report.device);
    // Checked launches compute nothing: only the ops whose output is all zeros on the
    // host too could pass, and none is.
    assert!(report.ops.iter().all(|c| !c.passed), "{report:?}");
    let launched = checker.report();
    assert!(launched.gemms >= 5, "{launched:?}");
    assert!(
        launched.launches.contains_key("attention_bf16_d128"),
        "{launched:?}"
    );
}

#[test]
fn rope_uploads_its_tables_and_positions_once_per_device() {
    let (device, checker) = gpu();
    let table = RopeTable::new(64, 32, 10_000.0);
    let positions: Vec<[usize; 3]> = (0..40).map(|i| [i / 20, (i / 5) % 4, i % 5]).collect();
    let q = seeded(&[1, 40, 2, 64], 9, DType::F32, &device);
    let resident = || {
        device
            .platform()
            .memory_stats()
            .allocated_bytes
            .all()
            .current
    };
    let before = resident();
    let scope = table.device_scope();
    q.rope(&table, &positions).unwrap();
    let first = checker.report().uploaded_bytes;
    q.rope(&table, &positions).unwrap();
    assert_eq!(
        checker.report().uploaded_bytes,
        first,
        "the second call uploads nothing"
    );
    let moved: Vec<[usize; 3]> = positions.iter().map(|p| [p[0] + 1, p[1], p[2]]).collect();
    q.rope(&table, &moved).unwrap();
    let third = checker.report().uploaded_bytes;
    assert_eq!(
        third - first,
        (40 * 3 * 4) as u64,
        "new positions, the tables kept"
    );
    assert!(resident() > before, "kept while the scope is open");
    drop(scope);
    assert_eq!(resident(), before, "freed when it closes");
    // Outside a scope every call uploads again, and keeps nothing.
    q.rope(&table, &positions).unwrap();
    q.rope(&table, &positions).unwrap();
    assert!(checker.report().uploaded_bytes - third >= 2 * (40 * 3 * 4) as u64);
    assert_eq!(resident(), before);
}

/// What one 8-bit product launched: one GEMM and one scale epilogue, and how many
/// `quantizer` launches (per-row quantization) and `widen` launches (the weight widened to
/// bf16) it took.
fn eight_bit_product(seen: &CheckReport, quantizer: &str, widen: &str) -> (u64, u64) {
    assert_eq!(seen.gemms, 1, "{seen:?}");
    assert_eq!(
        seen.launches.get("scale_bias_act_f32"),
        Some(&1),
        "{seen:?}"
    );
    let count = |f: &dyn Fn(&str) -> bool| -> u64 {
        seen.launches
            .iter()
            .filter(|(k, _)| f(k))
            .map(|(_, n)| n)
            .sum()
    };
    (count(&|k| k.starts_with(quantizer)), count(&|k| k == widen))
}

#[test]
fn fp8_linears_run_on_fp8_gemms_when_aligned_and_widen_the_weight_otherwise() {
    let cpu = Device::cpu().unwrap();
    for (k, tensor_cores) in [(64, true), (40, false)] {
        for (format, input, widen) in [
            (DType::F8E4M3, DType::BF16, "e4m3_to_bf16"),
            (DType::F8E5M2, DType::F32, "e5m2_to_bf16"),
        ] {
            let (device, checker) = gpu();
            let codes = seeded(&[48, k], 2, DType::F32, &cpu)
                .to_dtype(format)
                .unwrap()
                .to_device(&device)
                .unwrap();
            let scale = seeded(&[48], 3, DType::F32, &device).exp().unwrap();
            let bias = seeded(&[48], 4, DType::F32, &device);
            let x = seeded(&[2, 5, k], 1, input, &device);
            let y = x
                .linear_fp8_then(&codes, &scale, Some(&bias), Some(Activation::GeluTanh))
                .unwrap();
            assert_eq!((y.shape(), y.dtype()), (&[2, 5, 48][..], DType::F32));
            assert_eq!(y.to_f32_vec().unwrap().len(), 480);
            let seen = checker.report();
            let (quantized, widened) = eight_bit_product(&seen, "quantize_rows_e4m3", widen);
            let tc = u64::from(tensor_cores);
            assert_eq!((quantized, widened), (tc, 1 - tc), "k {k}: {seen:?}");
        }
    }
}

#[test]
fn int8_linears_run_on_int8_gemms_when_aligned_and_widen_the_weight_otherwise() {
    for (k, gemm_on_codes) in [(64, true), (40, false)] {
        for (input, out) in [(DType::BF16, DType::BF16), (DType::F32, DType::F32)] {
            let (device, checker) = gpu();
            let w = seeded(&[48, k], 2, DType::F32, &device)
                .quantize_linear_int8()
                .unwrap();
            assert_eq!(w.nbytes(), 48 * k + 48 * 4);
            let bias = seeded(&[48], 4, DType::F32, &device);
            let x = seeded(&[2, 5, k], 1, input, &device);
            let y = x
                .linear_int8_as(&w, Some(&bias), Some(Activation::GeluTanh), out)
                .unwrap();
            assert_eq!((y.shape(), y.dtype()), (&[2, 5, 48][..], out));
            assert_eq!(y.to_f32_vec().unwrap().len(), 480);
            let seen = checker.report();
            // The weight's rows at load, and the input's where codes multiply codes.
            let (quantized, widened) = eight_bit_product(&seen, "quantize_rows_i8", "i8_to_bf16");
            let on_codes = u64::from(gemm_on_codes);
            assert_eq!(
                (quantized, widened),
                (1 + on_codes, 1 - on_codes),
                "k {k}: {seen:?}"
            );
        }
    }
}

/// The checked launcher, except that cuBLASLt finds no algorithm for an 8-bit GEMM (a
/// shape or GPU its 8-bit kernels do not take).
#[derive(Debug)]
struct NoEightBitAlgorithm(Arc<CheckedLauncher>);

impl Launcher for NoEightBitAlgorithm {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn launch(&self, launch: &Launch) -> headroom_tensor::cuda::Result<()> {
        self.0.launch(launch)
    }
    fn gemm(
        &self,
        shape: &headroom_tensor::cuda::launch::GemmShape,
        operands: &headroom_tensor::cuda::launch::GemmOperands,
    ) -> headroom_tensor::cuda::Result<()> {
        use headroom_tensor::cuda::launch::GemmInput;
        if matches!(shape.input, GemmInput::Fp8(_) | GemmInput::I8) {
            return Err(headroom_tensor::cuda::CudaError::Driver {
                call: headroom_tensor::cuda::launch::NO_ALGORITHM,
                reason: "CUBLAS_STATUS_NOT_SUPPORTED".into(),
            });
        }
        self.0.gemm(shape, operands)
    }
    fn fp8_gemm(&self) -> bool {
        true
    }
    fn upload(&self, dst: u64, src: &[u8]) -> headroom_tensor::cuda::Result<()> {
        self.0.upload(dst, src)
    }
    fn download(&self, src: u64, dst: &mut [u8]) -> headroom_tensor::cuda::Result<()> {
        self.0.download(src, dst)
    }
    fn zero(&self, dst: u64, bytes: u64) -> headroom_tensor::cuda::Result<()> {
        self.0.zero(dst, bytes)
    }
    fn allocated(&self, addr: u64, bytes: u64) {
        self.0.allocated(addr, bytes)
    }
    fn released(&self, addr: u64) {
        self.0.released(addr)
    }
    fn synchronize(&self) -> headroom_tensor::cuda::Result<()> {
        self.0.synchronize()
    }
}

#[test]
fn an_8bit_gemm_cublaslt_has_no_algorithm_for_widens_the_weight_instead() {
    let platform = CachingPlatform::sim(1 << 30, AllocatorConfig::default(), ReclaimPolicy::Never)
        .expect("sim platform");
    let checker = Arc::new(CheckedLauncher::new().expect("checked launcher"));
    let device = Device::with_launcher(
        Arc::new(platform),
        Arc::new(NoEightBitAlgorithm(checker.clone())),
    );
    let cpu = Device::cpu().unwrap();
    let codes = seeded(&[32, 64], 2, DType::F32, &cpu)
        .to_dtype(DType::F8E4M3)
        .unwrap()
        .to_device(&device)
        .unwrap();
    let scale = seeded(&[32], 3, DType::F32, &device).exp().unwrap();
    let x = seeded(&[7, 64], 1, DType::BF16, &device);
    let y = x.linear_fp8(&codes, &scale, None).unwrap();
    assert_eq!(y.to_f32_vec().unwrap().len(), 7 * 32);
    let seen = checker.report();
    assert_eq!(
        seen.gemms, 1,
        "only the bf16 GEMM reached the checker: {seen:?}"
    );
    assert_eq!(seen.launches.get("e4m3_to_bf16"), Some(&1), "{seen:?}");
}
