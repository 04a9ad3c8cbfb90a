//! GEMMs on the device through cuBLASLt: linear layers (with the bias and GELU
//! epilogues) and batched matmuls.

use super::unsupported;
use crate::cuda::launch::{Epilogue, GemmInput, GemmOperands, GemmShape, Launcher};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// The GEMM input dtype for operands `a` and `b`: bf16 when either is bf16.
pub fn gemm_input(a: DType, b: DType) -> (GemmInput, DType) {
    if a == DType::BF16 || b == DType::BF16 {
        (GemmInput::Bf16, DType::BF16)
    } else {
        (GemmInput::F32, DType::F32)
    }
}

/// `out[rows, n] = x[rows, k] · wᵀ (+ bias) (→ tanh-GELU when `gelu`, which needs the bias:
/// cuBLASLt's bias + GELU epilogue)` with x and w dense in the input dtype, bias f32, out
/// f32.
pub fn linear(
    l: &dyn Launcher,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    input: GemmInput,
    gelu: bool,
) -> Result<()> {
    let (n, k) = (w.shape()[0], w.shape()[1]);
    let m = x.numel() / k.max(1);
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        return Err(unsupported("linear", "an empty inner dimension"));
    }
    let shape = GemmShape {
        m: m as u64,
        n: n as u64,
        k: k as u64,
        input,
        epilogue: match (bias.is_some(), gelu) {
            (true, true) => Epilogue::BiasGelu,
            (true, false) => Epilogue::Bias,
            (false, false) => Epilogue::None,
            (false, true) => return Err(unsupported("linear", "a GELU epilogue without a bias")),
        },
        weight_transposed: true,
    };
    l.gemm(
        &shape,
        &GemmOperands {
            x: x.device_addr(),
            w: w.device_addr(),
            bias: bias.map(Tensor::device_addr),
            y: out.device_addr(),
        },
    )?;
    Ok(())
}

/// Batched `out[i] = a[i] · b[i]` of `batches` dense `[m, k]` and `[k, n]` matrices in the
/// input dtype (a and b already broadcast and made contiguous), out f32 `[batches, m, n]`.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    l: &dyn Launcher,
    a: &Tensor,
    b: &Tensor,
    out: &Tensor,
    [batches, m, k, n]: [usize; 4],
    input: GemmInput,
) -> Result<()> {
    let shape = GemmShape {
        m: m as u64,
        n: n as u64,
        k: k as u64,
        input,
        epilogue: Epilogue::None,
        weight_transposed: false,
    };
    if out.numel() == 0 {
        return Ok(());
    }
    if k == 0 {
        l.zero(out.device_addr(), out.span_bytes())?;
        return Ok(());
    }
    let size = shape.input_size();
    for i in 0..batches as u64 {
        l.gemm(
            &shape,
            &GemmOperands {
                x: a.device_addr() + i * (m * k) as u64 * size,
                w: b.device_addr() + i * (k * n) as u64 * size,
                bias: None,
                y: out.device_addr() + i * (m * n) as u64 * 4,
            },
        )?;
    }
    Ok(())
}
