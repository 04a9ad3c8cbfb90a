//! Attention and RoPE on the device; the RoPE tables and the last positions stay on the
//! device between calls (in the table's cache).

use super::{n64, unsupported};
use crate::cuda::launch::{Arg, CStruct, Launch, Launcher};
use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::attention::Mask;
use crate::kernels::rope::RopeTable;
use crate::tensor::Tensor;

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
