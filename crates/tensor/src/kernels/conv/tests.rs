//! conv3d / conv2d against a direct f64 reference, and the tiling's invariants.

use super::job::Job;
use super::*;

use crate::kernels::gemm::Compute;
use crate::kernels::test_rng::random;

/// Splits a flat index into coordinates of `dims` (row-major).
fn unflatten<const N: usize>(mut i: usize, dims: [usize; N]) -> [usize; N] {
    let mut out = [0; N];
    for d in (0..N).rev() {
        (out[d], i) = (i % dims[d], i / dims[d]);
    }
    out
}

/// Direct f64 convolution: a valid strided convolution over the explicitly padded
/// input (time in front, h and w on both sides), one output element at a time.
fn reference(p: &Conv3dParams, x: &[f32], w: &[f32], bias: Option<&[f32]>) -> Vec<f64> {
    let (ci_n, [kt, kh, kw], [st, sh, sw]) = (p.in_channels, p.kernel, p.stride);
    let padded = |b: usize, c: usize, t: usize, y: usize, x_: usize| -> f64 {
        let t = match t.checked_sub(p.pad_t_front) {
            Some(t) => t,
            None if p.time_pad == TimePad::Replicate => 0,
            None => return 0.0,
        };
        match (y.checked_sub(p.pad_h), x_.checked_sub(p.pad_w)) {
            (Some(y), Some(x_)) if y < p.in_h && x_ < p.in_w => {
                f64::from(x[(((b * ci_n + c) * p.in_t + t) * p.in_h + y) * p.in_w + x_])
            }
            _ => 0.0,
        }
    };
    let [to, ho, wo] = p.out_dims();
    let taps = [ci_n, kt, kh, kw];
    (0..p.out_len())
        .map(|i| {
            let [b, co, t, y, x_] = unflatten(i, [p.batch, p.out_channels, to, ho, wo]);
            let mut acc = bias.map_or(0.0, |bias| f64::from(bias[co]));
            for j in 0..taps.iter().product() {
                let [c, dt, dy, dx] = unflatten(j, taps);
                let v = padded(b, c, t * st + dt, y * sh + dy, x_ * sw + dx);
                acc += f64::from(w[co * taps.iter().product::<usize>() + j]) * v;
            }
            acc
        })
        .collect()
}

/// Checks `got` against the reference within 1e-4 · (1 + max |ref|).
fn assert_close(got: &[f32], want: &[f64], what: &str) {
    let max_ref = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(want)
        .fold(0f64, |m, (&g, &w)| m.max((f64::from(g) - w).abs()));
    assert!(
        err <= 1e-4 * (1.0 + max_ref),
        "{what}: err {err}, max |ref| {max_ref}"
    );
}

/// Runs conv3d with the given scratch target on both f32 routes (planes where the path
/// has them, and im2col) and checks each against the reference.
fn check(p: &Conv3dParams, with_bias: bool, target: usize) {
    let input = random(p.in_len(), 1 + p.in_len() as u64);
    let weight = random(p.weight_len(), 2 + p.weight_len() as u64);
    let bias = random(p.out_channels, 3);
    let bias = with_bias.then_some(bias.as_slice());
    let want = reference(p, &input, &weight, bias);
    for f32_planes in [false, true] {
        let mut out = vec![f32::NAN; p.out_len()];
        let route = Route { target, f32_planes };
        let mut scratch = vec![f32::NAN; scratch_len_for_route(p, route, parallel::num_threads())];
        conv3d_routed(p, &input, &weight, bias, &mut out, &mut scratch, route);
        assert_close(
            &out,
            &want,
            &format!("{p:?} bias {with_bias} f32 planes {f32_planes}"),
        );
    }
}

/// A small conv: batch 2, 3 → 4 channels, 5 frames of 5×7.
fn small(kernel: [usize; 3], stride: [usize; 3], pad: [usize; 3], tp: TimePad) -> Conv3dParams {
    let [pad_t_front, pad_h, pad_w] = pad;
    Conv3dParams {
        batch: 2,
        in_channels: 3,
        out_channels: 4,
        in_t: 5,
        in_h: 5,
        in_w: 7,
        kernel,
        stride,
        pad_t_front,
        time_pad: tp,
        pad_h,
        pad_w,
        compute: Compute::F32,
    }
}

#[test]
fn amx_packed_im2col_gives_the_bytes_of_cols_then_gemm() {
    if !cpu::selected().packs_bf16() {
        eprintln!("skipped: no packed bf16 path (amx, avx512bf16) is selected here");
        return;
    }
    // K = 3·27 = 81 (a K tail), 40 output channels (an M tail), tiles of odd widths.
    for compute in [Compute::Bf16, Compute::NearF32] {
        let p = Conv3dParams {
            in_channels: 3,
            out_channels: 40,
            compute,
            ..small([3, 3, 3], [1, 1, 1], [2, 1, 1], TimePad::Replicate)
        };
        let input = random(p.in_len(), 5);
        let weight = random(p.weight_len(), 6);
        let geom = Geometry::new(&p, p.in_t);
        let [to, ho, wo] = p.out_dims();
        let job = Job {
            params: p,
            skip: 0,
            bias_only: false,
            first: 0,
            count: to * ho * wo,
            dst0: 0,
            f32_planes: false,
        };
        let run = |amx: bool| {
            let mut plan = Plan::new(&p, job.count, 700, 2);
            assert!(plan.amx.is_some());
            if !amx {
                let generic = Plan {
                    amx: None,
                    shared: 0,
                    per_slot: (p.patch_len() + p.out_channels) * plan.tile
                        + gemm_scratch_len(
                            p.out_channels,
                            plan.tile,
                            p.patch_len(),
                            compute,
                            Threads::One,
                        ),
                    ..plan
                };
                plan = generic;
            }
            let mut out = vec![f32::NAN; p.out_len() / p.batch];
            let mut scratch = vec![f32::NAN; plan.shared + plan.slots * plan.per_slot];
            let src = &input[..p.in_len() / p.batch];
            parallel::run(|| {
                tiled(
                    &geom,
                    &plan,
                    &job,
                    src,
                    &weight,
                    None,
                    &mut out,
                    &mut scratch,
                )
            });
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(run(true), run(false), "{compute:?}");
    }
}

#[test]
fn frames_on_zero_time_padding_run_as_their_own_jobs_without_the_zero_taps() {
    // kt = 3 over 2 zero frames: frame 0 keeps tap 2, frame 1 taps 1..3, the rest all.
    let p = small([3, 3, 3], [1, 1, 1], [2, 1, 1], TimePad::Zeros);
    let frame = 5 * 7;
    let got: Vec<_> = jobs(&p, f32_on_planes())
        .iter()
        .map(|j| {
            (
                j.params.kernel[0],
                j.params.in_t,
                j.skip,
                j.bias_only,
                j.first,
                j.count,
                j.dst0,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, 1, 2, false, 0, frame, 0),
            (2, 2, 1, false, 0, frame, frame),
            (3, 5, 0, false, 2 * frame, 3 * frame, 2 * frame),
        ]
    );
    // A 1-frame kernel over 2 zero frames: those frames are the bias alone.
    let p = small([1, 3, 3], [1, 1, 1], [2, 1, 1], TimePad::Zeros);
    let heads: Vec<_> = jobs(&p, f32_on_planes())
        .iter()
        .map(|j| (j.bias_only, j.dst0))
        .collect();
    assert_eq!(heads, [(true, 0), (true, frame), (false, 2 * frame)]);
    // Replicated frames are real values: one job.
    let p = small([3, 3, 3], [1, 1, 1], [2, 1, 1], TimePad::Replicate);
    assert_eq!(jobs(&p, f32_on_planes()).len(), 1);
    // The gathered taps are the weight's last time taps.
    let p = small([3, 1, 2], [1, 1, 1], [2, 0, 0], TimePad::Zeros);
    let weight: Vec<f32> = (0..p.weight_len()).map(|i| i as f32).collect();
    let mut taps = vec![0.0; p.weight_len() / 3];
    gather_taps(&weight, &p, 2, &mut taps);
    assert_eq!(&taps[..4], &[4.0, 5.0, 10.0, 11.0]);
}

#[test]
fn out_dims_follow_the_strided_padded_formula() {
    let p = small([3, 3, 3], [2, 2, 1], [2, 1, 0], TimePad::Zeros);
    assert_eq!(p.out_dims(), [3, 3, 5]);
    assert_eq!(p.out_len(), 2 * 4 * 3 * 3 * 5);
    assert_eq!(p.in_len(), 2 * 3 * 5 * 5 * 7);
    assert_eq!(p.weight_len(), 4 * 3 * 27);
}

/// Checks a small conv with both time pads at the default scratch target.
fn check_small(kernel: [usize; 3], stride: [usize; 3], pad: [usize; 3], with_bias: bool) {
    for time_pad in [TimePad::Zeros, TimePad::Replicate] {
        let p = small(kernel, stride, pad, time_pad);
        check(&p, with_bias, CONV_SCRATCH_TARGET);
    }
}

#[test]
fn causal_3x3x3_conv_matches_reference_with_both_time_pads() {
    check_small([3, 3, 3], [1, 1, 1], [2, 1, 1], true);
    check_small([3, 3, 3], [1, 1, 1], [2, 1, 1], false);
}

#[test]
fn stride_two_in_each_axis_matches_reference() {
    for stride in [[2, 1, 1], [1, 2, 1], [1, 1, 2], [2, 2, 2]] {
        for pad in [[0, 0, 0], [2, 1, 1], [1, 0, 1]] {
            check_small([3, 3, 3], stride, pad, true);
        }
    }
}

#[test]
fn kernel_shapes_of_the_vae_match_reference_with_and_without_padding() {
    let kernels = [[1, 1, 1], [3, 1, 1], [1, 3, 3], [3, 3, 3], [2, 2, 3]];
    for (kernel, pad) in kernels
        .into_iter()
        .flat_map(|k| [(k, [0, 0, 0]), (k, [2, 1, 1])])
    {
        check_small(kernel, [1, 1, 1], pad, true);
        check_small(kernel, [2, 1, 2], pad, false);
    }
    check_small([3, 1, 1], [1, 1, 1], [2, 0, 0], true);
    check_small([1, 3, 3], [1, 1, 1], [0, 1, 1], true);
}

#[test]
fn pointwise_conv_needs_no_im2col_scratch_and_matches_reference() {
    let p = small([1, 1, 1], [1, 1, 1], [0, 0, 0], TimePad::Zeros);
    let [to, ho, wo] = p.out_dims();
    let packing = gemm_scratch_len(4, to * ho * wo, 3, p.compute, Threads::Pool);
    assert_eq!(conv3d_scratch_len(&p), packing);
    check(&p, true, 0);
    check(&p, false, 0);
}

#[test]
fn tiles_smaller_than_the_image_match_reference() {
    let p = small([3, 3, 3], [1, 1, 1], [2, 1, 1], TimePad::Replicate);
    let per_pixel = p.patch_len() + p.out_channels;
    // Targets of 1 pixel (clamped to one 7-pixel row) up to 40 pixels: tiles that end
    // mid-row, span rows and span frames.
    for pixels in [1, 3, 9, 11, 40] {
        check(&p, true, pixels * per_pixel);
    }
    let strided = small([3, 3, 3], [2, 2, 2], [2, 1, 1], TimePad::Zeros);
    check(&strided, true, strided.patch_len() + strided.out_channels);
}

#[test]
fn scratch_stays_under_the_target_per_slot_for_large_images() {
    let slots = parallel::num_threads();
    let mut p = small([3, 3, 3], [1, 1, 1], [2, 1, 1], TimePad::Zeros);
    (p.in_channels, p.out_channels, p.in_t, p.in_h, p.in_w) = (96, 96, 5, 720, 1280);
    // Beyond the im2col target, each slot holds only its GEMM's packing buffers; the
    // head frames' gathered taps (two of three time taps at most) come once in front.
    let packing = |p: &Conv3dParams| {
        let [to, ho, wo] = p.out_dims();
        let tile = Plan::new(p, to * ho * wo, CONV_SCRATCH_TARGET, slots).tile;
        gemm_scratch_len(p.out_channels, tile, p.patch_len(), p.compute, Threads::One)
    };
    let taps = head_weight_len(&jobs(&p, f32_on_planes()));
    assert_eq!(taps, p.weight_len() * 2 / 3);
    assert!(conv3d_scratch_len(&p) <= taps + slots * (CONV_SCRATCH_TARGET + packing(&p)));
    // A row that alone exceeds the target may take up to one row per slot (tiles
    // are evened out over the slots, so slightly less with some thread counts).
    (p.in_channels, p.in_h, p.in_w) = (384, 8, 4000);
    let row = (p.patch_len() + p.out_channels) * 4000;
    let len = conv3d_scratch_len(&p) - head_weight_len(&jobs(&p, f32_on_planes()));
    assert!(slots * CONV_SCRATCH_TARGET < len && len <= slots * (row + packing(&p)));
}

#[test]
fn conv3d_is_bitwise_deterministic() {
    let mut p = small([3, 3, 3], [1, 1, 1], [2, 1, 1], TimePad::Zeros);
    (p.in_channels, p.out_channels, p.in_h, p.in_w) = (16, 24, 33, 47);
    let (input, weight, bias) = (
        random(p.in_len(), 5),
        random(p.weight_len(), 6),
        random(24, 7),
    );
    let run = || {
        let mut out = vec![0f32; p.out_len()];
        let mut scratch = vec![0f32; conv3d_scratch_len(&p)];
        conv3d(&p, &input, &weight, Some(&bias), &mut out, &mut scratch);
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
}

#[test]
fn conv2d_matches_reference_for_padding_and_stride() {
    for (kernel, stride, pad) in [
        ([3, 3], [1, 1], 1),
        ([3, 3], [2, 2], 0),
        ([1, 1], [1, 1], 0),
    ] {
        let p2 = Conv2dParams {
            batch: 2,
            in_channels: 5,
            out_channels: 3,
            in_h: 9,
            in_w: 7,
            kernel,
            stride,
            pad_h: pad,
            pad_w: pad,
            compute: Compute::F32,
        };
        let p = p2.to_3d();
        assert_eq!(
            (conv2d_scratch_len(&p2), p2.out_len()),
            (conv3d_scratch_len(&p), p.out_len())
        );
        let (input, weight, bias) = (
            random(p2.in_len(), 8),
            random(p2.weight_len(), 9),
            random(3, 10),
        );
        let mut out = vec![f32::NAN; p2.out_len()];
        let mut scratch = vec![f32::NAN; conv2d_scratch_len(&p2)];
        conv2d(&p2, &input, &weight, Some(&bias), &mut out, &mut scratch);
        assert_close(
            &out,
            &reference(&p, &input, &weight, Some(&bias)),
            &format!("{p2:?}"),
        );
    }
}

/// Convs on planes (bf16 on the avx512bf16 path, f32 on any AVX-512 path) against the f64
/// reference (over the bf16-rounded operands for bf16): K and M tails (3 and 40
/// channels), odd widths, head frames on zero time padding beside the main job, batches
/// of 2, and bands of 1 row up to the whole frame, which all give the same bytes.
#[test]
fn planes_match_the_reference_for_every_band_height() {
    let round = |v: &[f32]| -> Vec<f32> {
        v.iter()
            .map(|&x| f32::from_bits(u32::from(cpu::pack::bf16_bits(x)) << 16))
            .collect()
    };
    let mut ran = 0;
    for compute in [Compute::Bf16, Compute::F32] {
        for (cin, cout, kernel, pad, w) in [
            (3, 40, [3, 3, 3], [2, 1, 1], 7),
            (40, 33, [3, 3, 3], [2, 1, 1], 33),
            (32, 32, [1, 3, 3], [0, 1, 1], 19),
            (17, 8, [3, 1, 1], [2, 0, 0], 5),
        ] {
            let mut p = small(kernel, [1, 1, 1], pad, TimePad::Zeros);
            (p.in_channels, p.out_channels, p.in_w, p.compute) = (cin, cout, w, compute);
            // Planes for f32 too, whatever this CPU's default route (`f32_on_planes`).
            if !jobs(&p, true).iter().any(planes::eligible) {
                eprintln!("skipped {compute:?}: no planes kernel on this path");
                continue;
            }
            ran += 1;
            let input = random(p.in_len(), 11);
            let weight = random(p.weight_len(), 12);
            let bias = random(cout, 13);
            let want = match compute {
                Compute::Bf16 => reference(&p, &round(&input), &round(&weight), Some(&bias)),
                _ => reference(&p, &input, &weight, Some(&bias)),
            };
            let mut bytes = Vec::new();
            for target in [1, 2_000, 40_000, CONV_SCRATCH_TARGET] {
                let mut out = vec![f32::NAN; p.out_len()];
                let slots = parallel::num_threads();
                let route = Route {
                    target,
                    f32_planes: true,
                };
                let mut scratch = vec![f32::NAN; scratch_len_for_route(&p, route, slots)];
                conv3d_routed(
                    &p,
                    &input,
                    &weight,
                    Some(&bias),
                    &mut out,
                    &mut scratch,
                    route,
                );
                assert_close(&out, &want, &format!("{p:?} target {target}"));
                bytes.push(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            }
            assert!(
                bytes.windows(2).all(|w| w[0] == w[1]),
                "{p:?}: bands change the bytes"
            );
        }
    }
    eprintln!("{ran} shapes ran on planes");
}
