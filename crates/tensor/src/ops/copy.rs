//! Copying a (possibly strided) tensor into a fresh dense one, converting the dtype.

use half::{bf16, f16};

use crate::float8::{F8E4M3, F8E5M2};
use rayon::prelude::*;

use crate::dtype::{DType, Element};
use crate::error::{Result, TensorError};
use crate::kernels::simd;
use crate::layout::Layout;
use crate::tensor::Tensor;

impl Tensor {
    /// A dense copy of the elements, converted to `dtype`.
    pub fn copy_as(&self, dtype: DType) -> Result<Self> {
        crate::profile::op("copy", &[self], || {
            let mut out = Self::empty(self.shape(), dtype, self.device())?;
            if let Some(l) = self.device().launcher() {
                super::dispatch::copy_into(l.as_ref(), self, &out)?;
                return Ok(out);
            }
            if self.device().is_meta() {
                return Ok(out);
            }
            copy_into(self, &mut out);
            Ok(out)
        })
    }

    /// Overwrites this tensor's elements with `src`'s (same shape; dtypes converted). The
    /// tensor must be contiguous and the only handle on its storage (a pooled block the
    /// caller owns), so no other view observes the write.
    pub fn assign(&mut self, src: &Tensor) -> Result<()> {
        if src.shape() != self.shape() {
            return Err(TensorError::shape(
                "assign",
                format!(
                    "source {:?} does not match destination {:?}",
                    src.shape(),
                    self.shape()
                ),
            ));
        }
        self.same_device("assign", src)?;
        if !self.is_contiguous() || self.layout().offset() != 0 || !self.owns_storage_alone() {
            return Err(TensorError::shape(
                "assign",
                "the destination must be a contiguous tensor that owns its storage alone",
            ));
        }
        if let Some(l) = self.device().launcher() {
            super::dispatch::copy_into(l.as_ref(), src, self)?;
        } else if !self.device().is_meta() {
            copy_into(src, self);
        }
        Ok(())
    }
}

/// Elements per parallel chunk of a dense conversion.
const CHUNK: usize = 1 << 16;

/// Copies `src` into the fresh contiguous `out` (same shape), converting dtypes through
/// f32 (i64 → i64 and equal dtypes copy exactly).
pub(crate) fn copy_into(src: &Tensor, out: &mut Tensor) {
    macro_rules! dispatch_dst {
        ($s:ty) => {
            match out.dtype() {
                DType::F32 => copy_typed::<$s, f32>(src, out),
                DType::BF16 => copy_typed::<$s, bf16>(src, out),
                DType::F16 => copy_typed::<$s, f16>(src, out),
                DType::U8 => copy_typed::<$s, u8>(src, out),
                DType::I64 => copy_typed::<$s, i64>(src, out),
                DType::F8E4M3 => copy_typed::<$s, F8E4M3>(src, out),
                DType::F8E5M2 => copy_typed::<$s, F8E5M2>(src, out),
                DType::I8 => copy_typed::<$s, i8>(src, out),
            }
        };
    }
    match src.dtype() {
        DType::F32 => dispatch_dst!(f32),
        DType::BF16 => dispatch_dst!(bf16),
        DType::F16 => dispatch_dst!(f16),
        DType::U8 => dispatch_dst!(u8),
        DType::I64 => dispatch_dst!(i64),
        DType::F8E4M3 => dispatch_dst!(F8E4M3),
        DType::F8E5M2 => dispatch_dst!(F8E5M2),
        DType::I8 => dispatch_dst!(i8),
    }
}

fn convert<S: Element, D: Element>(value: S) -> D {
    if S::DTYPE == D::DTYPE {
        // SAFETY: S and D are the same type (equal DTYPE means equal Rust type here).
        return unsafe { std::mem::transmute_copy::<S, D>(&value) };
    }
    D::from_f32(value.to_f32())
}

fn copy_typed<S: Element, D: Element>(src: &Tensor, out: &mut Tensor) {
    let Some(data) = src.storage_as::<S>() else {
        return;
    };
    let layout: Layout = src.layout().clone();
    let Some(dst) = out.data_mut::<D>() else {
        return;
    };
    if layout.is_contiguous() {
        let start = layout.offset();
        let input = &data[start..start + dst.len()];
        crate::parallel::run(|| {
            dst.par_chunks_mut(CHUNK)
                .zip(input.par_chunks(CHUNK))
                .for_each(|(d, s)| simd::map(d, s, convert::<S, D>));
        });
        return;
    }
    // Strided source: rows of the last axis in parallel, each from its own start.
    let inner = layout.shape().last().copied().unwrap_or(1).max(1);
    let stride = layout.strides().last().copied().unwrap_or(0);
    let rows_per_task = (CHUNK / inner).max(1);
    crate::parallel::run(|| {
        dst.par_chunks_mut(inner * rows_per_task)
            .enumerate()
            .for_each(|(task, chunk)| {
                for (r, row) in chunk.chunks_mut(inner).enumerate() {
                    let base = layout.row_start(task * rows_per_task + r);
                    if stride == 1 {
                        // Contiguous rows (a narrow, a permute that keeps the last axis):
                        // one slice each, through the path's SIMD build.
                        simd::map(row, &data[base..base + row.len()], convert::<S, D>);
                    } else {
                        for (j, d) in row.iter_mut().enumerate() {
                            *d = convert(data[base + j * stride]);
                        }
                    }
                }
            });
    });
}
