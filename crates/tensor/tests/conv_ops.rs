//! Convolution ops against a direct f64 convolution.

mod common;

use common::{assert_close, cpu, rand, Rng};
use headroom_tensor::ops::conv::{Conv3dOptions, TimePad};
use headroom_tensor::{DType, Device};

/// Direct 3-D convolution with causal front padding (zeros or replicate) and symmetric
/// spatial zero padding.
#[allow(clippy::too_many_arguments)]
fn reference(
    x: &[f64],
    [b, cin, t, h, w]: [usize; 5],
    wt: &[f64],
    [cout, kt, kh, kw]: [usize; 4],
    bias: Option<&[f64]>,
    stride: [usize; 3],
    pad_t: usize,
    replicate: bool,
    [ph, pw]: [usize; 2],
) -> (Vec<f64>, [usize; 3]) {
    let to = (t + pad_t - kt) / stride[0] + 1;
    let ho = (h + 2 * ph - kh) / stride[1] + 1;
    let wo = (w + 2 * pw - kw) / stride[2] + 1;
    let mut out = Vec::new();
    for bi in 0..b {
        for co in 0..cout {
            for ot in 0..to {
                for oh in 0..ho {
                    for ow in 0..wo {
                        let mut acc = bias.map_or(0.0, |bb| bb[co]);
                        for ci in 0..cin {
                            for a in 0..kt {
                                let ti = (ot * stride[0] + a) as isize - pad_t as isize;
                                let ti = if ti < 0 {
                                    if replicate {
                                        0
                                    } else {
                                        continue;
                                    }
                                } else {
                                    ti as usize
                                };
                                for bh in 0..kh {
                                    let hi = (oh * stride[1] + bh) as isize - ph as isize;
                                    if hi < 0 || hi >= h as isize {
                                        continue;
                                    }
                                    for bw in 0..kw {
                                        let wi = (ow * stride[2] + bw) as isize - pw as isize;
                                        if wi < 0 || wi >= w as isize {
                                            continue;
                                        }
                                        let xv = x[(((bi * cin + ci) * t + ti) * h + hi as usize)
                                            * w
                                            + wi as usize];
                                        let wv =
                                            wt[(((co * cin + ci) * kt + a) * kh + bh) * kw + bw];
                                        acc += xv * wv;
                                    }
                                }
                            }
                        }
                        out.push(acc);
                    }
                }
            }
        }
    }
    (out, [to, ho, wo])
}

#[test]
fn causal_conv3d_matches_a_direct_convolution() {
    let dev = cpu();
    let mut rng = Rng::new(31);
    let (x, vx) = rand(&mut rng, &[2, 3, 4, 5, 7], 1.0, &dev);
    let (w, vw) = rand(&mut rng, &[4, 3, 3, 3, 3], 0.5, &dev);
    let (b, vb) = rand(&mut rng, &[4], 0.5, &dev);
    for (replicate, stride) in [(false, [1, 1, 1]), (true, [1, 2, 2]), (false, [2, 1, 2])] {
        let options = Conv3dOptions {
            stride,
            pad_t_front: 2,
            time_pad: if replicate {
                TimePad::Replicate
            } else {
                TimePad::Zeros
            },
            pad_hw: [1, 1],
        };
        let got = x.conv3d(&w, Some(&b), options).unwrap();
        let (expected, [to, ho, wo]) = reference(
            &vx,
            [2, 3, 4, 5, 7],
            &vw,
            [4, 3, 3, 3],
            Some(&vb),
            stride,
            2,
            replicate,
            [1, 1],
        );
        assert_eq!(got.shape(), [2, 4, to, ho, wo]);
        assert_close(&got, &expected, 1e-5);
    }
    // Wan's CausalConv3d(padding=1) keeps T, H and W.
    let same = x
        .conv3d(&w, None, Conv3dOptions::causal([1, 1, 1]))
        .unwrap();
    assert_eq!(same.shape(), [2, 4, 4, 5, 7]);
    // bf16 weights compute in f32.
    let got = x
        .conv3d(
            &w.to_dtype(DType::BF16).unwrap(),
            Some(&b),
            Conv3dOptions::causal([1, 1, 1]),
        )
        .unwrap();
    let (expected, _) = reference(
        &vx,
        [2, 3, 4, 5, 7],
        &vw,
        [4, 3, 3, 3],
        Some(&vb),
        [1, 1, 1],
        2,
        false,
        [1, 1],
    );
    assert_close(&got, &expected, 2e-2);
}

#[test]
fn conv2d_matches_a_direct_convolution() {
    let dev = cpu();
    let mut rng = Rng::new(32);
    let (x, vx) = rand(&mut rng, &[1, 2, 6, 9], 1.0, &dev);
    let (w, vw) = rand(&mut rng, &[3, 2, 3, 3], 0.5, &dev);
    let got = x.conv2d(&w, None, [2, 2], [0, 1]).unwrap();
    let (expected, [_, ho, wo]) = reference(
        &vx,
        [1, 2, 1, 6, 9],
        &vw,
        [3, 1, 3, 3],
        None,
        [1, 2, 2],
        0,
        false,
        [0, 1],
    );
    assert_eq!(got.shape(), [1, 3, ho, wo]);
    assert_close(&got, &expected, 1e-5);
}

#[test]
fn conv_shape_errors_name_the_op_and_the_shapes() {
    let dev = cpu();
    let x = headroom_tensor::Tensor::zeros(&[1, 3, 2, 4, 4], DType::F32, &dev).unwrap();
    let w = headroom_tensor::Tensor::zeros(&[8, 4, 3, 3, 3], DType::F32, &dev).unwrap();
    let err = x
        .conv3d(&w, None, Conv3dOptions::causal([1, 1, 1]))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("conv3d:") && err.contains("[1, 3, 2, 4, 4]") && err.contains("expects 4"),
        "{err}"
    );
    let w = headroom_tensor::Tensor::zeros(&[8, 3, 3, 7, 7], DType::F32, &dev).unwrap();
    let err = x
        .conv3d(&w, None, Conv3dOptions::causal([1, 1, 1]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("smaller along h"), "{err}");
}

#[test]
fn conv_on_a_meta_device_allocates_output_and_scratch_only() {
    let dev = Device::sim(1 << 34).unwrap();
    let x = headroom_tensor::Tensor::zeros(&[1, 96, 4, 60, 104], DType::F32, &dev).unwrap();
    let w = headroom_tensor::Tensor::zeros(&[96, 96, 3, 3, 3], DType::F32, &dev).unwrap();
    let y = x
        .conv3d(&w, None, Conv3dOptions::causal([1, 1, 1]))
        .unwrap();
    assert_eq!(y.shape(), [1, 96, 4, 60, 104]);
}
