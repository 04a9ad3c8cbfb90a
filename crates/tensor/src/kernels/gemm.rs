//! Matrix multiply on raw f32 buffers through the `gemm` crate: the one place kernels
//! call GEMM, so thread use and strides are handled once.

use gemm::Parallelism;

/// A strided read-only f32 matrix: element (r, c) is at `ptr + r*row_stride + c*col_stride`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    /// The elements.
    pub data: &'a [f32],
    /// Offset of element (0, 0) in `data`.
    pub offset: usize,
    /// Elements between consecutive rows.
    pub row_stride: isize,
    /// Elements between consecutive columns.
    pub col_stride: isize,
}

impl<'a> MatRef<'a> {
    /// A row-major matrix with `cols` columns starting at `offset`.
    pub fn row_major(data: &'a [f32], offset: usize, cols: usize) -> Self {
        Self {
            data,
            offset,
            row_stride: cols as isize,
            col_stride: 1,
        }
    }

    /// The same matrix transposed (no copy).
    pub fn t(self) -> Self {
        Self {
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    fn max_index(&self, rows: usize, cols: usize) -> Option<usize> {
        if rows == 0 || cols == 0 {
            return Some(self.offset);
        }
        let last = self.offset as isize
            + (rows as isize - 1) * self.row_stride
            + (cols as isize - 1) * self.col_stride;
        usize::try_from(last).ok()
    }
}

/// How many threads one GEMM may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// The calling thread only (inside an already parallel kernel).
    One,
    /// The kernel pool (call from inside [`crate::parallel::run`]).
    Pool,
}

/// `dst[m×n] (row-major, row stride dst_row_stride) = (accumulate ? dst : 0) + alpha · a[m×k] · b[k×n]`.
///
/// Panics if a matrix does not fit its buffer (an internal bug, never user input).
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_>,
    b: MatRef<'_>,
    dst: &mut [f32],
    dst_offset: usize,
    dst_row_stride: usize,
    accumulate: bool,
    alpha: f32,
    threads: Threads,
) {
    if m == 0 || n == 0 {
        return;
    }
    let a_end = a.max_index(m, k).expect("lhs indices are non-negative");
    let b_end = b.max_index(k, n).expect("rhs indices are non-negative");
    assert!(
        k == 0 || (a_end < a.data.len() && b_end < b.data.len()),
        "gemm operand out of bounds"
    );
    assert!(
        dst_offset + (m - 1) * dst_row_stride + n <= dst.len(),
        "gemm destination out of bounds"
    );
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                let row = dst_offset + r * dst_row_stride;
                dst[row..row + n].fill(0.0);
            }
        }
        return;
    }
    let parallelism = match threads {
        Threads::One => Parallelism::None,
        Threads::Pool => match crate::parallel::num_threads() {
            1 => Parallelism::None,
            n => Parallelism::Rayon(n),
        },
    };
    // SAFETY: the asserts above keep every index of a, b and dst inside its slice; dst is
    // borrowed mutably so it aliases neither operand.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr().add(dst_offset),
            1,
            dst_row_stride as isize,
            accumulate,
            a.data.as_ptr().add(a.offset),
            a.col_stride,
            a.row_stride,
            b.data.as_ptr().add(b.offset),
            b.col_stride,
            b.row_stride,
            1.0,
            alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgemm_matches_a_naive_product_with_transposed_operands() {
        let (m, n, k) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 2.0).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| (i as f32).sin()).collect();
        let mut dst = vec![1.0f32; m * n];
        sgemm(
            m,
            n,
            k,
            MatRef::row_major(&a, 0, k),
            MatRef::row_major(&bt, 0, k).t(),
            &mut dst,
            0,
            n,
            true,
            2.0,
            Threads::One,
        );
        for r in 0..m {
            for c in 0..n {
                let expected: f32 =
                    1.0 + 2.0 * (0..k).map(|i| a[r * k + i] * bt[c * k + i]).sum::<f32>();
                assert!((dst[r * n + c] - expected).abs() < 1e-4);
            }
        }
    }
}
