//! Elementwise ops on the device: binary ops with broadcasting, unary ops by name,
//! two-parameter maps, the normal generator and the conversion to pixels.

use super::{n64, unsupported, views};
use crate::cuda::launch::{Arg, Launch, Launcher};
use crate::error::Result;
use crate::tensor::Tensor;

/// A binary elementwise op (`add`, `sub`, `mul`, `div`) of f32 `a` and `b`, each broadcast
/// to `out`'s shape.
pub fn binary(
    l: &dyn Launcher,
    op: &'static str,
    a: &Tensor,
    b: &Tensor,
    out: &Tensor,
) -> Result<()> {
    let (strided, contig) = match op {
        "add" => ("add_f32", "add_contig_f32"),
        "sub" => ("sub_f32", "sub_contig_f32"),
        "mul" => ("mul_f32", "mul_contig_f32"),
        "div" => ("div_f32", "div_contig_f32"),
        _ => return Err(unsupported(op, "no binary kernel of this name")),
    };
    let shape = out.shape();
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let la = a.layout().broadcast_to(shape)?;
    let lb = b.layout().broadcast_to(shape)?;
    // Broadcast operands are read through their own (smaller) spans.
    if la.is_contiguous() && lb.is_contiguous() {
        let args = vec![a.read_arg(), b.read_arg(), out.write_arg(), n64(n)];
        l.launch(&Launch::elements(contig, n, args))?;
        return Ok(());
    }
    let v = views(op, shape, &[la.strides(), lb.strides()])?;
    l.launch(&Launch::elements(
        strided,
        n,
        vec![
            a.read_arg(),
            b.read_arg(),
            out.write_arg(),
            n64(n),
            v[0].arg(),
            v[1].arg(),
        ],
    ))?;
    Ok(())
}

/// A unary op of the elementwise module by name (`exp`, `silu`, `gelu_tanh`, …) of f32
/// contiguous `x` into `out`.
pub fn unary(l: &dyn Launcher, op: &'static str, x: &Tensor, out: &Tensor) -> Result<()> {
    let kernel = match op {
        "exp" => "exp_f32",
        "sin" => "sin_f32",
        "cos" => "cos_f32",
        "sqrt" => "sqrt_f32",
        "rsqrt" => "rsqrt_f32",
        "silu" => "silu_f32",
        "tanh" => "tanh_f32",
        "gelu_tanh" => "gelu_tanh_f32",
        "gelu_erf" => "gelu_erf_f32",
        _ => return Err(unsupported(op, "no unary kernel of this name")),
    };
    let n = x.numel();
    l.launch(&Launch::elements(
        kernel,
        n,
        vec![x.read_arg(), out.write_arg(), n64(n)],
    ))?;
    Ok(())
}

/// `kernel(x, out, n, p, q)` of f32 contiguous `x` with two float parameters:
/// `affine_f32` (`x · p + q`) and `clamp_f32` (`x` clamped to `[p, q]`).
pub fn map2(
    l: &dyn Launcher,
    kernel: &'static str,
    x: &Tensor,
    out: &Tensor,
    p: f32,
    q: f32,
) -> Result<()> {
    let n = x.numel();
    let args = vec![
        x.read_arg(),
        out.write_arg(),
        n64(n),
        Arg::f32(p),
        Arg::f32(q),
    ];
    l.launch(&Launch::elements(kernel, n, args))?;
    Ok(())
}

/// `numel(out)` normal values of the counter-based generator into f32 `out`.
pub fn randn(l: &dyn Launcher, out: &Tensor, seed: u64, offset: u64) -> Result<()> {
    let n = out.numel();
    l.launch(&Launch::elements(
        "randn_f32",
        n,
        vec![out.write_arg(), n64(n), Arg::u64(seed), Arg::u64(offset)],
    ))?;
    Ok(())
}

/// Video values in [-1, 1] (f32 contiguous) to u8 pixels.
pub fn to_pixels(l: &dyn Launcher, x: &Tensor, out: &Tensor) -> Result<()> {
    let n = x.numel();
    l.launch(&Launch::elements(
        "f32_to_pixels",
        n,
        vec![x.read_arg(), out.write_arg(), n64(n)],
    ))?;
    Ok(())
}
