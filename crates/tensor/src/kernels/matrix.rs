//! A strided read-only matrix view: what a GEMM reads and a packer copies from.

/// A strided read-only matrix: element (r, c) is at `ptr + r*row_stride + c*col_stride`.
#[derive(Debug)]
pub struct MatRef<'a, T = f32> {
    /// The elements.
    pub data: &'a [T],
    /// Offset of element (0, 0) in `data`.
    pub offset: usize,
    /// Elements between consecutive rows.
    pub row_stride: isize,
    /// Elements between consecutive columns.
    pub col_stride: isize,
}

impl<T> Clone for MatRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for MatRef<'_, T> {}

impl<'a, T> MatRef<'a, T> {
    /// A row-major matrix with `cols` columns starting at `offset`.
    pub fn row_major(data: &'a [T], offset: usize, cols: usize) -> Self {
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

    /// The columns from `c0` on (no copy); `c0` is a column of the matrix.
    pub fn cols_from(self, c0: usize) -> Self {
        Self {
            offset: self.index(0, c0),
            ..self
        }
    }

    /// Index of element (r, c) in `data`.
    #[inline(always)]
    pub fn index(&self, r: usize, c: usize) -> usize {
        (self.offset as isize + r as isize * self.row_stride + c as isize * self.col_stride)
            as usize
    }

    pub(crate) fn max_index(&self, rows: usize, cols: usize) -> Option<usize> {
        if rows == 0 || cols == 0 {
            return Some(self.offset);
        }
        let last = self.offset as isize
            + (rows as isize - 1) * self.row_stride
            + (cols as isize - 1) * self.col_stride;
        usize::try_from(last).ok()
    }
}
