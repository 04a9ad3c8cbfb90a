//! Copies on the device: any layout into any layout (casting where the dtypes differ),
//! and concatenation along an axis.

use super::{n64, unsupported, views};
use crate::cuda::launch::{Launch, Launcher};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// The bit-copy kernel for elements of `size` bytes.
fn copy_kernel(size: usize) -> &'static str {
    match size {
        8 => "copy_strided_b8",
        4 => "copy_strided_b4",
        2 => "copy_strided_b2",
        _ => "copy_strided_b1",
    }
}

/// Copies `src`'s elements (any layout) into `dst` (same shape, any layout), converting the
/// dtype when they differ.
pub fn copy_into(l: &dyn Launcher, src: &Tensor, dst: &Tensor) -> Result<()> {
    let op = "copy";
    let n = src.numel();
    if n == 0 {
        return Ok(());
    }
    if src.dtype() == dst.dtype() {
        let v = views(
            op,
            src.shape(),
            &[src.layout().strides(), dst.layout().strides()],
        )?;
        l.launch(&Launch::elements(
            copy_kernel(src.dtype().size()),
            n,
            vec![
                src.read_arg(),
                dst.write_arg(),
                n64(n),
                v[0].arg(),
                v[1].arg(),
            ],
        ))?;
        return Ok(());
    }
    let kernel = match (src.dtype(), dst.dtype()) {
        (DType::F32, DType::BF16) => Some("f32_to_bf16"),
        (DType::BF16, DType::F32) => Some("bf16_to_f32"),
        (DType::F32, DType::F16) => Some("f32_to_f16"),
        (DType::F16, DType::F32) => Some("f16_to_f32"),
        (DType::U8, DType::F32) => Some("u8_to_f32"),
        (DType::I64, DType::F32) => Some("i64_to_f32"),
        (DType::F8E4M3, DType::F32) => Some("e4m3_to_f32"),
        (DType::F8E5M2, DType::F32) => Some("e5m2_to_f32"),
        (DType::I8, DType::F32) => Some("i8_to_f32"),
        _ => None,
    };
    let Some(kernel) = kernel else {
        // Through f32 where both halves exist (bf16 ↔ f16, u8/i64/8-bit → bf16).
        if src.dtype() != DType::F32 && dst.dtype().is_float() && dst.dtype() != DType::F32 {
            let wide = src.copy_as(DType::F32)?;
            return copy_into(l, &wide, dst);
        }
        return Err(unsupported(
            op,
            format!("no cast from {} to {}", src.dtype(), dst.dtype()),
        ));
    };
    let dense_src = src.contiguous()?;
    if dst.is_contiguous() {
        l.launch(&Launch::elements(
            kernel,
            n,
            vec![dense_src.read_arg(), dst.write_arg(), n64(n)],
        ))?;
        return Ok(());
    }
    let dense = Tensor::empty(src.shape(), dst.dtype(), src.device())?;
    copy_into(l, &dense_src, &dense)?;
    copy_into(l, &dense, dst)
}

/// Copies each of `parts` (contiguous, one dtype) into its slice of `out` along `axis`.
pub fn cat(l: &dyn Launcher, parts: &[Tensor], out: &Tensor, axis: usize) -> Result<()> {
    let mut at = 0;
    for t in parts {
        let len = t.shape()[axis];
        let slot = out.narrow(axis, at, len)?;
        copy_into(l, t, &slot)?;
        at += len;
    }
    Ok(())
}
