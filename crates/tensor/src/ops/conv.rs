//! Convolutions: causal 3-D (Wan's `CausalConv3d`) and 2-D, as tiled im2col + GEMM with
//! the im2col scratch taken from the allocator.

use crate::dtype::DType;
use crate::error::{Result, TensorError};
pub use crate::kernels::conv::TimePad;
use crate::kernels::conv::{self as k, Conv2dParams, Conv3dParams};
use crate::kernels::gemm::Compute;
use crate::ops::dispatch::ConvDims;
use crate::tensor::Tensor;

/// Stride and padding of a causal 3-D convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dOptions {
    /// Strides along (t, h, w).
    pub stride: [usize; 3],
    /// Frames added in front of the time axis (Wan: `2·padding_t`, less any cached frames).
    pub pad_t_front: usize,
    /// What those frames hold.
    pub time_pad: TimePad,
    /// Symmetric zero padding of h and w.
    pub pad_hw: [usize; 2],
}

impl Conv3dOptions {
    /// Wan's `CausalConv3d(padding=(pt, ph, pw))` with stride 1: `2·pt` zero frames in
    /// front, `ph`/`pw` on both sides.
    pub fn causal(padding: [usize; 3]) -> Self {
        Self {
            stride: [1, 1, 1],
            pad_t_front: 2 * padding[0],
            time_pad: TimePad::Zeros,
            pad_hw: [padding[1], padding[2]],
        }
    }
}

fn check_weight(
    op: &'static str,
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    spatial: usize,
) -> Result<(usize, usize)> {
    x.same_device(op, weight)?;
    let rank = spatial + 2;
    if x.rank() != rank || weight.rank() != rank {
        return Err(TensorError::shape(
            op,
            format!(
                "input {:?} and weight {:?} must both have {rank} axes",
                x.shape(),
                weight.shape()
            ),
        ));
    }
    let (cout, cin) = (weight.shape()[0], weight.shape()[1]);
    if x.shape()[1] != cin {
        return Err(TensorError::shape(
            op,
            format!(
                "input {:?} has {} channels, weight {:?} expects {cin}",
                x.shape(),
                x.shape()[1],
                weight.shape()
            ),
        ));
    }
    if weight.shape()[2..].contains(&0) {
        return Err(TensorError::shape(
            op,
            format!("weight {:?} has an empty kernel axis", weight.shape()),
        ));
    }
    if let Some(b) = bias {
        if b.shape() != [cout] {
            return Err(TensorError::shape(
                op,
                format!("bias {:?} is not [{cout}]", b.shape()),
            ));
        }
    }
    Ok((cout, cin))
}

fn check_extent(
    op: &'static str,
    x: &Tensor,
    size: usize,
    pad: usize,
    kernel: usize,
    stride: usize,
    axis: &str,
) -> Result<()> {
    if stride == 0 {
        return Err(TensorError::shape(
            op,
            format!("stride along {axis} must be at least 1"),
        ));
    }
    if size + pad < kernel {
        return Err(TensorError::shape(
            op,
            format!("input {:?} is smaller along {axis} ({size} + padding {pad}) than the kernel ({kernel})", x.shape()),
        ));
    }
    Ok(())
}

impl Tensor {
    /// Causal 3-D convolution: input `[B, Cin, T, H, W]`, weight `[Cout, Cin, kt, kh, kw]`,
    /// bias `[Cout]`; result f32 `[B, Cout, To, Ho, Wo]`.
    pub fn conv3d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        options: Conv3dOptions,
    ) -> Result<Tensor> {
        crate::profile::op("conv3d", &[self, weight], || {
            let op = "conv3d";
            let (cout, cin) = check_weight(op, self, weight, bias, 3)?;
            let s = self.shape();
            let w = weight.shape();
            let [st, sh, sw] = options.stride;
            check_extent(op, self, s[2], options.pad_t_front, w[2], st, "t")?;
            check_extent(op, self, s[3], 2 * options.pad_hw[0], w[3], sh, "h")?;
            check_extent(op, self, s[4], 2 * options.pad_hw[1], w[4], sw, "w")?;
            if options.time_pad == TimePad::Replicate && options.pad_t_front > 0 && s[2] == 0 {
                return Err(TensorError::shape(
                    op,
                    "replicate time padding needs at least one frame",
                ));
            }
            let p = Conv3dParams {
                batch: s[0],
                in_channels: cin,
                out_channels: cout,
                in_t: s[2],
                in_h: s[3],
                in_w: s[4],
                kernel: [w[2], w[3], w[4]],
                stride: options.stride,
                pad_t_front: options.pad_t_front,
                time_pad: options.time_pad,
                pad_h: options.pad_hw[0],
                pad_w: options.pad_hw[1],
                compute: compute_of(weight),
            };
            let [to, ho, wo] = p.out_dims();
            if self.device().launcher().is_some() {
                let dims = ConvDims {
                    input: [s[0], cin, s[2], s[3], s[4]],
                    weight: [cout, w[2], w[3], w[4]],
                    stride: options.stride,
                    pad: [options.pad_t_front, options.pad_hw[0], options.pad_hw[1]],
                    out: [to, ho, wo],
                    replicate: options.time_pad == TimePad::Replicate,
                };
                return run_conv_gpu(self, weight, bias, &[s[0], cout, to, ho, wo], dims);
            }
            run_conv(
                self,
                weight,
                bias,
                &[s[0], cout, to, ho, wo],
                k::conv3d_scratch_len(&p),
                |x, w, b, out, scratch| k::conv3d(&p, x, w, b, out, scratch),
            )
        })
    }

    /// 2-D convolution: input `[B, Cin, H, W]`, weight `[Cout, Cin, kh, kw]`, bias `[Cout]`,
    /// symmetric zero padding; result f32 `[B, Cout, Ho, Wo]`.
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<Tensor> {
        crate::profile::op("conv2d", &[self, weight], || {
            let op = "conv2d";
            let (cout, cin) = check_weight(op, self, weight, bias, 2)?;
            let s = self.shape();
            let w = weight.shape();
            check_extent(op, self, s[2], 2 * padding[0], w[2], stride[0], "h")?;
            check_extent(op, self, s[3], 2 * padding[1], w[3], stride[1], "w")?;
            let p = Conv2dParams {
                batch: s[0],
                in_channels: cin,
                out_channels: cout,
                in_h: s[2],
                in_w: s[3],
                kernel: [w[2], w[3]],
                stride,
                pad_h: padding[0],
                pad_w: padding[1],
                compute: compute_of(weight),
            };
            let [ho, wo] = p.out_dims();
            if self.device().launcher().is_some() {
                let dims = ConvDims {
                    input: [s[0], cin, 1, s[2], s[3]],
                    weight: [cout, 1, w[2], w[3]],
                    stride: [1, stride[0], stride[1]],
                    pad: [0, padding[0], padding[1]],
                    out: [1, ho, wo],
                    replicate: false,
                };
                return run_conv_gpu(self, weight, bias, &[s[0], cout, ho, wo], dims);
            }
            run_conv(
                self,
                weight,
                bias,
                &[s[0], cout, ho, wo],
                k::conv2d_scratch_len(&p),
                |x, w, b, out, scratch| k::conv2d(&p, x, w, b, out, scratch),
            )
        })
    }
}

/// bf16 weights make a bf16 conv (inputs rounded to bf16 as they are packed).
fn compute_of(weight: &Tensor) -> Compute {
    if weight.dtype() == DType::BF16 {
        Compute::Bf16
    } else {
        crate::kernels::gemm::f32_compute()
    }
}

/// Allocates the output and the im2col scratch (in that order, on every device) and runs
/// the kernel where there are bytes.
/// A convolution on a GPU device: f32 operands, the implicit-GEMM kernel.
fn run_conv_gpu(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    out_shape: &[usize],
    dims: ConvDims,
) -> Result<Tensor> {
    let l = x.device().launcher().expect("called on GPU devices only");
    let xf = x.to_f32_contiguous()?;
    let wf = weight.to_f32_contiguous()?;
    let bf = bias.map(Tensor::to_f32_contiguous).transpose()?;
    let out = Tensor::empty(out_shape, DType::F32, x.device())?;
    if out.numel() > 0 {
        crate::ops::dispatch::conv(l.as_ref(), &xf, &wf, bf.as_ref(), &out, dims)?;
    }
    Ok(out)
}

fn run_conv(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    out_shape: &[usize],
    scratch_len: usize,
    kernel: impl FnOnce(&[f32], &[f32], Option<&[f32]>, &mut [f32], &mut [f32]) + Send,
) -> Result<Tensor> {
    let xf = x.to_f32_contiguous()?;
    let wf = weight.to_f32_contiguous()?;
    let bf = bias.map(Tensor::to_f32_contiguous).transpose()?;
    let mut out = Tensor::empty(out_shape, DType::F32, x.device())?;
    let mut scratch = Tensor::empty(&[scratch_len], DType::F32, x.device())?;
    if let (Some(xs), Some(ws)) = (xf.as_slice::<f32>(), wf.as_slice::<f32>()) {
        let bs = bf.as_ref().and_then(|b| b.as_slice::<f32>());
        if let (Some(o), Some(sc)) = (out.data_mut::<f32>(), scratch.data_mut::<f32>()) {
            crate::parallel::run(|| kernel(xs, ws, bs, o, sc));
        }
    }
    drop(scratch);
    Ok(out)
}
