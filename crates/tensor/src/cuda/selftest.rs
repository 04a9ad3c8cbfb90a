//! `headroom cuda selftest`: every op family on seeded inputs, on the GPU through the
//! compiled kernels and on the CPU through the tensor runtime, compared element by element
//! (feature `cuda`). Noise, casts, copies and resampling must match exactly; float math
//! within a tolerance per op.

use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
use headroom_mem::{AllocatorConfig, CachingPlatform, Platform, ReclaimPolicy};

use super::backend::{grid_for, rows_grid, CudaKernels, DeviceView};
use super::error::{CudaError, Result};
use super::gemm::{CublasLt, Epilogue, GemmInput, GemmOperands, GemmShape, Workspace};
use crate::kernels::rope::RopeTable;
use crate::ops::attention::Mask;
use crate::ops::conv::Conv3dOptions;
use crate::{DType, Device, Tensor};

/// One op's comparison.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpCheck {
    /// The op family.
    pub op: &'static str,
    /// The kernel that ran.
    pub kernel: &'static str,
    /// Largest |gpu − cpu| over the output.
    pub max_error: f64,
    /// The largest difference allowed.
    pub tolerance: f64,
    /// `max_error <= tolerance`.
    pub passed: bool,
}

/// The whole self-test.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SelftestReport {
    /// The device's name.
    pub device: String,
    /// The arch the kernels were compiled for.
    pub arch: &'static str,
    /// One entry per op check.
    pub ops: Vec<OpCheck>,
}

fn tensor_error(e: crate::TensorError) -> CudaError {
    CudaError::Driver {
        call: "cpu reference",
        reason: e.to_string(),
    }
}

fn check(op: &'static str, kernel: &'static str, gpu: &[f32], cpu: &[f32], tol: f64) -> OpCheck {
    let mut max_error: f64 = if gpu.len() == cpu.len() {
        0.0
    } else {
        f64::INFINITY
    };
    for (&g, &c) in gpu.iter().zip(cpu) {
        let d = if g.to_bits() == c.to_bits() {
            0.0
        } else {
            (f64::from(g) - f64::from(c)).abs()
        };
        max_error = max_error.max(if d.is_nan() { f64::INFINITY } else { d });
    }
    OpCheck {
        op,
        kernel,
        max_error,
        tolerance: tol,
        passed: max_error <= tol,
    }
}

/// Seeded values, scaled.
fn seeded(shape: &[usize], seed: u64, scale: f32, cpu: &Device) -> Result<(Tensor, Vec<f32>)> {
    let t = Tensor::randn(shape, seed, 0, DType::F32, cpu)
        .and_then(|t| t.mul_scalar(scale))
        .map_err(tensor_error)?;
    let v = t.to_f32_vec().map_err(tensor_error)?;
    Ok((t, v))
}

fn host(t: &Tensor) -> Result<Vec<f32>> {
    t.to_f32_vec().map_err(tensor_error)
}

macro_rules! launch {
    ($k:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let f = $k.function($name)?;
        // SAFETY: the arguments match the kernel's parameter list in its `.cu` source
        // (pointers to buffers of the sizes the kernel indexes, then scalars by value),
        // and every temporary lives until the launch has copied the arguments.
        unsafe { $k.stream().launch_builder(f)$(.arg($arg))+.launch($cfg) }
            .map_err(super::backend::driver("cuLaunchKernel"))?;
    }};
}

/// Runs every check on GPU `ordinal`.
pub fn run(ordinal: usize) -> Result<SelftestReport> {
    let k = CudaKernels::new(ordinal)?;
    let cpu = Device::cpu().map_err(tensor_error)?;
    let mut ops = Vec::new();

    // noise: bit-exact with the CPU generator.
    {
        let n = 1usize << 20;
        let out = k.zeros::<f32>(n)?;
        launch!(
            k,
            "randn_f32",
            grid_for(n),
            &out,
            &(n as i64),
            &42u64,
            &1000u64
        );
        let cpu_t = Tensor::randn(&[n], 42, 1000, DType::F32, &cpu).map_err(tensor_error)?;
        ops.push(check(
            "noise",
            "randn_f32",
            &k.download(&out)?,
            &host(&cpu_t)?,
            0.0,
        ));
    }
    // elementwise: broadcast add [64, 1, 96] + [1, 32, 96], gelu_tanh.
    {
        let (a, av) = seeded(&[64, 1, 96], 1, 1.0, &cpu)?;
        let (b, bv) = seeded(&[1, 32, 96], 2, 1.0, &cpu)?;
        let shape = [64usize, 32, 96];
        let n = shape.iter().product::<usize>();
        let va = DeviceView::new(&shape, &[96, 0, 1])?;
        let vb = DeviceView::new(&shape, &[0, 96, 1])?;
        let (da, db, out) = (k.upload(&av)?, k.upload(&bv)?, k.zeros::<f32>(n)?);
        launch!(
            k,
            "add_f32",
            grid_for(n),
            &da,
            &db,
            &out,
            &(n as i64),
            &va,
            &vb
        );
        let want = a.add(&b).map_err(tensor_error)?;
        ops.push(check(
            "elementwise",
            "add_f32",
            &k.download(&out)?,
            &host(&want)?,
            1e-6,
        ));
        let g = k.zeros::<f32>(av.len())?;
        launch!(
            k,
            "gelu_tanh_f32",
            grid_for(av.len()),
            &da,
            &g,
            &(av.len() as i64)
        );
        let want = a.gelu_tanh().map_err(tensor_error)?;
        ops.push(check(
            "elementwise",
            "gelu_tanh_f32",
            &k.download(&g)?,
            &host(&want)?,
            1e-5,
        ));
    }
    // cast: f32 -> bf16 (bits), exact.
    {
        let (a, av) = seeded(&[4096], 3, 3.0, &cpu)?;
        let (da, out) = (k.upload(&av)?, k.zeros::<u16>(av.len())?);
        launch!(
            k,
            "f32_to_bf16",
            grid_for(av.len()),
            &da,
            &out,
            &(av.len() as i64)
        );
        let gpu: Vec<f32> = k
            .download(&out)?
            .iter()
            .map(|&b| f32::from_bits(u32::from(b) << 16))
            .collect();
        let want = a.to_dtype(DType::BF16).map_err(tensor_error)?;
        ops.push(check("cast", "f32_to_bf16", &gpu, &host(&want)?, 0.0));
    }
    // softmax, layer norm, rms norm over the last axis of [256, 1536].
    {
        let (rows, n) = (256usize, 1536usize);
        let (x, xv) = seeded(&[rows, n], 4, 2.0, &cpu)?;
        let (w, wv) = seeded(&[n], 5, 1.0, &cpu)?;
        let (bias, bv) = seeded(&[n], 6, 1.0, &cpu)?;
        let (dx, dw, db) = (k.upload(&xv)?, k.upload(&wv)?, k.upload(&bv)?);
        let out = k.zeros::<f32>(rows * n)?;
        launch!(
            k,
            "softmax_f32",
            rows_grid(rows),
            &dx,
            &out,
            &(rows as i64),
            &(n as i64)
        );
        let want = x.softmax().map_err(tensor_error)?;
        ops.push(check(
            "softmax",
            "softmax_f32",
            &k.download(&out)?,
            &host(&want)?,
            1e-6,
        ));
        launch!(
            k,
            "layer_norm_f32",
            rows_grid(rows),
            &dx,
            &dw,
            &db,
            &out,
            &(rows as i64),
            &(n as i64),
            &1e-6f32
        );
        let want = x
            .layer_norm(Some(&w), Some(&bias), 1e-6)
            .map_err(tensor_error)?;
        ops.push(check(
            "layer_norm",
            "layer_norm_f32",
            &k.download(&out)?,
            &host(&want)?,
            1e-5,
        ));
        launch!(
            k,
            "rms_norm_f32",
            rows_grid(rows),
            &dx,
            &dw,
            &out,
            &(rows as i64),
            &(n as i64),
            &1e-6f32
        );
        let want = x.rms_norm(Some(&w), 1e-6).map_err(tensor_error)?;
        ops.push(check(
            "rms_norm",
            "rms_norm_f32",
            &k.download(&out)?,
            &host(&want)?,
            1e-5,
        ));
    }
    // rms_norm_channels: the VAE form on [2, 96, 3, 8, 10].
    {
        let shape = [2usize, 96, 3, 8, 10];
        let inner = 3 * 8 * 10;
        let (x, xv) = seeded(&shape, 7, 1.0, &cpu)?;
        let (g, gv) = seeded(&[96], 8, 1.0, &cpu)?;
        let (dx, dg, out) = (k.upload(&xv)?, k.upload(&gv)?, k.zeros::<f32>(xv.len())?);
        let scale = (96f64).sqrt() as f32;
        launch!(
            k,
            "rms_norm_channels_f32",
            grid_for(2 * inner),
            &dx,
            &dg,
            &out,
            &2i64,
            &96i64,
            &(inner as i64),
            &scale
        );
        let want = x.rms_norm_channels(&g).map_err(tensor_error)?;
        ops.push(check(
            "rms_norm",
            "rms_norm_channels_f32",
            &k.download(&out)?,
            &host(&want)?,
            1e-5,
        ));
    }
    // rope on [1, L, 12, 128] at a 3 x 4 x 5 grid.
    {
        let (heads, d, maxp) = (12usize, 128usize, 16usize);
        let table = RopeTable::new(d, maxp, 10_000.0);
        let positions: Vec<[usize; 3]> = (0..3)
            .flat_map(|f| (0..4).flat_map(move |y| (0..5).map(move |x| [f, y, x])))
            .collect();
        let l = positions.len();
        let (x, xv) = seeded(&[1, l, heads, d], 9, 1.0, &cpu)?;
        let dims = table.axis_dims();
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for (axis, &dim) in dims.iter().enumerate() {
            for p in 0..maxp {
                for j in 0..dim / 2 {
                    let (c, s) = table.cos_sin(axis, p, j);
                    cos.push(c);
                    sin.push(s);
                }
            }
        }
        let pos: Vec<i32> = positions.iter().flat_map(|p| p.map(|v| v as i32)).collect();
        let (dx, dc, ds, dp) = (
            k.upload(&xv)?,
            k.upload(&cos)?,
            k.upload(&sin)?,
            k.upload(&pos)?,
        );
        let pairs = l * heads * d / 2;
        launch!(
            k,
            "rope_f32",
            grid_for(pairs),
            &dx,
            &dc,
            &ds,
            &dp,
            &(l as i64),
            &(heads as i64),
            &(d as i64),
            &(maxp as i64),
            &((dims[0] / 2) as i64),
            &((dims[1] / 2) as i64)
        );
        let want = x.rope(&table, &positions).map_err(tensor_error)?;
        ops.push(check(
            "rope",
            "rope_f32",
            &k.download(&dx)?,
            &host(&want)?,
            1e-5,
        ));
    }
    ops.extend(gemm_checks(&k, ordinal, &cpu)?);
    ops.push(attention_check(&k, &cpu)?);
    ops.push(conv_check(&k, &cpu)?);
    // resample: nearest x2 and pixel shuffle by 2, exact.
    {
        let (x, xv) = seeded(&[2, 8, 6, 10], 12, 1.0, &cpu)?;
        let (dx, out) = (k.upload(&xv)?, k.zeros::<f32>(xv.len() * 4)?);
        launch!(
            k,
            "upsample_nearest2x_f32",
            grid_for(xv.len() * 4),
            &dx,
            &out,
            &16i64,
            &6i64,
            &10i64
        );
        let want = x.upsample_nearest2x().map_err(tensor_error)?;
        ops.push(check(
            "resample",
            "upsample_nearest2x_f32",
            &k.download(&out)?,
            &host(&want)?,
            0.0,
        ));
        let out = k.zeros::<f32>(xv.len())?;
        launch!(
            k,
            "pixel_shuffle_f32",
            grid_for(xv.len()),
            &dx,
            &out,
            &4i64,
            &6i64,
            &10i64,
            &2i64
        );
        let want = x.pixel_shuffle(2).map_err(tensor_error)?;
        ops.push(check(
            "resample",
            "pixel_shuffle_f32",
            &k.download(&out)?,
            &host(&want)?,
            0.0,
        ));
    }
    // reduce: sum over the last axis and over a middle axis.
    {
        let (x, xv) = seeded(&[64, 300, 7], 13, 1.0, &cpu)?;
        let dx = k.upload(&xv)?;
        let out = k.zeros::<f32>(64 * 7)?;
        launch!(
            k,
            "sum_axis_f32",
            grid_for(64 * 7),
            &dx,
            &out,
            &64i64,
            &300i64,
            &7i64,
            &1.0f64
        );
        let want = x.sum(1, false).map_err(tensor_error)?;
        ops.push(check(
            "reduce",
            "sum_axis_f32",
            &k.download(&out)?,
            &host(&want)?,
            1e-5,
        ));
        let out = k.zeros::<f32>(64 * 300)?;
        launch!(
            k,
            "sum_rows_f32",
            rows_grid(64 * 300),
            &dx,
            &out,
            &((64 * 300) as i64),
            &7i64,
            &1.0f64
        );
        let want = x.sum(2, false).map_err(tensor_error)?;
        ops.push(check(
            "reduce",
            "sum_rows_f32",
            &k.download(&out)?,
            &host(&want)?,
            1e-5,
        ));
    }
    // copy: a transposed view made contiguous, exact.
    {
        let (x, xv) = seeded(&[24, 40, 3], 14, 1.0, &cpu)?;
        let view = x.transpose(0, 1).map_err(tensor_error)?;
        let shape = view.shape().to_vec();
        let vs = DeviceView::new(&shape, view.layout().strides())?;
        let vd = DeviceView::contiguous(&shape)?;
        let (dx, out) = (k.upload(&xv)?, k.zeros::<f32>(xv.len())?);
        launch!(
            k,
            "copy_strided_b4",
            grid_for(xv.len()),
            &dx,
            &out,
            &(xv.len() as i64),
            &vs,
            &vd
        );
        let want = view.contiguous().map_err(tensor_error)?;
        ops.push(check(
            "copy",
            "copy_strided_b4",
            &k.download(&out)?,
            &host(&want)?,
            0.0,
        ));
    }
    k.synchronize()?;
    Ok(SelftestReport {
        device: k.device_name().to_string(),
        arch: k.arch(),
        ops,
    })
}

/// `Attn` of `attention.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DeviceAttn {
    q_len: i64,
    kv_len: i64,
    block_len: i64,
    q_start: i64,
    scale_log2: f32,
    strides: [i64; 12],
}

// SAFETY: plain `repr(C)` data with the layout of the CUDA struct `Attn`.
unsafe impl cudarc::driver::DeviceRepr for DeviceAttn {}

/// Block-causal bf16 attention (head_dim 128) against the CPU's f32 attention on the same
/// bf16-rounded inputs.
fn attention_check(k: &CudaKernels, cpu: &Device) -> Result<OpCheck> {
    let (lq, lk, h, d, block) = (96usize, 160usize, 4usize, 128usize, 32usize);
    let round = |t: Tensor| t.to_dtype(DType::BF16).and_then(|t| t.to_dtype(DType::F32));
    let q = round(seeded(&[1, lq, h, d], 15, 1.0, cpu)?.0).map_err(tensor_error)?;
    let kt = round(seeded(&[1, lk, h, d], 16, 1.0, cpu)?.0).map_err(tensor_error)?;
    let v = round(seeded(&[1, lk, h, d], 17, 1.0, cpu)?.0).map_err(tensor_error)?;
    let bits = |t: &Tensor| -> Result<Vec<u16>> {
        Ok(host(t)?
            .iter()
            .map(|x| (x.to_bits() >> 16) as u16)
            .collect())
    };
    let (dq, dk, dv) = (
        k.upload(&bits(&q)?)?,
        k.upload(&bits(&kt)?)?,
        k.upload(&bits(&v)?)?,
    );
    let out = k.zeros::<f32>(lq * h * d)?;
    let q_start = lk - lq;
    let scale = 1.0 / (d as f32).sqrt();
    let (tok, head) = ((h * d) as i64, d as i64);
    let a = DeviceAttn {
        q_len: lq as i64,
        kv_len: lk as i64,
        block_len: block as i64,
        q_start: q_start as i64,
        scale_log2: scale * std::f32::consts::LOG2_E,
        strides: [
            (lq * h * d) as i64,
            tok,
            head,
            (lk * h * d) as i64,
            tok,
            head,
            (lk * h * d) as i64,
            tok,
            head,
            (lq * h * d) as i64,
            tok,
            head,
        ],
    };
    let cfg = LaunchConfig {
        grid_dim: (lq.div_ceil(64) as u32, h as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(k, "attention_bf16_d128", cfg, &dq, &dk, &dv, &out, &a);
    let mask = Mask::BlockCausal {
        block_len: block,
        q_start,
    };
    let want = Tensor::scaled_dot_product_attention(&q, &kt, &v, mask, Some(scale))
        .map_err(tensor_error)?;
    // P is rounded to bf16 before P·V: ~3 significant digits on outputs of size ~1.
    Ok(check(
        "attention",
        "attention_bf16_d128",
        &k.download(&out)?,
        &host(&want)?,
        2e-2,
    ))
}

/// `Conv3d` of `conv3d.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DeviceConv3d {
    dims: [i64; 18],
    replicate: i32,
}

// SAFETY: plain `repr(C)` data with the layout of the CUDA struct `Conv3d`.
unsafe impl cudarc::driver::DeviceRepr for DeviceConv3d {}

/// A causal 3x3x3 convolution with bias against the CPU's im2col + GEMM.
fn conv_check(k: &CudaKernels, cpu: &Device) -> Result<OpCheck> {
    let (b, ci, t, hh, ww, co) = (1usize, 24usize, 5usize, 12usize, 14usize, 40usize);
    let (x, xv) = seeded(&[b, ci, t, hh, ww], 18, 1.0, cpu)?;
    let (w, wv) = seeded(&[co, ci, 3, 3, 3], 19, 0.1, cpu)?;
    let (bias, bv) = seeded(&[co], 20, 1.0, cpu)?;
    let opts = Conv3dOptions::causal([1, 1, 1]);
    let want = x.conv3d(&w, Some(&bias), opts).map_err(tensor_error)?;
    let [_, _, ot, oh, ow] = *want.shape() else {
        return Err(tensor_error(crate::TensorError::shape("conv3d", "rank")));
    };
    let c = DeviceConv3d {
        dims: [
            b as i64, ci as i64, t as i64, hh as i64, ww as i64, co as i64, 3, 3, 3, 1, 1, 1, 2, 1,
            1, ot as i64, oh as i64, ow as i64,
        ],
        replicate: 0,
    };
    let (dx, dw, db) = (k.upload(&xv)?, k.upload(&wv)?, k.upload(&bv)?);
    let out = k.zeros::<f32>(b * co * ot * oh * ow)?;
    let positions = b * ot * oh * ow;
    let cfg = LaunchConfig {
        grid_dim: (positions.div_ceil(64) as u32, co.div_ceil(64) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(k, "conv3d_f32", cfg, &dx, &dw, &db, &out, &c);
    Ok(check(
        "conv3d",
        "conv3d_f32",
        &k.download(&out)?,
        &host(&want)?,
        1e-4,
    ))
}

/// cuBLASLt workspace, from the caching allocator on the `cuda` platform.
const GEMM_WORKSPACE_BYTES: u64 = 32 << 20;

/// f32 GEMM + bias (CUBLAS_COMPUTE_32F) and bf16 GEMM + bias + GELU against the CPU's
/// `linear` (and `gelu_tanh`) on the same (bf16-rounded) inputs.
fn gemm_checks(k: &CudaKernels, ordinal: usize, cpu: &Device) -> Result<Vec<OpCheck>> {
    let lt = match CublasLt::new() {
        Ok(lt) => lt,
        Err(e) => {
            eprintln!("gemm: {e}");
            return Ok(vec![OpCheck {
                op: "gemm",
                kernel: "cublasLt: library not loaded",
                max_error: f64::INFINITY,
                tolerance: 0.0,
                passed: false,
            }]);
        }
    };
    let platform = CachingPlatform::cuda(ordinal, AllocatorConfig::default(), ReclaimPolicy::Never)
        .map_err(|e| CudaError::NoDevice(e.to_string()))?;
    let block = platform
        .allocator()
        .allocate(GEMM_WORKSPACE_BYTES, 0)
        .map_err(|e| CudaError::Driver {
            call: "CachingAllocator::allocate",
            reason: e.to_string(),
        })?;
    let workspace = Workspace {
        ptr: block.addr(),
        bytes: GEMM_WORKSPACE_BYTES as usize,
    };
    let (m, n, kk) = (300usize, 384usize, 1536usize);
    let mut checks = Vec::new();
    for (input, epilogue, kernel, tol) in [
        (GemmInput::F32, Epilogue::Bias, "cublasLt f32 + bias", 1e-4),
        (
            GemmInput::Bf16,
            Epilogue::BiasGelu,
            "cublasLt bf16 + bias + gelu",
            1e-3,
        ),
    ] {
        let round = |t: Tensor| -> Result<Tensor> {
            match input {
                GemmInput::Bf16 => t
                    .to_dtype(DType::BF16)
                    .and_then(|t| t.to_dtype(DType::F32))
                    .map_err(tensor_error),
                GemmInput::F32 => Ok(t),
            }
        };
        let x = round(seeded(&[m, kk], 21, 1.0, cpu)?.0)?;
        let w = round(seeded(&[n, kk], 22, 0.03, cpu)?.0)?;
        let (bias, bv) = seeded(&[n], 23, 1.0, cpu)?;
        let mut want = x.linear(&w, Some(&bias)).map_err(tensor_error)?;
        if epilogue == Epilogue::BiasGelu {
            want = want.gelu_tanh().map_err(tensor_error)?;
        }
        let (xv, wv) = (host(&x)?, host(&w)?);
        let y = k.zeros::<f32>(m * n)?;
        let db = k.upload(&bv)?;
        let shape = GemmShape {
            m: m as u64,
            n: n as u64,
            k: kk as u64,
            input,
            epilogue,
            weight_transposed: true,
        };
        let stream = k.stream();
        let gpu = match input {
            GemmInput::F32 => {
                let (dx, dw) = (k.upload(&xv)?, k.upload(&wv)?);
                let ops = GemmOperands {
                    x: dx.device_ptr(stream).0,
                    w: dw.device_ptr(stream).0,
                    bias: Some(db.device_ptr(stream).0),
                    y: y.device_ptr(stream).0,
                };
                // SAFETY: every buffer has the shape's size and outlives the download below,
                // which waits for the stream.
                unsafe { lt.matmul(stream, &shape, ops, workspace) }?;
                k.download(&y)?
            }
            GemmInput::Bf16 => {
                let bits = |v: &[f32]| {
                    v.iter()
                        .map(|x| (x.to_bits() >> 16) as u16)
                        .collect::<Vec<u16>>()
                };
                let (dx, dw) = (k.upload(&bits(&xv))?, k.upload(&bits(&wv))?);
                let ops = GemmOperands {
                    x: dx.device_ptr(stream).0,
                    w: dw.device_ptr(stream).0,
                    bias: Some(db.device_ptr(stream).0),
                    y: y.device_ptr(stream).0,
                };
                // SAFETY: as above.
                unsafe { lt.matmul(stream, &shape, ops, workspace) }?;
                k.download(&y)?
            }
        };
        checks.push(check("gemm", kernel, &gpu, &host(&want)?, tol));
    }
    k.synchronize()?;
    drop(block);
    Ok(checks)
}
