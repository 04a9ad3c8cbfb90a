//! Resampling and padding on the device: nearest ×2 upsampling, pixel shuffle and
//! unshuffle, and padding with zeros or the edge values.

use super::{n64, unsupported};
use crate::cuda::launch::{Arg, DeviceView, Launch, Launcher, MAX_RANK};
use crate::error::Result;
use crate::tensor::Tensor;

/// Nearest ×2 of f32 contiguous `[planes, h, w]`.
pub fn upsample_nearest2x(
    l: &dyn Launcher,
    x: &Tensor,
    out: &Tensor,
    [planes, h, w]: [usize; 3],
) -> Result<()> {
    l.launch(&Launch::elements(
        "upsample_nearest2x_f32",
        out.numel(),
        vec![x.read_arg(), out.write_arg(), n64(planes), n64(h), n64(w)],
    ))?;
    Ok(())
}

/// Pixel shuffle (`unshuffle` false) or unshuffle of f32 contiguous `[b·c, …]` planes of
/// `h × w` low-resolution positions by `factor`.
pub fn pixel_shuffle(
    l: &dyn Launcher,
    x: &Tensor,
    out: &Tensor,
    [bc, h, w, factor]: [usize; 4],
    unshuffle: bool,
) -> Result<()> {
    let kernel = if unshuffle {
        "pixel_unshuffle_f32"
    } else {
        "pixel_shuffle_f32"
    };
    l.launch(&Launch::elements(
        kernel,
        out.numel(),
        vec![
            x.read_arg(),
            out.write_arg(),
            n64(bc),
            n64(h),
            n64(w),
            n64(factor),
        ],
    ))?;
    Ok(())
}

/// Pads f32 contiguous `x` by `pads` (before, after) per axis into `out`.
pub fn pad(
    l: &dyn Launcher,
    x: &Tensor,
    out: &Tensor,
    pads: &[(usize, usize)],
    replicate: bool,
) -> Result<()> {
    let op = "pad";
    if x.rank() > MAX_RANK {
        return Err(unsupported(
            op,
            format!("rank {} (at most {MAX_RANK})", x.rank()),
        ));
    }
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    // The input view carries the input shape and, in its strides field, the front pad of
    // each axis (`pad_f32` reads it so); the output view carries the output shape.
    let before: Vec<usize> = pads.iter().map(|p| p.0).collect();
    let vin = DeviceView::new(x.shape(), &before).expect("rank checked");
    let vout = DeviceView::new(out.shape(), &crate::layout::contiguous_strides(out.shape()))
        .expect("rank checked");
    l.launch(&Launch::elements(
        "pad_f32",
        n,
        vec![
            x.read_arg(),
            out.write_arg(),
            n64(n),
            vin.arg(),
            vout.arg(),
            Arg::i32(i32::from(replicate)),
        ],
    ))?;
    Ok(())
}
