//! 8-bit linears on the device: fp8 (`float8_e4m3fn` / `float8_e5m2`) and int8 weights.
//!
//! Where the GPU multiplies the weight's codes (fp8 tensor cores on sm_89+ for fp8,
//! int8 everywhere for int8) and the shapes are aligned, the input is quantized per row
//! to the same kind of codes (`quantize_rows_*`), cuBLASLt multiplies the two sets of
//! codes into f32 (fp8) or exact i32 (int8) sums, and `scale_bias_act_f32` scales each
//! sum by its row's and its column's scale, adds the bias and applies GELU, in place:
//! W8A8. Elsewhere the weight is widened to bf16 one linear at a time (a transient copy of
//! that one weight) and multiplied by the bf16 input, the same epilogue applying the
//! weight's scale: W8A16. The same happens when cuBLASLt finds no 8-bit algorithm for
//! a shape.

use super::{n64, null};
use crate::cuda::error::CudaError;
use crate::cuda::launch::{
    Arg, Epilogue, Fp8Format, GemmInput, GemmOperands, GemmShape, Launch, Launcher, NO_ALGORITHM,
};
use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::activation::Activation;
use crate::tensor::Tensor;

/// The 8-bit GEMM input for weight codes of `dtype` (`None` for a dtype that is not one).
fn eight_bit_input(dtype: DType) -> Option<GemmInput> {
    match dtype {
        DType::F8E4M3 => Some(GemmInput::Fp8(Fp8Format::E4M3)),
        DType::F8E5M2 => Some(GemmInput::Fp8(Fp8Format::E5M2)),
        DType::I8 => Some(GemmInput::I8),
        _ => None,
    }
}

/// Whether a `rows × n × k` product with these weight codes runs on cuBLASLt's 8-bit
/// GEMM: the launcher has one for the codes' kind, the leading dimensions are multiples
/// of 16 bytes and the weight starts 16-byte aligned (cuBLASLt's rules for 8-bit operands
/// and a 4-byte result).
pub fn eight_bit_gemm(l: &dyn Launcher, codes: &Tensor, n: usize, k: usize) -> bool {
    let kind = match eight_bit_input(codes.dtype()) {
        Some(GemmInput::Fp8(_)) => l.fp8_gemm(),
        Some(_) => true,
        None => false,
    };
    kind && k.is_multiple_of(16) && n.is_multiple_of(4) && codes.device_addr().is_multiple_of(16)
}

/// `act(x · (codes · scale)ᵀ + bias)` over the last axis of `x` (any float dtype and
/// layout) into a new f32 tensor of `out_shape`: [`linear_8bit`] with the input made
/// dense and SiLU, which the epilogue does not fuse, applied after.
pub fn linear_8bit_then(
    l: &dyn Launcher,
    x: &Tensor,
    codes: &Tensor,
    scale: &Tensor,
    bias: Option<&Tensor>,
    out_shape: &[usize],
    activation: Option<Activation>,
) -> Result<Tensor> {
    let dense = dense_bf16_or_f32(x)?;
    let bias = bias.map(Tensor::to_f32_contiguous).transpose()?;
    let out = Tensor::empty(out_shape, DType::F32, x.device())?;
    let gelu = activation == Some(Activation::GeluTanh);
    linear_8bit(l, &dense, codes, scale, bias.as_ref(), &out, gelu)?;
    match activation {
        Some(Activation::Silu) => out.silu(),
        _ => Ok(out),
    }
}

/// `out[rows, n] = act((x[rows, k] · codesᵀ) · scale + bias)`: `x` dense f32 or bf16,
/// `codes` a dense `[n, k]` F8E4M3, F8E5M2 or I8 weight, `scale` f32 of 1 or `n` values,
/// `bias` f32 of `n`, `out` f32; tanh-GELU when `gelu`.
#[allow(clippy::too_many_arguments)]
pub fn linear_8bit(
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
    let Some(input) = eight_bit_input(codes.dtype()) else {
        return Err(super::unsupported(
            "linear_8bit",
            "a weight that is not 8-bit",
        ));
    };
    let mut row_scales = None;
    if k == 0 {
        l.zero(out.device_addr(), out.span_bytes())?;
    } else if eight_bit_gemm(l, codes, n, k) {
        let code = match input {
            GemmInput::I8 => DType::I8,
            _ => DType::F8E4M3,
        };
        let q = Tensor::empty(&[rows, k], code, x.device())?;
        let xs = Tensor::empty(&[rows], DType::F32, x.device())?;
        quantize_rows(l, x, &q, &xs)?;
        match gemm(l, [rows, n, k], input, &q, codes, out) {
            Ok(()) => row_scales = Some(xs),
            // cuBLASLt has no 8-bit algorithm for this shape on this GPU: widen instead.
            Err(crate::TensorError::Cuda(CudaError::Driver { call, .. }))
                if call == NO_ALGORITHM =>
            {
                widened(l, x, codes, input, [rows, n, k], out)?;
            }
            Err(e) => return Err(e),
        }
    } else {
        widened(l, x, codes, input, [rows, n, k], out)?;
    }
    let sums_i32 = row_scales.is_some() && input == GemmInput::I8;
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
            Arg::i32(i32::from(sums_i32)),
        ],
    ))?;
    Ok(())
}

/// `out = x · widen(codes)ᵀ` in bf16: the weight widened to a transient bf16 copy.
fn widened(
    l: &dyn Launcher,
    x: &Tensor,
    codes: &Tensor,
    input: GemmInput,
    [rows, n, k]: [usize; 3],
    out: &Tensor,
) -> Result<()> {
    let wide = Tensor::empty(&[n, k], DType::BF16, x.device())?;
    let kernel = match input {
        GemmInput::Fp8(Fp8Format::E5M2) => "e5m2_to_bf16",
        GemmInput::I8 => "i8_to_bf16",
        _ => "e4m3_to_bf16",
    };
    l.launch(&Launch::elements(
        kernel,
        n * k,
        vec![codes.read_arg(), wide.write_arg(), n64(n * k)],
    ))?;
    let xb = x.to_dtype(DType::BF16)?.contiguous()?;
    gemm(l, [rows, n, k], GemmInput::Bf16, &xb, &wide, out)
}

/// Each row of dense f32 or bf16 `x` (`[rows, k]`) quantized symmetrically into `codes`
/// (F8E4M3: scale `max|row| / 448`; I8: `max|row| / 127`, rounded to nearest even) with
/// its scale into `scales` (0 for a row of zeros).
pub fn quantize_rows(l: &dyn Launcher, x: &Tensor, codes: &Tensor, scales: &Tensor) -> Result<()> {
    let rows = scales.numel();
    if rows == 0 {
        return Ok(());
    }
    let kernel = match (codes.dtype(), x.dtype()) {
        (DType::I8, DType::BF16) => "quantize_rows_i8_bf16",
        (DType::I8, _) => "quantize_rows_i8_f32",
        (_, DType::BF16) => "quantize_rows_e4m3_bf16",
        _ => "quantize_rows_e4m3_f32",
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

/// `t` dense in bf16 when it is bf16, else in f32: what the 8-bit kernels read.
pub fn dense_bf16_or_f32(t: &Tensor) -> Result<Tensor> {
    match t.dtype() {
        DType::BF16 => t.contiguous(),
        _ => t.to_dtype(DType::F32)?.contiguous(),
    }
}

/// A float `[n, k]` weight on the device quantized per output channel into `code` (F8E4M3
/// or I8) codes and their f32 scales `[n]` (the activations' kernel over its rows).
pub fn quantize_weight(w: &Tensor, code: DType) -> Result<(Tensor, Tensor)> {
    let l = w
        .device()
        .launcher()
        .ok_or_else(|| super::unsupported("quantize_weight", "a weight on the host"))?;
    let (n, k) = (w.shape()[0], w.shape()[1]);
    let dense = dense_bf16_or_f32(w)?;
    let codes = Tensor::empty(&[n, k], code, w.device())?;
    let scales = Tensor::empty(&[n], DType::F32, w.device())?;
    quantize_rows(l.as_ref(), &dense, &codes, &scales)?;
    Ok((codes, scales))
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
