//! Row and axis reductions on the device: layer and RMS norms, softmax, sums, means and
//! maxima.

use super::{n64, null};
use crate::cuda::launch::{Arg, Launch, Launcher};
use crate::error::Result;
use crate::tensor::Tensor;

/// A norm over rows of `n` of f32 contiguous `x` into `out`: `kernel(x, params…, y, rows,
/// n, eps)`, each optional f32 parameter a pointer or null (`layer_norm_f32`: weight and
/// bias; `rms_norm_f32`: weight).
pub fn row_norm(
    l: &dyn Launcher,
    kernel: &'static str,
    x: &Tensor,
    params: &[Option<&Tensor>],
    out: &Tensor,
    n: usize,
    eps: f32,
) -> Result<()> {
    let rows = x.numel() / n;
    let mut args = vec![x.read_arg()];
    args.extend(params.iter().map(|p| p.map_or_else(null, Tensor::read_arg)));
    args.extend([out.write_arg(), n64(rows), n64(n), Arg::f32(eps)]);
    l.launch(&Launch::rows(kernel, rows, args))?;
    Ok(())
}

/// The VAE's RMS norm over axis 1 of f32 contiguous `[batch, channels, inner]`.
pub fn rms_norm_channels(
    l: &dyn Launcher,
    x: &Tensor,
    gamma: &Tensor,
    out: &Tensor,
    [batch, channels, inner]: [usize; 3],
) -> Result<()> {
    let scale = (channels as f64).sqrt() as f32;
    l.launch(&Launch::elements(
        "rms_norm_channels_f32",
        batch * inner,
        vec![
            x.read_arg(),
            gamma.read_arg(),
            out.write_arg(),
            n64(batch),
            n64(channels),
            n64(inner),
            Arg::f32(scale),
        ],
    ))?;
    Ok(())
}

/// Softmax over rows of `cols` of f32 contiguous `x`.
pub fn softmax(l: &dyn Launcher, x: &Tensor, out: &Tensor, cols: usize) -> Result<()> {
    if cols == 0 {
        return Ok(());
    }
    let rows = x.numel() / cols;
    l.launch(&Launch::rows(
        "softmax_f32",
        rows,
        vec![x.read_arg(), out.write_arg(), n64(rows), n64(cols)],
    ))?;
    Ok(())
}

/// Sum (scaled by `scale`: 1 for a sum, 1/len for a mean) or max over the middle axis of
/// f32 contiguous `[outer, len, inner]`.
pub fn reduce(
    l: &dyn Launcher,
    x: &Tensor,
    out: &Tensor,
    [outer, len, inner]: [usize; 3],
    max: bool,
    scale: f64,
) -> Result<()> {
    let launch = match (inner, max) {
        (1, false) => Launch::rows(
            "sum_rows_f32",
            outer,
            vec![
                x.read_arg(),
                out.write_arg(),
                n64(outer),
                n64(len),
                Arg::f64(scale),
            ],
        ),
        (1, true) => Launch::rows(
            "max_rows_f32",
            outer,
            vec![x.read_arg(), out.write_arg(), n64(outer), n64(len)],
        ),
        (_, false) => Launch::elements(
            "sum_axis_f32",
            outer * inner,
            vec![
                x.read_arg(),
                out.write_arg(),
                n64(outer),
                n64(len),
                n64(inner),
                Arg::f64(scale),
            ],
        ),
        (_, true) => Launch::elements(
            "max_axis_f32",
            outer * inner,
            vec![
                x.read_arg(),
                out.write_arg(),
                n64(outer),
                n64(len),
                n64(inner),
            ],
        ),
    };
    l.launch(&launch)?;
    Ok(())
}
