//! 8-bit float linears on the device.
//!
//! On a GPU with fp8 tensor cores (sm_89+) and aligned shapes, the input is quantized per
//! row to `float8_e4m3fn` (`quantize_rows_e4m3_*`), cuBLASLt multiplies the codes with
//! the weight's codes into f32 sums, and `scale_bias_act_f32` scales each sum by its
//! row's and its column's scale, adds the bias and applies GELU, in place. Elsewhere the
//! weight is widened to bf16 one linear at a time (a transient copy of that one weight)
//! and multiplied by the bf16 input, the same epilogue applying the weight's scale.

use super::{n64, null};
use crate::cuda::launch::{
    Arg, Epilogue, Fp8Format, GemmInput, GemmOperands, GemmShape, Launch, Launcher,
};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// Whether a `rows × n × k` product with this weight runs on cuBLASLt's fp8 GEMM:
/// the launcher has one, the leading dimensions are multiples of 16 bytes and the weight
/// starts 16-byte aligned (cuBLASLt's rules for 8-bit operands and an f32 result).
pub fn fp8_tensor_cores(l: &dyn Launcher, codes: &Tensor, n: usize, k: usize) -> bool {
    l.fp8_gemm()
        && k.is_multiple_of(16)
        && n.is_multiple_of(4)
        && codes.device_addr().is_multiple_of(16)
}

/// `out[rows, n] = act((x[rows, k] · codesᵀ) · scale + bias)`: `x` dense f32 or bf16,
/// `codes` a dense `[n, k]` F8E4M3 or F8E5M2 weight, `scale` f32 of 1 or `n` values,
/// `bias` f32 of `n`, `out` f32; tanh-GELU when `gelu`.
#[allow(clippy::too_many_arguments)]
pub fn linear_fp8(
    l: &dyn Launcher,
    x: &Tensor,
    codes: &Tensor,
    scale: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    gelu: bool,
) -> Result<()> {
    let (n, k) = (codes.shape()[0], codes.shape()[1]);
    let rows = out.numel() / n.max(1);
    if rows == 0 || n == 0 {
        return Ok(());
    }
    let format = match codes.dtype() {
        DType::F8E5M2 => Fp8Format::E5M2,
        _ => Fp8Format::E4M3,
    };
    let mut row_scales = None;
    if k == 0 {
        l.zero(out.device_addr(), out.span_bytes())?;
    } else if fp8_tensor_cores(l, codes, n, k) {
        let q = Tensor::empty(&[rows, k], DType::F8E4M3, x.device())?;
        let xs = Tensor::empty(&[rows], DType::F32, x.device())?;
        quantize_rows_e4m3(l, x, &q, &xs)?;
        gemm(l, [rows, n, k], GemmInput::Fp8(format), &q, codes, out)?;
        row_scales = Some(xs);
    } else {
        let wide = Tensor::empty(&[n, k], DType::BF16, x.device())?;
        let kernel = match format {
            Fp8Format::E4M3 => "e4m3_to_bf16",
            Fp8Format::E5M2 => "e5m2_to_bf16",
        };
        l.launch(&Launch::elements(
            kernel,
            n * k,
            vec![codes.read_arg(), wide.write_arg(), n64(n * k)],
        ))?;
        let xb = x.to_dtype(DType::BF16)?.contiguous()?;
        gemm(l, [rows, n, k], GemmInput::Bf16, &xb, &wide, out)?;
    }
    l.launch(&Launch::elements(
        "scale_bias_act_f32",
        rows * n,
        vec![
            out.write_arg(),
            row_scales.as_ref().map_or_else(null, Tensor::read_arg),
            scale.read_arg(),
            n64(scale.numel()),
            bias.map_or_else(null, Tensor::read_arg),
            n64(rows),
            n64(n),
            Arg::i32(i32::from(gelu)),
        ],
    ))?;
    Ok(())
}

/// Each row of dense f32 or bf16 `x` (`[rows, k]`) quantized to `float8_e4m3fn` into
/// `codes` with its scale `max|row| / 448` into `scales` (0 for a row of zeros).
pub fn quantize_rows_e4m3(
    l: &dyn Launcher,
    x: &Tensor,
    codes: &Tensor,
    scales: &Tensor,
) -> Result<()> {
    let rows = scales.numel();
    if rows == 0 {
        return Ok(());
    }
    let kernel = if x.dtype() == DType::BF16 {
        "quantize_rows_e4m3_bf16"
    } else {
        "quantize_rows_e4m3_f32"
    };
    l.launch(&Launch::rows(
        kernel,
        rows,
        vec![
            x.read_arg(),
            codes.write_arg(),
            scales.write_arg(),
            n64(rows),
            n64(x.numel() / rows),
        ],
    ))?;
    Ok(())
}

/// `out = x · wᵀ` of dense operands, no epilogue.
fn gemm(
    l: &dyn Launcher,
    [m, n, k]: [usize; 3],
    input: GemmInput,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
) -> Result<()> {
    l.gemm(
        &GemmShape {
            m: m as u64,
            n: n as u64,
            k: k as u64,
            input,
            epilogue: Epilogue::None,
            weight_transposed: true,
        },
        &GemmOperands {
            x: x.device_addr(),
            w: w.device_addr(),
            bias: None,
            y: out.device_addr(),
        },
    )?;
    Ok(())
}
