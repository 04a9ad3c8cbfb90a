//! Shape, strides (in elements) and offset: how a tensor's elements sit in its storage.
//! Views (reshape, permute, narrow, broadcast) build a new layout and never copy.

use crate::error::{Result, TensorError};

/// Where each element of a tensor lives in its storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

/// Row-major strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1;
    for (i, &d) in shape.iter().enumerate().rev() {
        strides[i] = acc;
        acc *= d.max(1);
    }
    strides
}

/// Number of elements of `shape`.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl Layout {
    /// A contiguous row-major layout of `shape` at offset 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Self {
            strides: contiguous_strides(shape),
            shape: shape.to_vec(),
            offset: 0,
        }
    }

    /// A layout from its parts (caller guarantees it fits the storage).
    pub fn new(shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Self {
        debug_assert_eq!(shape.len(), strides.len());
        Self {
            shape,
            strides,
            offset,
        }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Elements between neighbours along each axis (0 for broadcast axes).
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Index of the first element in the storage.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Whether elements are row-major and dense (size-1 axes may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            // As `contiguous_strides` counts: a zero-length axis leaves the strides
            // before it as if it had length 1, so a fresh `[2, 0, 3]` is contiguous.
            expected *= d.max(1);
        }
        true
    }

    /// One past the largest storage index this layout touches.
    pub fn storage_extent(&self) -> usize {
        if self.numel() == 0 {
            return self.offset;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(&d, &s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// A view with `shape` (same element count); only contiguous layouts reshape without
    /// a copy, so `None` otherwise.
    pub fn reshape(&self, shape: &[usize]) -> Option<Layout> {
        if numel(shape) != self.numel() || !self.is_contiguous() {
            return None;
        }
        Some(Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: self.offset,
        })
    }

    /// A view with the axes reordered: axis `i` of the result is axis `order[i]`.
    pub fn permute(&self, order: &[usize]) -> Result<Layout> {
        let rank = self.shape.len();
        let mut seen = vec![false; rank];
        if order.len() != rank
            || order
                .iter()
                .any(|&a| a >= rank || std::mem::replace(&mut seen[a], true))
        {
            return Err(TensorError::shape(
                "permute",
                format!(
                    "order {order:?} is not a permutation of the {rank} axes of {:?}",
                    self.shape
                ),
            ));
        }
        Ok(Layout {
            shape: order.iter().map(|&a| self.shape[a]).collect(),
            strides: order.iter().map(|&a| self.strides[a]).collect(),
            offset: self.offset,
        })
    }

    /// A view of `len` elements of `axis` starting at `start`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Layout> {
        let Some(&dim) = self.shape.get(axis) else {
            return Err(TensorError::shape(
                "narrow",
                format!("axis {axis} out of range for shape {:?}", self.shape),
            ));
        };
        if start + len > dim {
            return Err(TensorError::shape(
                "narrow",
                format!(
                    "range {start}..{} exceeds axis {axis} of size {dim} (shape {:?})",
                    start + len,
                    self.shape
                ),
            ));
        }
        let mut shape = self.shape.clone();
        shape[axis] = len;
        Ok(Layout {
            offset: self.offset + start * self.strides[axis],
            strides: self.strides.clone(),
            shape,
        })
    }

    /// A view broadcast to `shape` (NumPy rules: align right, size-1 axes stretch).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Layout> {
        let rank = shape.len();
        let own = self.shape.len();
        let err = || {
            TensorError::shape(
                "broadcast",
                format!("shape {:?} cannot broadcast to {shape:?}", self.shape),
            )
        };
        if own > rank {
            return Err(err());
        }
        let mut strides = vec![0; rank];
        for i in 0..rank {
            if i < rank - own {
                continue;
            }
            let j = i - (rank - own);
            if self.shape[j] == shape[i] {
                strides[i] = self.strides[j];
            } else if self.shape[j] == 1 {
                strides[i] = 0;
            } else {
                return Err(err());
            }
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// Storage index of the first element of row `row`, rows running along the last axis
    /// in row-major order.
    pub fn row_start(&self, mut row: usize) -> usize {
        let mut base = self.offset;
        for axis in (0..self.shape.len().saturating_sub(1)).rev() {
            let d = self.shape[axis];
            base += (row % d) * self.strides[axis];
            row /= d;
        }
        base
    }

    /// Storage index of every element in row-major order, calling `f(i, index)`.
    pub fn for_each_index(&self, mut f: impl FnMut(usize, usize)) {
        let n = self.numel();
        if n == 0 {
            return;
        }
        let rank = self.shape.len();
        if rank == 0 {
            f(0, self.offset);
            return;
        }
        let inner = self.shape[rank - 1];
        let inner_stride = self.strides[rank - 1];
        let mut counter = vec![0usize; rank - 1];
        let mut base = self.offset;
        let mut i = 0;
        loop {
            for e in 0..inner {
                f(i, base + e * inner_stride);
                i += 1;
            }
            // Advance the odometer over the outer axes.
            let mut axis = rank - 1;
            loop {
                if axis == 0 {
                    return;
                }
                axis -= 1;
                counter[axis] += 1;
                base += self.strides[axis];
                if counter[axis] < self.shape[axis] {
                    break;
                }
                base -= self.strides[axis] * self.shape[axis];
                counter[axis] = 0;
            }
        }
    }
}

/// The broadcast shape of two shapes, or an error naming both.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i < rank - a.len() {
            1
        } else {
            a[i - (rank - a.len())]
        };
        let db = if i < rank - b.len() {
            1
        } else {
            b[i - (rank - b.len())]
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(TensorError::shape(
                op,
                format!("shapes {a:?} and {b:?} do not broadcast (axis {i}: {da} vs {db})"),
            ));
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permuted_views_visit_elements_in_their_own_order() {
        let l = Layout::contiguous(&[2, 3]).permute(&[1, 0]).unwrap();
        let mut seen = Vec::new();
        l.for_each_index(|_, idx| seen.push(idx));
        assert_eq!(seen, [0, 3, 1, 4, 2, 5]);
        assert!(!l.is_contiguous());
    }

    #[test]
    fn broadcast_views_repeat_with_zero_strides() {
        let l = Layout::contiguous(&[3]).broadcast_to(&[2, 3]).unwrap();
        assert_eq!(l.strides(), &[0, 1]);
        assert!(Layout::contiguous(&[2]).broadcast_to(&[2, 3]).is_err());
        assert_eq!(
            broadcast_shapes("add", &[4, 1, 3], &[5, 1]).unwrap(),
            [4, 5, 3]
        );
        assert!(broadcast_shapes("add", &[2, 3], &[4, 3]).is_err());
    }

    #[test]
    fn narrow_moves_the_offset_and_checks_the_range() {
        let l = Layout::contiguous(&[4, 5]).narrow(0, 1, 2).unwrap();
        assert_eq!((l.offset(), l.shape()), (5, &[2usize, 5][..]));
        assert!(l.is_contiguous());
        assert!(Layout::contiguous(&[4, 5]).narrow(1, 3, 3).is_err());
        let l = Layout::contiguous(&[4, 5]).narrow(1, 1, 2).unwrap();
        assert!(!l.is_contiguous());
        assert_eq!(l.storage_extent(), 1 + 3 * 5 + 1 + 1);
    }

    #[test]
    fn a_fresh_layout_with_a_zero_length_axis_is_contiguous() {
        // Found through fuzz/fuzz_targets/camera.rs: a `.npy` of shape (3, 4, 0, …) made a
        // tensor whose f32 copy asserted its own fresh output was contiguous.
        for shape in [&[2, 0, 3][..], &[0, 5], &[4, 0], &[3, 4, 0, 0, 500, 41]] {
            assert!(Layout::contiguous(shape).is_contiguous(), "{shape:?}");
        }
    }
}
