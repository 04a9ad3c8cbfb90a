//! The scalar path: plain loops that every other path is tested against.
//!
//! Each output element sums its products in increasing k, in f32. For bf16 precision
//! the operands are rounded to bf16 first (each product is then exact in f32, as on the
//! bf16 hardware paths); for [`Precision::Bf16x3`] the three part products are summed
//! per k in the AMX order.

use super::amx::Precision;
use super::pack::{Operand, Part};

fn value(op: &Operand<'_>, r: usize, c: usize, part: Part) -> f32 {
    f32::from_bits(u32::from(op.get(r, c, part)) << 16)
}

/// `dst[r·ldc + c] = (accumulate ? dst : 0) + alpha · Σ_k A[r][k]·B[k][c]`, with the
/// operands as they are (`None`) or rounded as `precision` says.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: &Operand<'_>,
    b: &Operand<'_>,
    dst: &mut [f32],
    offset: usize,
    ldc: usize,
    accumulate: bool,
    alpha: f32,
    precision: Option<Precision>,
) {
    for r in 0..m {
        for c in 0..n {
            let mut sum = 0.0f32;
            for i in 0..k {
                sum += match precision {
                    None => a.exact(r, i) * b.exact(i, c),
                    Some(p) => {
                        let (pa, pb) = p.parts();
                        pa.iter()
                            .zip(pb)
                            .map(|(&x, &y)| value(a, r, i, x) * value(b, i, c, y))
                            .sum::<f32>()
                    }
                };
            }
            let d = &mut dst[offset + r * ldc + c];
            *d = if accumulate {
                *d + alpha * sum
            } else {
                alpha * sum
            };
        }
    }
}
