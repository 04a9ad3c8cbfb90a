//! The tensor ops on a GPU device: each function here turns one op, whose shapes the
//! host-side op has already checked and whose inputs it has already converted (contiguous
//! f32 unless said otherwise), into launches of the embedded kernels or a cuBLASLt GEMM on
//! the device's [`Launcher`]. Outputs are fresh tensors from the device's allocator.
//!
//! Always built: without a GPU the same code runs against the
//! [`CheckedLauncher`](crate::cuda::check::CheckedLauncher), which validates every launch.

use crate::cuda::error::CudaError;
use crate::cuda::launch::{
    Arg, CStruct, DeviceView, Epilogue, GemmInput, GemmOperands, GemmShape, Launch, Launcher,
    MAX_RANK,
};
use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::attention::Mask;
use crate::kernels::rope::RopeTable;
use crate::tensor::Tensor;

fn unsupported(op: &'static str, reason: impl Into<String>) -> crate::TensorError {
    CudaError::Unsupported {
        op,
        reason: reason.into(),
    }
    .into()
}

/// `shape` with every pair of neighbouring axes merged that is contiguous in all `strides`
/// (so a view of any rank whose irregular axes are few fits a [`DeviceView`]).
fn collapse(shape: &[usize], strides: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut out_shape: Vec<usize> = Vec::new();
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for (axis, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let merges = !out_shape.is_empty()
            && strides.iter().zip(&out_strides).all(|(s, o)| {
                o.last().copied() == Some(s[axis] * n) || (s[axis] == 0 && o.last() == Some(&0))
            });
        if merges {
            *out_shape.last_mut().expect("non-empty") *= n;
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                *o.last_mut().expect("non-empty") = s[axis];
            }
        } else {
            out_shape.push(n);
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                o.push(s[axis]);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        for o in &mut out_strides {
            o.push(1);
        }
    }
    (out_shape, out_strides)
}

/// Views of `shape` with each of `strides`, collapsed to at most [`MAX_RANK`] axes.
fn views(op: &'static str, shape: &[usize], strides: &[&[usize]]) -> Result<Vec<DeviceView>> {
    let (shape, strides) = collapse(shape, strides);
    if shape.len() > MAX_RANK {
        return Err(unsupported(
            op,
            format!(
                "a strided view of {} irregular axes (at most {MAX_RANK})",
                shape.len()
            ),
        ));
    }
    Ok(strides
        .iter()
        .map(|s| DeviceView::new(&shape, s).expect("rank checked"))
        .collect())
}

fn n64(n: usize) -> Arg {
    Arg::i64(n as i64)
}

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
        _ => None,
    };
    let Some(kernel) = kernel else {
        // Through f32 where both halves exist (bf16 ↔ f16, u8/i64 → bf16).
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

/// A null pointer argument (an absent optional parameter).
fn null() -> Arg {
    Arg::u64(0)
}

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

/// What a [`RopeCache`] keeps for a GPU device: the tables and the last positions.
struct RopeOnDevice {
    device: crate::Device,
    cos: Tensor,
    sin: Tensor,
    /// Hash and length of the positions (times the batch) and their `[n, 3]` i32 bytes.
    positions: Option<(u64, usize, Tensor)>,
}

/// `(cos, sin, positions)` of `table` on `device`, uploading what its cache does not
/// keep (outside a scope, everything, each call).
fn rope_tensors(
    device: &crate::Device,
    table: &RopeTable,
    positions: &[[usize; 3]],
    batch: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    use std::hash::{Hash, Hasher};
    table.device_copies().with_copies(|slot| {
        let kept = slot.as_ref().and_then(|c| c.downcast_ref::<RopeOnDevice>());
        if kept.is_none_or(|c| &c.device != device) {
            let (cos, sin) = table.tables();
            *slot = Some(Box::new(RopeOnDevice {
                device: device.clone(),
                cos: Tensor::from_slice(cos, &[cos.len()], device)?,
                sin: Tensor::from_slice(sin, &[sin.len()], device)?,
                positions: None,
            }));
        }
        let cached = slot
            .as_mut()
            .and_then(|c| c.downcast_mut::<RopeOnDevice>())
            .expect("set above");
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        positions.hash(&mut hasher);
        let (key, len) = (hasher.finish(), positions.len() * batch);
        let fresh = !matches!(&cached.positions, Some((k, n, _)) if *k == key && *n == len);
        if fresh {
            // `[batch · tokens, 3]` i32 positions, as bytes (the runtime has no i32 dtype).
            let bytes: Vec<u8> = (0..batch)
                .flat_map(|_| positions.iter().flat_map(|p| p.map(|v| v as i32)))
                .flat_map(i32::to_le_bytes)
                .collect();
            let pos = Tensor::from_bytes(&bytes, &[bytes.len()], DType::U8, device)?;
            cached.positions = Some((key, len, pos));
        }
        let pos = cached.positions.as_ref().expect("set above").2.clone();
        Ok((cached.cos.clone(), cached.sin.clone(), pos))
    })
}

/// RoPE of f32 contiguous `x` (`[batch·tokens, heads, head_dim]`) in place.
pub fn rope(
    l: &dyn Launcher,
    x: &Tensor,
    table: &RopeTable,
    positions: &[[usize; 3]],
    batch: usize,
    heads: usize,
) -> Result<()> {
    let tokens = positions.len();
    let (cos, sin, pos) = rope_tensors(x.device(), table, positions, batch)?;
    let [t_dim, h_dim, _] = table.axis_dims();
    let head_dim = table.head_dim();
    let n = batch * tokens * heads * (head_dim / 2);
    l.launch(&Launch::elements(
        "rope_f32",
        n,
        vec![
            x.write_arg(),
            cos.read_arg(),
            sin.read_arg(),
            pos.read_arg(),
            n64(batch * tokens),
            n64(heads),
            n64(head_dim),
            n64(table.max_positions()),
            n64(t_dim / 2),
            n64(h_dim / 2),
        ],
    ))?;
    Ok(())
}

/// The `Attn` struct of `attention.cu`.
#[allow(clippy::too_many_arguments)]
fn attn_arg(
    q_len: usize,
    kv_len: usize,
    mask: Mask,
    scale: f32,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
) -> Arg {
    let (block_len, q_start) = match mask {
        Mask::None => (0, 0),
        Mask::BlockCausal { block_len, q_start } => (block_len, q_start),
    };
    let mut s = CStruct::new()
        .i64(q_len as i64)
        .i64(kv_len as i64)
        .i64(block_len as i64)
        .i64(q_start as i64)
        .f32(scale * std::f32::consts::LOG2_E);
    for t in [q, k, v, out] {
        let st = t.layout().strides();
        s = s.i64(st[0] as i64).i64(st[1] as i64).i64(st[2] as i64);
    }
    s.build()
}

/// Attention of `[B, L, H, D]` q, k, v (last axis dense; bf16 for the tensor-core kernels
/// at head_dim 64 and 128, else f32) into f32 contiguous `out`.
pub fn attention(
    l: &dyn Launcher,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    mask: Mask,
    scale: f32,
) -> Result<()> {
    let [b, lq, h, d] = *q.shape() else {
        return Err(unsupported("attention", "q is not [B, L, H, D]"));
    };
    let lk = k.shape()[1];
    let a = attn_arg(lq, lk, mask, scale, q, k, v, out);
    let bf16 = q.dtype() == DType::BF16;
    let launch = if bf16 && (d == 64 || d == 128) {
        Launch {
            kernel: if d == 64 {
                "attention_bf16_d64"
            } else {
                "attention_bf16_d128"
            },
            grid: [lq.div_ceil(64) as u32, h as u32, b as u32],
            block: [128, 1, 1],
            shared: 0,
            args: vec![q.read_arg(), k.read_arg(), v.read_arg(), out.write_arg(), a],
        }
    } else {
        if d > 256 || q.dtype() != DType::F32 {
            return Err(unsupported(
                "attention",
                format!("head_dim {d} in {}", q.dtype()),
            ));
        }
        Launch {
            kernel: "attention_f32",
            grid: [lq.div_ceil(4) as u32, h as u32, b as u32],
            block: [128, 1, 1],
            shared: 0,
            args: vec![
                q.read_arg(),
                k.read_arg(),
                v.read_arg(),
                out.write_arg(),
                a,
                Arg::i32(d as i32),
            ],
        }
    };
    l.launch(&launch)?;
    Ok(())
}

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
