//! Layout kernels of the Wan VAE: nearest ×2 upsampling, pixel (un)shuffle, N-d padding
//! and concatenation.
//!
//! Every tensor is a contiguous row-major f32 slice whose shape the caller passes
//! alongside. The kernels only move values (no arithmetic), so their results are exact
//! and identical for every thread count. Each one is parallelised over output rows (the
//! last axis), the unit at which reads and writes stay contiguous; rows are grouped
//! into tasks of at least [`MIN_TASK_FLOATS`] floats so that small tensors do not pay
//! for more task overhead than copying.

use rayon::prelude::*;

use crate::parallel;

/// Fewest output floats one parallel task handles (less costs more to schedule than to copy).
pub const MIN_TASK_FLOATS: usize = 16 * 1024;

/// Rows of `row_len` floats per task so that a task moves at least [`MIN_TASK_FLOATS`].
fn min_rows(row_len: usize) -> usize {
    MIN_TASK_FLOATS.div_ceil(row_len.max(1))
}

/// Nearest ×2 upsampling of `planes` planes `[h, w]` to `[2h, 2w]`: `out[i][j] = in[i/2][j/2]`.
///
/// This is PyTorch's `Upsample(scale_factor=2)` in both `"nearest"` and `"nearest-exact"`
/// mode, which agree at an integer factor of 2.
pub fn upsample_nearest2x(input: &[f32], out: &mut [f32], planes: usize, h: usize, w: usize) {
    assert_eq!(
        input.len(),
        planes * h * w,
        "upsample_nearest2x: input length"
    );
    assert_eq!(
        out.len(),
        4 * planes * h * w,
        "upsample_nearest2x: output length"
    );
    if out.is_empty() {
        return;
    }
    parallel::run(|| {
        // One task unit = the two output rows made from one input row.
        out.par_chunks_mut(4 * w)
            .zip(input.par_chunks(w))
            .with_min_len(min_rows(4 * w))
            .for_each(|(pair, src)| {
                let (first, second) = pair.split_at_mut(2 * w);
                for (d, &v) in first.chunks_exact_mut(2).zip(src) {
                    d[0] = v;
                    d[1] = v;
                }
                second.copy_from_slice(first);
            });
    });
}

/// Shape of a pixel (un)shuffle: `[B, C·r², H, W]` (unshuffled) ↔ `[B, C, H·r, W·r]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShuffleParams {
    /// Batch size.
    pub batch: usize,
    /// Channels of the shuffled (high-resolution) side, `C`.
    pub channels: usize,
    /// Height of the unshuffled (low-resolution) side, `H`.
    pub h: usize,
    /// Width of the unshuffled (low-resolution) side, `W`.
    pub w: usize,
    /// The factor `r`.
    pub factor: usize,
}

impl ShuffleParams {
    /// Number of elements on either side, `B·C·r²·H·W`.
    pub fn len(&self) -> usize {
        self.batch * self.channels * self.factor * self.factor * self.h * self.w
    }

    /// True when either side has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `F.pixel_shuffle`, `[B, C·r², H, W]` → `[B, C, H·r, W·r]`.
///
/// `out[b, c, y·r + i, x·r + j] = in[b, c·r² + i·r + j, y, x]`.
pub fn pixel_shuffle(p: &ShuffleParams, input: &[f32], out: &mut [f32]) {
    assert_eq!(input.len(), p.len(), "pixel_shuffle: input length");
    assert_eq!(out.len(), p.len(), "pixel_shuffle: output length");
    if out.is_empty() {
        return;
    }
    let (r, h, w) = (p.factor, p.h, p.w);
    let plane = h * w;
    parallel::run(|| {
        // Output row (b, c, y·r + i) reads row y of input planes (b, c·r² + i·r + j), j < r.
        out.par_chunks_mut(w * r)
            .enumerate()
            .with_min_len(min_rows(w * r))
            .for_each(|(row, dst)| {
                let (bc, yy) = (row / (h * r), row % (h * r));
                let (y, i) = (yy / r, yy % r);
                for j in 0..r {
                    let start = (bc * r * r + i * r + j) * plane + y * w;
                    let src = &input[start..start + w];
                    for (d, &v) in dst[j..].iter_mut().step_by(r).zip(src) {
                        *d = v;
                    }
                }
            });
    });
}

/// `F.pixel_unshuffle`, `[B, C, H·r, W·r]` → `[B, C·r², H, W]`.
///
/// `out[b, c·r² + i·r + j, y, x] = in[b, c, y·r + i, x·r + j]`.
pub fn pixel_unshuffle(p: &ShuffleParams, input: &[f32], out: &mut [f32]) {
    assert_eq!(input.len(), p.len(), "pixel_unshuffle: input length");
    assert_eq!(out.len(), p.len(), "pixel_unshuffle: output length");
    if out.is_empty() {
        return;
    }
    let (r, h, w) = (p.factor, p.h, p.w);
    parallel::run(|| {
        // Output row (b, c·r² + i·r + j, y) takes every r-th value of input row
        // (b, c, y·r + i), starting at j.
        out.par_chunks_mut(w)
            .enumerate()
            .with_min_len(min_rows(w))
            .for_each(|(row, dst)| {
                let (plane, y) = (row / h, row % h);
                let (bc, sub) = (plane / (r * r), plane % (r * r));
                let (i, j) = (sub / r, sub % r);
                let start = (bc * h * r + y * r + i) * w * r;
                let src = &input[start..start + w * r];
                for (d, &v) in dst.iter_mut().zip(src[j..].iter().step_by(r)) {
                    *d = v;
                }
            });
    });
}

/// What padding holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PadMode {
    /// Zeros (`F.pad(mode="constant", value=0)`).
    Zeros,
    /// The nearest edge value (`F.pad(mode="replicate")`).
    Replicate,
}

/// Output shape of [`pad`]: `in_shape[d] + before + after` per axis.
pub fn padded_len(in_shape: &[usize], pads: &[(usize, usize)]) -> usize {
    in_shape
        .iter()
        .zip(pads)
        .map(|(&n, &(before, after))| n + before + after)
        .product()
}

/// N-d padding like `F.pad`: `input` (shape `in_shape`) grows by `pads[d] = (before, after)`.
///
/// `pads` lists every axis in axis order, not `F.pad`'s last-axis-first order.
pub fn pad(
    input: &[f32],
    in_shape: &[usize],
    pads: &[(usize, usize)],
    mode: PadMode,
    out: &mut [f32],
) {
    assert_eq!(
        pads.len(),
        in_shape.len(),
        "pad: one (before, after) per axis"
    );
    assert_eq!(
        input.len(),
        in_shape.iter().product::<usize>(),
        "pad: input length"
    );
    assert_eq!(out.len(), padded_len(in_shape, pads), "pad: output length");
    if out.is_empty() {
        return;
    }
    if input.is_empty() {
        // Replicate has nothing to copy from; PyTorch rejects this, the op layer does too.
        debug_assert!(
            mode == PadMode::Zeros,
            "replicate padding of an empty tensor"
        );
        out.fill(0.0);
        return;
    }
    let (Some((&in_w, outer)), Some((&(left, right), outer_pads))) =
        (in_shape.split_last(), pads.split_last())
    else {
        out.copy_from_slice(input); // a scalar: nothing to pad
        return;
    };
    let out_w = in_w + left + right;
    parallel::run(|| {
        out.par_chunks_mut(out_w)
            .enumerate()
            .with_min_len(min_rows(out_w))
            .for_each(|(row, dst)| {
                let Some(src_row) = source_row(row, outer, outer_pads, mode) else {
                    dst.fill(0.0);
                    return;
                };
                let src = &input[src_row * in_w..(src_row + 1) * in_w];
                let (head, rest) = dst.split_at_mut(left);
                let (body, tail) = rest.split_at_mut(in_w);
                body.copy_from_slice(src);
                match mode {
                    PadMode::Zeros => {
                        head.fill(0.0);
                        tail.fill(0.0);
                    }
                    PadMode::Replicate => {
                        head.fill(src[0]);
                        tail.fill(src[in_w - 1]);
                    }
                }
            });
    });
}

/// The input row (over all axes but the last) that output row `row` copies, or None for a zero row.
fn source_row(
    row: usize,
    in_outer: &[usize],
    pads: &[(usize, usize)],
    mode: PadMode,
) -> Option<usize> {
    let mut rem = row;
    let mut src = 0;
    let mut stride = 1;
    // Peel coordinates from the innermost outer axis outwards.
    for (&n, &(before, after)) in in_outer.iter().zip(pads).rev() {
        let out_n = n + before + after;
        let coord = rem % out_n;
        rem /= out_n;
        let in_coord = match coord.checked_sub(before) {
            Some(c) if c < n => c,
            _ if mode == PadMode::Zeros => return None,
            Some(_) => n - 1,
            None => 0,
        };
        src += in_coord * stride;
        stride *= n;
    }
    Some(src)
}

/// Concatenates contiguous tensors `(data, shape)` along `axis` into `out` (all other dims equal).
pub fn concat(inputs: &[(&[f32], &[usize])], axis: usize, out: &mut [f32]) {
    let Some(&(_, first_shape)) = inputs.first() else {
        assert!(out.is_empty(), "concat: output length");
        return;
    };
    debug_assert!(axis < first_shape.len(), "concat axis out of range");
    debug_assert!(
        inputs.iter().all(|(_, s)| s.len() == first_shape.len()
            && s.iter()
                .zip(first_shape)
                .enumerate()
                .all(|(d, (a, b))| d == axis || a == b)),
        "concat: shapes differ off the axis"
    );
    let outer: usize = first_shape[..axis].iter().product();
    let inner: usize = first_shape[axis + 1..].iter().product();
    let mut out_row = 0;
    for &(data, shape) in inputs {
        // Each input is [outer, shape[axis]·inner]; check it really is, before slicing it so.
        assert_eq!(
            data.len(),
            outer * shape[axis] * inner,
            "concat: input length"
        );
        out_row += shape[axis] * inner;
    }
    assert_eq!(out.len(), outer * out_row, "concat: output length");
    if out.is_empty() {
        return;
    }
    parallel::run(|| {
        out.par_chunks_mut(out_row)
            .enumerate()
            .with_min_len(min_rows(out_row))
            .for_each(|(o, dst)| {
                let mut at = 0;
                for &(data, shape) in inputs {
                    let n = shape[axis] * inner;
                    dst[at..at + n].copy_from_slice(&data[o * n..(o + 1) * n]);
                    at += n;
                }
            });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::test_rng::random;

    #[test]
    fn upsample_nearest2x_duplicates_every_pixel_into_a_2x2_block() {
        for (planes, h, w) in [(3, 5, 7), (1, 1, 1), (4, 64, 130), (0, 3, 3)] {
            let input = random(planes * h * w, 7);
            let mut out = vec![f32::NAN; 4 * planes * h * w];
            upsample_nearest2x(&input, &mut out, planes, h, w);
            for pl in 0..planes {
                for i in 0..2 * h {
                    for j in 0..2 * w {
                        let want = input[(pl * h + i / 2) * w + j / 2];
                        assert_eq!(out[(pl * 2 * h + i) * 2 * w + j], want);
                    }
                }
            }
        }
    }

    fn shuffle_cases() -> Vec<ShuffleParams> {
        let p = |batch, channels, h, w, factor| ShuffleParams {
            batch,
            channels,
            h,
            w,
            factor,
        };
        vec![
            p(2, 3, 5, 7, 2),
            p(1, 6, 3, 4, 8),
            p(1, 2, 40, 60, 2),
            p(2, 1, 3, 2, 1),
        ]
    }

    #[test]
    fn pixel_shuffle_matches_torch_element_order() {
        for p in shuffle_cases() {
            let (c, r, h, w) = (p.channels, p.factor, p.h, p.w);
            let input = random(p.len(), 11);
            let mut out = vec![f32::NAN; p.len()];
            pixel_shuffle(&p, &input, &mut out);
            for b in 0..p.batch {
                for ci in 0..c * r * r {
                    for y in 0..h {
                        for x in 0..w {
                            let (co, i, j) = (ci / (r * r), (ci % (r * r)) / r, ci % r);
                            let src = ((b * c * r * r + ci) * h + y) * w + x;
                            let dst = ((b * c + co) * h * r + y * r + i) * w * r + x * r + j;
                            assert_eq!(out[dst], input[src]);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn pixel_unshuffle_matches_torch_element_order() {
        for p in shuffle_cases() {
            let (c, r, h, w) = (p.channels, p.factor, p.h, p.w);
            let input = random(p.len(), 13);
            let mut out = vec![f32::NAN; p.len()];
            pixel_unshuffle(&p, &input, &mut out);
            for b in 0..p.batch {
                for co in 0..c {
                    for yy in 0..h * r {
                        for xx in 0..w * r {
                            let (y, i, x, j) = (yy / r, yy % r, xx / r, xx % r);
                            let src = ((b * c + co) * h * r + yy) * w * r + xx;
                            let dst = ((b * c * r * r + co * r * r + i * r + j) * h + y) * w + x;
                            assert_eq!(out[dst], input[src]);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn pixel_shuffle_after_pixel_unshuffle_is_the_identity() {
        for p in shuffle_cases() {
            let input = random(p.len(), 17);
            let mut low = vec![0.0; p.len()];
            let mut back = vec![0.0; p.len()];
            pixel_unshuffle(&p, &input, &mut low);
            pixel_shuffle(&p, &low, &mut back);
            assert_eq!(back, input);
            pixel_shuffle(&p, &input, &mut low);
            pixel_unshuffle(&p, &low, &mut back);
            assert_eq!(back, input);
        }
    }

    /// Straightforward N-d padding: walk every output index and map it back.
    fn reference_pad(
        input: &[f32],
        shape: &[usize],
        pads: &[(usize, usize)],
        mode: PadMode,
    ) -> Vec<f32> {
        let out_shape: Vec<usize> = shape
            .iter()
            .zip(pads)
            .map(|(&n, &(b, a))| n + b + a)
            .collect();
        let total: usize = out_shape.iter().product();
        (0..total)
            .map(|flat| {
                let mut rem = flat;
                let mut src = 0;
                let mut stride = 1;
                for d in (0..shape.len()).rev() {
                    let coord = (rem % out_shape[d]) as isize - pads[d].0 as isize;
                    rem /= out_shape[d];
                    let n = shape[d] as isize;
                    let c = match mode {
                        PadMode::Zeros if coord < 0 || coord >= n => return 0.0,
                        PadMode::Zeros => coord,
                        PadMode::Replicate => coord.clamp(0, n - 1),
                    };
                    src += c as usize * stride;
                    stride *= shape[d];
                }
                input[src]
            })
            .collect()
    }

    #[test]
    fn pad_matches_reference_for_zeros_and_replicate_in_every_axis() {
        type Pads<'a> = &'a [(usize, usize)];
        let cases: [(&[usize], Pads); 6] = [
            (&[2, 3, 4, 5, 7], &[(0, 0), (0, 0), (2, 0), (1, 1), (1, 1)]),
            (&[3, 5, 7], &[(0, 0), (0, 1), (0, 1)]),
            (&[2, 4, 6], &[(1, 2), (3, 0), (0, 4)]),
            (&[9], &[(2, 3)]),
            (&[2, 3], &[(0, 0), (0, 0)]),
            (&[1, 70, 300], &[(1, 1), (2, 2), (5, 5)]),
        ];
        for (shape, pads) in cases {
            let input = random(shape.iter().product(), 19);
            for mode in [PadMode::Zeros, PadMode::Replicate] {
                let mut out = vec![f32::NAN; padded_len(shape, pads)];
                pad(&input, shape, pads, mode, &mut out);
                assert_eq!(
                    out,
                    reference_pad(&input, shape, pads, mode),
                    "{shape:?} {pads:?} {mode:?}"
                );
            }
        }
    }

    #[test]
    fn pad_of_a_scalar_copies_it_and_an_empty_axis_pads_with_zeros() {
        let mut out = [0.0];
        pad(&[3.5], &[], &[], PadMode::Replicate, &mut out);
        assert_eq!(out, [3.5]);
        let mut out = vec![f32::NAN; 2 * 4];
        pad(&[], &[2, 0], &[(0, 0), (1, 3)], PadMode::Zeros, &mut out);
        assert!(out.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn concat_matches_reference_on_every_axis() {
        let shapes = [[2usize, 3, 4, 5], [2, 1, 4, 5], [2, 3, 0, 5], [2, 2, 4, 5]];
        for axis in 0..4 {
            let parts: Vec<(Vec<f32>, Vec<usize>)> = shapes
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    // Same shape as the first off the axis, the listed extent on it.
                    let mut shape = shapes[0].to_vec();
                    shape[axis] = s[axis];
                    (random(shape.iter().product(), 23 + i as u64), shape)
                })
                .collect();
            let views: Vec<(&[f32], &[usize])> = parts
                .iter()
                .map(|(d, s)| (d.as_slice(), s.as_slice()))
                .collect();
            let total: usize = parts.iter().map(|(d, _)| d.len()).sum();
            let mut out = vec![f32::NAN; total];
            concat(&views, axis, &mut out);
            // Reference: walk the output index and find which part it falls in.
            let mut out_shape = shapes[0].to_vec();
            out_shape[axis] = parts.iter().map(|(_, s)| s[axis]).sum();
            for (flat, &got) in out.iter().enumerate() {
                let mut idx = [0usize; 4];
                let mut rem = flat;
                for d in (0..4).rev() {
                    idx[d] = rem % out_shape[d];
                    rem /= out_shape[d];
                }
                let mut a = idx[axis];
                let (data, shape) = parts
                    .iter()
                    .find(|(_, s)| {
                        if a < s[axis] {
                            true
                        } else {
                            a -= s[axis];
                            false
                        }
                    })
                    .expect("index inside some part");
                idx[axis] = a;
                let src = ((idx[0] * shape[1] + idx[1]) * shape[2] + idx[2]) * shape[3] + idx[3];
                assert_eq!(got, data[src]);
            }
        }
    }

    #[test]
    fn concat_of_large_frames_along_time_keeps_order() {
        // [B=1, C=8, T, 32, 64] chunks concatenated along T, as the decoder's streaming does.
        let a = random(8 * 2 * 32 * 64, 29);
        let b = random(8 * 3 * 32 * 64, 31);
        let mut out = vec![0.0; a.len() + b.len()];
        concat(
            &[(&a, &[1, 8, 2, 32, 64]), (&b, &[1, 8, 3, 32, 64])],
            2,
            &mut out,
        );
        let frame = 32 * 64;
        for c in 0..8 {
            let row = &out[c * 5 * frame..(c + 1) * 5 * frame];
            assert_eq!(&row[..2 * frame], &a[c * 2 * frame..(c + 1) * 2 * frame]);
            assert_eq!(&row[2 * frame..], &b[c * 3 * frame..(c + 1) * 3 * frame]);
        }
    }
}
