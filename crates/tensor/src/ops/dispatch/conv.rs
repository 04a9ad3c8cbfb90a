//! Direct convolution on the device (`conv3d.cu`); 2-D convolutions run as 3-D ones of
//! one frame.

use super::null;
use crate::cuda::launch::{CStruct, Launch, Launcher};
use crate::error::Result;
use crate::tensor::Tensor;

/// Dims of one convolution in the `Conv3d` struct of `conv3d.cu` (2-D convolutions are
/// 3-D ones with one frame and a kernel of one frame).
#[derive(Debug, Clone, Copy)]
pub struct ConvDims {
    /// `[batch, cin, t, h, w]` of the input.
    pub input: [usize; 5],
    /// `[cout, kt, kh, kw]` of the weight.
    pub weight: [usize; 4],
    /// Strides in t, h, w.
    pub stride: [usize; 3],
    /// Front pad in time, symmetric pad in h and w.
    pub pad: [usize; 3],
    /// `[t, h, w]` of the output.
    pub out: [usize; 3],
    /// The time pad copies frame 0 instead of zeros.
    pub replicate: bool,
}

/// Convolution of f32 contiguous `x` with f32 contiguous `w` (+ f32 bias) into `out`.
pub fn conv(
    l: &dyn Launcher,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    c: ConvDims,
) -> Result<()> {
    let mut s = CStruct::new();
    for v in c
        .input
        .iter()
        .chain(&c.weight)
        .chain(&c.stride)
        .chain(&c.pad)
        .chain(&c.out)
    {
        s = s.i64(*v as i64);
    }
    let arg = s.i32(i32::from(c.replicate)).build();
    let positions = c.input[0] * c.out.iter().product::<usize>();
    l.launch(&Launch {
        kernel: "conv3d_f32",
        grid: [
            positions.div_ceil(64) as u32,
            c.weight[0].div_ceil(64) as u32,
            1,
        ],
        block: [256, 1, 1],
        shared: 0,
        args: vec![
            x.read_arg(),
            w.read_arg(),
            bias.map_or_else(null, Tensor::read_arg),
            out.write_arg(),
            arg,
        ],
    })?;
    Ok(())
}
