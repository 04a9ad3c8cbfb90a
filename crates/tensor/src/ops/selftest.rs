//! `headroom cuda selftest`: every op family through the tensor runtime on a GPU device
//! and on the host, on the same seeded inputs, compared element by element. The GPU side
//! is the real dispatch path (the ops' launches and cuBLASLt calls), so this checks the
//! kernels and the code that calls them. Noise, casts, copies, resampling and pixels must
//! match exactly; float math within a tolerance per op.
//!
//! [`run_on`] takes any GPU device; on the checked launcher (no GPU) it exercises every
//! launch of the self-test without computing values.

use crate::cuda::error::{CudaError, Result};
use crate::kernels::resample::PadMode;
use crate::kernels::rope::RopeTable;
use crate::ops::attention::Mask;
use crate::ops::conv::Conv3dOptions;
use crate::{DType, Device, Tensor};

/// One op's comparison.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpCheck {
    /// The op family.
    pub op: &'static str,
    /// What ran (op and shape).
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
    /// The device (its launcher's description: name, arch).
    pub device: String,
    /// One entry per op check.
    pub ops: Vec<OpCheck>,
}

fn tensor_error(e: crate::TensorError) -> CudaError {
    match e {
        crate::TensorError::Cuda(e) => e,
        other => CudaError::Driver {
            call: "tensor op",
            reason: other.to_string(),
        },
    }
}

/// Largest |a − b| (0 where the bits agree, ∞ for NaN or a length mismatch).
fn max_error(gpu: &[f32], cpu: &[f32]) -> f64 {
    if gpu.len() != cpu.len() {
        return f64::INFINITY;
    }
    gpu.iter().zip(cpu).fold(0.0, |m: f64, (&g, &c)| {
        let d = if g.to_bits() == c.to_bits() {
            0.0
        } else {
            (f64::from(g) - f64::from(c)).abs()
        };
        m.max(if d.is_nan() { f64::INFINITY } else { d })
    })
}

/// Seeded f32 values of `shape` scaled by `scale`, made on the host and copied to `d`.
fn input(d: &Device, shape: &[usize], seed: u64, scale: f32) -> crate::Result<Tensor> {
    let host = Device::cpu()?;
    Tensor::randn(shape, seed, 0, DType::F32, &host)?
        .mul_scalar(scale)?
        .to_device(d)
}

/// The same as [`input`], rounded to bf16.
fn input_bf16(d: &Device, shape: &[usize], seed: u64, scale: f32) -> crate::Result<Tensor> {
    input(d, shape, seed, scale)?.to_dtype(DType::BF16)
}

/// A `[n, k]` float8_e4m3fn weight (seeded codes) and its per-channel scales, made on
/// the host and copied to `d`.
fn fp8_weight(d: &Device, [n, k]: [usize; 2], seed: u64) -> crate::Result<(Tensor, Tensor)> {
    let codes = input(&Device::cpu()?, &[n, k], seed, 1.0)?.to_dtype(DType::F8E4M3)?;
    let scale = input(&Device::cpu()?, &[n], seed + 1000, 1.0)?
        .exp()?
        .mul_scalar(0.03)?;
    Ok((codes.to_device(d)?, scale.to_device(d)?))
}

/// `[rows, k]` f32 inputs that quantize per row without loss to 8-bit codes whose
/// largest is `limit` (448: float8_e4m3fn, 127: int8): code values times 2⁻⁸, each row's
/// largest `limit` · 2⁻⁸ (so its scale is 2⁻⁸, exactly). The GPU's W8A8 product is then
/// the host's (W8A16 for fp8, W8A8 for int8) up to the order of the sums.
fn exact_rows(d: &Device, [rows, k]: [usize; 2], seed: u64, limit: f32) -> crate::Result<Tensor> {
    let host = Device::cpu()?;
    let v = input(&host, &[rows, k], seed, limit / 4.0)?.clamp(-limit, limit)?;
    let mut v = if limit == 448.0 {
        v.to_dtype(DType::F8E4M3)?.to_f32_vec()?
    } else {
        v.to_f32_vec()?
            .iter()
            .map(|x| x.round_ties_even())
            .collect()
    };
    for row in v.chunks_exact_mut(k.max(1)) {
        row[0] = limit;
    }
    Tensor::from_slice(&v, &[rows, k], &host)?
        .mul_scalar(1.0 / 256.0)?
        .to_device(d)
}

/// An op run on a device.
type OpOn = Box<dyn Fn(&Device) -> crate::Result<Tensor>>;

/// One check: op family, what runs, tolerance, the op.
type Case = (&'static str, &'static str, f64, OpOn);

/// Every check: op family, what runs, tolerance, and the op on a device.
fn cases() -> Vec<Case> {
    let mut c: Vec<Case> = Vec::new();
    let mut add = |op, what, tol, f: OpOn| c.push((op, what, tol, f));
    add(
        "noise",
        "randn 2^20",
        0.0,
        Box::new(|d| Tensor::randn(&[1 << 20], 42, 1000, DType::F32, d)),
    );
    add(
        "elementwise",
        "add [64,1,96] + [1,32,96]",
        1e-6,
        Box::new(|d| input(d, &[64, 1, 96], 1, 1.0)?.add(&input(d, &[1, 32, 96], 2, 1.0)?)),
    );
    add(
        "elementwise",
        "mul of transposed views",
        1e-6,
        Box::new(|d| {
            let a = input(d, &[48, 80], 3, 1.0)?;
            a.transpose(0, 1)?.mul(&input(d, &[80, 48], 4, 1.0)?)
        }),
    );
    add(
        "elementwise",
        "gelu_tanh",
        1e-5,
        Box::new(|d| input(d, &[4096], 5, 3.0)?.gelu_tanh()),
    );
    add(
        "elementwise",
        "silu",
        1e-5,
        Box::new(|d| input(d, &[4096], 6, 3.0)?.silu()),
    );
    add(
        "elementwise",
        "tanh, relu",
        1e-5,
        Box::new(|d| input(d, &[4096], 8, 3.0)?.tanh()?.affine(2.0, -0.5)?.relu()),
    );
    add(
        "elementwise",
        "affine, clamp",
        1e-6,
        Box::new(|d| {
            input(d, &[4096], 7, 3.0)?
                .affine(0.5, 0.25)?
                .clamp(-1.0, 1.0)
        }),
    );
    add(
        "cast",
        "f32 -> bf16 -> f32",
        0.0,
        Box::new(|d| {
            input(d, &[4096], 8, 3.0)?
                .to_dtype(DType::BF16)?
                .to_dtype(DType::F32)
        }),
    );
    add(
        "copy",
        "permute + contiguous, cat",
        0.0,
        Box::new(|d| {
            let a = input(d, &[3, 40, 56], 9, 1.0)?
                .permute(&[2, 0, 1])?
                .contiguous()?;
            Tensor::cat(&[&a, &a.narrow(1, 1, 2)?], 1)
        }),
    );
    add(
        "softmax",
        "[256, 1536]",
        1e-6,
        Box::new(|d| input(d, &[256, 1536], 10, 2.0)?.softmax()),
    );
    add(
        "layer_norm",
        "[256, 1536] with weight and bias",
        1e-5,
        Box::new(|d| {
            let (w, b) = (input(d, &[1536], 11, 1.0)?, input(d, &[1536], 12, 1.0)?);
            input(d, &[256, 1536], 13, 2.0)?.layer_norm(Some(&w), Some(&b), 1e-6)
        }),
    );
    add(
        "rms_norm",
        "[256, 1536] with weight",
        1e-5,
        Box::new(|d| {
            input(d, &[256, 1536], 14, 2.0)?.rms_norm(Some(&input(d, &[1536], 15, 1.0)?), 1e-6)
        }),
    );
    add(
        "rms_norm",
        "channels of [1, 96, 2, 20, 24]",
        1e-5,
        Box::new(|d| {
            input(d, &[1, 96, 2, 20, 24], 16, 1.0)?.rms_norm_channels(&input(d, &[96], 17, 1.0)?)
        }),
    );
    add(
        "rope",
        "[1, 60, 4, 128]",
        1e-5,
        Box::new(|d| {
            let table = RopeTable::new(128, 64, 10_000.0);
            let pos: Vec<[usize; 3]> = (0..60).map(|i| [i / 20, (i / 5) % 4, i % 5]).collect();
            input(d, &[1, 60, 4, 128], 18, 1.0)?.rope(&table, &pos)
        }),
    );
    add(
        "attention",
        "bf16 d128 block-causal",
        2e-2,
        Box::new(|d| {
            let q = input_bf16(d, &[1, 96, 4, 128], 19, 1.0)?;
            let k = input_bf16(d, &[1, 160, 4, 128], 20, 1.0)?;
            let v = input_bf16(d, &[1, 160, 4, 128], 21, 1.0)?;
            let mask = Mask::BlockCausal {
                block_len: 32,
                q_start: 64,
            };
            Tensor::scaled_dot_product_attention(&q, &k, &v, mask, None)
        }),
    );
    add(
        "attention",
        "f32 d64",
        1e-5,
        Box::new(|d| {
            let q = input(d, &[2, 50, 3, 64], 22, 1.0)?;
            let k = input(d, &[2, 70, 3, 64], 23, 1.0)?;
            Tensor::scaled_dot_product_attention(&q, &k, &k, Mask::None, None)
        }),
    );
    add(
        "attention",
        "f32 d384 (GEMM + softmax + GEMM)",
        1e-4,
        Box::new(|d| {
            let q = input(d, &[2, 120, 1, 384], 24, 1.0)?;
            Tensor::scaled_dot_product_attention(&q, &q, &q, Mask::None, None)
        }),
    );
    add(
        "conv3d",
        "causal 3x3x3 with bias",
        1e-4,
        Box::new(|d| {
            let x = input(d, &[1, 24, 5, 12, 14], 25, 1.0)?;
            let w = input(d, &[40, 24, 3, 3, 3], 26, 0.1)?;
            x.conv3d(
                &w,
                Some(&input(d, &[40], 27, 1.0)?),
                Conv3dOptions::causal([1, 1, 1]),
            )
        }),
    );
    add(
        "conv3d",
        "2-D, stride 2",
        1e-4,
        Box::new(|d| {
            let x = input(d, &[2, 16, 18, 22], 28, 1.0)?;
            x.conv2d(&input(d, &[24, 16, 3, 3], 29, 0.1)?, None, [2, 2], [1, 1])
        }),
    );
    add(
        "resample",
        "nearest x2, pixel unshuffle + shuffle",
        0.0,
        Box::new(|d| {
            let x = input(d, &[2, 8, 12, 10], 30, 1.0)?.upsample_nearest2x()?;
            x.pixel_unshuffle(2)?.narrow(1, 0, 16)?.pixel_shuffle(2)
        }),
    );
    add(
        "resample",
        "pad zeros and replicate",
        0.0,
        Box::new(|d| {
            let x = input(d, &[2, 3, 7, 9], 31, 1.0)?;
            let z = x.pad(&[(0, 0), (1, 0), (2, 1), (0, 3)], PadMode::Zeros)?;
            z.pad(&[(0, 0), (0, 0), (1, 1), (2, 0)], PadMode::Replicate)
        }),
    );
    add(
        "reduce",
        "sum of rows, mean over a middle axis",
        1e-5,
        Box::new(|d| {
            let x = input(d, &[64, 1536], 32, 1.0)?;
            let s = x.sum(1, false)?;
            let m = input(d, &[8, 300, 40], 33, 1.0)?
                .mean(1, false)?
                .reshape(&[320])?;
            Tensor::cat(&[&s, &m], 0)
        }),
    );
    add(
        "reduce",
        "max of rows and over a middle axis",
        0.0,
        Box::new(|d| {
            let a = input(d, &[64, 1536], 34, 1.0)?.max(1, false)?;
            let b = input(d, &[8, 300, 40], 35, 1.0)?
                .max(1, false)?
                .reshape(&[320])?;
            Tensor::cat(&[&a, &b], 0)
        }),
    );
    add(
        "gemm",
        "linear f32 + bias 300x384x1536",
        1e-4,
        Box::new(|d| {
            let x = input(d, &[300, 1536], 36, 1.0)?;
            let w = input(d, &[384, 1536], 37, 0.03)?;
            x.linear(&w, Some(&input(d, &[384], 38, 1.0)?))
        }),
    );
    add(
        "gemm",
        "linear bf16 300x384x1536",
        1e-3,
        Box::new(|d| {
            let x = input_bf16(d, &[300, 1536], 39, 1.0)?;
            x.linear(&input_bf16(d, &[384, 1536], 40, 0.03)?, None)
        }),
    );
    add(
        "gemm",
        "linear bf16 + bias + tanh-GELU",
        1e-3,
        Box::new(|d| {
            let x = input_bf16(d, &[300, 1536], 44, 1.0)?;
            let w = input_bf16(d, &[384, 1536], 45, 0.03)?;
            x.linear_gelu_tanh(&w, &input(d, &[384], 46, 1.0)?)
        }),
    );
    add(
        "gemm",
        "linear fp8 (e4m3 codes) + bias + tanh-GELU 300x384x1536",
        1e-4,
        Box::new(|d| {
            let (w, scale) = fp8_weight(d, [384, 1536], 47)?;
            let x = exact_rows(d, [300, 1536], 48, 448.0)?;
            let gelu = Some(crate::kernels::activation::Activation::GeluTanh);
            x.linear_fp8_then(&w, &scale, Some(&input(d, &[384], 49, 1.0)?), gelu)
        }),
    );
    add(
        "gemm",
        "linear fp8 widened to bf16 (k 1000) 300x384x1000",
        1e-3,
        Box::new(|d| {
            let (w, scale) = fp8_weight(d, [384, 1000], 50)?;
            input_bf16(d, &[300, 1000], 51, 1.0)?.linear_fp8(&w, &scale, None)
        }),
    );
    add(
        "gemm",
        "linear int8 (W8A8) + bias + tanh-GELU 300x384x1536",
        1e-4,
        Box::new(|d| {
            let w = crate::ops::int8::Int8Linear::from_codes(
                &exact_rows(&Device::cpu()?, [384, 1536], 52, 127.0)?
                    .mul_scalar(256.0)?
                    .to_dtype(DType::I8)?
                    .to_device(d)?,
                &input(d, &[384], 53, 1.0)?.exp()?.mul_scalar(0.01)?,
            )?;
            let x = exact_rows(d, [300, 1536], 54, 127.0)?;
            let gelu = Some(crate::kernels::activation::Activation::GeluTanh);
            x.linear_int8_as(&w, Some(&input(d, &[384], 55, 1.0)?), gelu, DType::F32)
        }),
    );
    add(
        "gemm",
        "batched matmul f32 [3, 70, 96] @ [96, 50]",
        1e-4,
        Box::new(|d| input(d, &[3, 70, 96], 41, 1.0)?.matmul(&input(d, &[96, 50], 42, 0.1)?)),
    );
    add(
        "cast",
        "pixels",
        0.0,
        Box::new(|d| input(d, &[4096], 43, 1.5)?.to_pixels()),
    );
    c
}

/// Runs every check on GPU `ordinal` (feature `cuda`).
#[cfg(feature = "cuda")]
pub fn run(ordinal: usize) -> Result<SelftestReport> {
    use headroom_mem::{AllocatorConfig, ReclaimPolicy};
    let gpu = Device::cuda(ordinal, AllocatorConfig::default(), ReclaimPolicy::Never)
        .map_err(tensor_error)?;
    run_on(&gpu)
}

/// Runs every check on `gpu` against the host.
pub fn run_on(gpu: &Device) -> Result<SelftestReport> {
    let cpu = Device::cpu().map_err(tensor_error)?;
    let device = gpu
        .launcher()
        .map(|l| l.describe())
        .ok_or_else(|| CudaError::NoDevice("the self-test needs a GPU device".into()))?;
    let mut ops = Vec::new();
    for (op, kernel, tolerance, f) in cases() {
        let values = |d: &Device| f(d).and_then(|t| t.to_f32_vec()).map_err(tensor_error);
        let max_error = max_error(&values(gpu)?, &values(&cpu)?);
        ops.push(OpCheck {
            op,
            kernel,
            max_error,
            tolerance,
            passed: max_error <= tolerance,
        });
    }
    Ok(SelftestReport { device, ops })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::float8::F8E4M3;

    /// The premise of the 8-bit checks: each row's scale is 2⁻⁸ exactly, and every value
    /// times its row's inverse scale is a code (so quantizing loses nothing).
    #[test]
    fn exact_rows_quantize_without_loss() {
        let host = Device::cpu().unwrap();
        for limit in [448.0f32, 127.0] {
            let x = exact_rows(&host, [7, 96], 3, limit).unwrap();
            for row in x.to_f32_vec().unwrap().chunks_exact(96) {
                let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                let inv = limit / amax;
                assert_eq!(inv, 256.0);
                for &v in row {
                    let q = v * inv;
                    if limit == 448.0 {
                        assert_eq!(F8E4M3::from_f32(q).to_f32(), q, "{v}");
                    } else {
                        assert_eq!(q.round_ties_even(), q, "{v}");
                        assert!(q.abs() <= 127.0);
                    }
                }
            }
        }
    }
}
