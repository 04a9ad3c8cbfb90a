//! A conv over time parts (a causal conv's cached frames, then its new chunk) gives the
//! bytes of the same conv over the joined input, on every CPU path this machine runs, with
//! f32 and bf16 weights. Its own test binary: it switches the process-wide CPU path.

mod common;

use std::sync::Mutex;

use common::{cpu, rand, Rng};
use headroom_tensor::kernels::cpu::{set_path, CpuPath};
use headroom_tensor::ops::conv::{Conv3dOptions, TimePad};
use headroom_tensor::{DType, Tensor};

/// The CPU path is process-wide: tests that switch it take turns.
static PATH_LOCK: Mutex<()> = Mutex::new(());

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_f32_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// One case: input channels, output channels, kernel, stride, (h, w) padding, front
/// padding, and the frames of each part.
struct Case {
    cin: usize,
    cout: usize,
    kernel: [usize; 3],
    stride: [usize; 3],
    pad_hw: [usize; 2],
    front: usize,
    time_pad: TimePad,
    parts: &'static [usize],
}

const CASES: &[Case] = &[
    // The VAE's 3×3×3 conv with two cached frames, a chunk of 1 and of 3 frames.
    Case {
        cin: 5,
        cout: 7,
        kernel: [3, 3, 3],
        stride: [1, 1, 1],
        pad_hw: [1, 1],
        front: 0,
        time_pad: TimePad::Zeros,
        parts: &[2, 1],
    },
    Case {
        cin: 5,
        cout: 7,
        kernel: [3, 3, 3],
        stride: [1, 1, 1],
        pad_hw: [1, 1],
        front: 0,
        time_pad: TimePad::Zeros,
        parts: &[2, 3],
    },
    // The upsampler's time conv (3×1×1, 2·C out) and the downsampler's (stride 2 in t).
    Case {
        cin: 6,
        cout: 12,
        kernel: [3, 1, 1],
        stride: [1, 1, 1],
        pad_hw: [0, 0],
        front: 0,
        time_pad: TimePad::Zeros,
        parts: &[2, 2],
    },
    Case {
        cin: 4,
        cout: 4,
        kernel: [3, 1, 1],
        stride: [2, 1, 1],
        pad_hw: [0, 0],
        front: 0,
        time_pad: TimePad::Zeros,
        parts: &[1, 4],
    },
    // Odd kernels and strides, front padding on top of the parts, three parts, an empty
    // one, replicate padding reading the first frame of the second part.
    Case {
        cin: 3,
        cout: 33,
        kernel: [2, 3, 2],
        stride: [1, 2, 2],
        pad_hw: [1, 0],
        front: 1,
        time_pad: TimePad::Zeros,
        parts: &[1, 0, 2, 2],
    },
    Case {
        cin: 3,
        cout: 5,
        kernel: [3, 3, 3],
        stride: [1, 1, 1],
        pad_hw: [1, 1],
        front: 2,
        time_pad: TimePad::Replicate,
        parts: &[0, 2, 1],
    },
    // A pointwise conv: joined first, the same bytes still.
    Case {
        cin: 9,
        cout: 4,
        kernel: [1, 1, 1],
        stride: [1, 1, 1],
        pad_hw: [0, 0],
        front: 0,
        time_pad: TimePad::Zeros,
        parts: &[2, 3],
    },
];

#[test]
fn conv_over_time_parts_gives_the_bytes_of_the_joined_conv_on_every_path() {
    let _turn = PATH_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let device = cpu();
    let mut ran = Vec::new();
    for path in CpuPath::ALL.into_iter().filter(|p| p.supported()) {
        set_path(Some(path)).unwrap();
        for (i, case) in CASES.iter().enumerate() {
            let mut rng = Rng::new(11 + i as u64);
            let (b, h, w) = (2, 9, 11);
            let parts: Vec<Tensor> = case
                .parts
                .iter()
                .map(|&t| match t {
                    // An empty part (from_slice refuses zero elements).
                    0 => Tensor::zeros(&[b, case.cin, 0, h, w], DType::F32, &device).unwrap(),
                    _ => rand(&mut rng, &[b, case.cin, t, h, w], 1.0, &device).0,
                })
                .collect();
            let refs: Vec<&Tensor> = parts.iter().collect();
            let [kt, kh, kw] = case.kernel;
            let (weight, _) = rand(&mut rng, &[case.cout, case.cin, kt, kh, kw], 0.3, &device);
            let (bias, _) = rand(&mut rng, &[case.cout], 0.1, &device);
            let options = Conv3dOptions {
                stride: case.stride,
                pad_t_front: case.front,
                time_pad: case.time_pad,
                pad_hw: case.pad_hw,
            };
            for dtype in [DType::F32, DType::BF16] {
                let weight = weight.to_dtype(dtype).unwrap();
                // (cat itself refuses empty parts: the reference joins the others.)
                let full: Vec<&Tensor> =
                    refs.iter().copied().filter(|x| x.shape()[2] > 0).collect();
                let joined = Tensor::cat(&full, 2)
                    .unwrap()
                    .conv3d(&weight, Some(&bias), options)
                    .unwrap();
                let split =
                    Tensor::conv3d_time_parts(&refs, &weight, Some(&bias), options).unwrap();
                assert_eq!(split.shape(), joined.shape(), "{path} case {i} {dtype:?}");
                assert!(
                    bits(&split) == bits(&joined),
                    "{path} case {i} {dtype:?}: bytes differ"
                );
            }
        }
        ran.push(path.name());
    }
    set_path(None).unwrap();
    println!("paths checked: {ran:?}");
}

#[test]
fn zero_front_padding_gives_the_bytes_of_joined_zero_frames_on_every_path() {
    // A causal conv with an empty cache slot pads in front instead of joining zeros.
    let _turn = PATH_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let device = cpu();
    for path in CpuPath::ALL.into_iter().filter(|p| p.supported()) {
        set_path(Some(path)).unwrap();
        let mut rng = Rng::new(5);
        let (x, _) = rand(&mut rng, &[1, 6, 3, 7, 13], 1.0, &device);
        let (weight, _) = rand(&mut rng, &[10, 6, 3, 3, 3], 0.3, &device);
        let (bias, _) = rand(&mut rng, &[10], 0.1, &device);
        let zeros = Tensor::zeros(&[1, 6, 2, 7, 13], DType::F32, &device).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let weight = weight.to_dtype(dtype).unwrap();
            let mut options = Conv3dOptions::causal([0, 1, 1]);
            let joined = Tensor::cat(&[&zeros, &x], 2)
                .unwrap()
                .conv3d(&weight, Some(&bias), options)
                .unwrap();
            options.pad_t_front = 2;
            let padded = x.conv3d(&weight, Some(&bias), options).unwrap();
            assert!(bits(&padded) == bits(&joined), "{path} {dtype:?}");
        }
    }
    set_path(None).unwrap();
}

#[test]
fn time_parts_that_differ_outside_time_are_refused() {
    let device = cpu();
    let a = Tensor::zeros(&[1, 3, 2, 4, 4], DType::F32, &device).unwrap();
    let b = Tensor::zeros(&[1, 3, 2, 4, 5], DType::F32, &device).unwrap();
    let w = Tensor::zeros(&[2, 3, 3, 3, 3], DType::F32, &device).unwrap();
    let options = Conv3dOptions::causal([0, 1, 1]);
    let err = Tensor::conv3d_time_parts(&[&a, &b], &w, None, options).unwrap_err();
    assert!(err.to_string().contains("conv3d"), "{err}");
    assert!(Tensor::conv3d_time_parts(&[], &w, None, options).is_err());
}
