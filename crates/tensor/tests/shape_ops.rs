//! cat, stack, pad, upsample and pixel (un)shuffle against reference index arithmetic.

mod common;

use common::{cpu, rand, ravel, unravel, Rng};
use headroom_tensor::kernels::resample::PadMode;
use headroom_tensor::{DType, Tensor};

#[test]
fn cat_joins_along_any_axis_for_any_dtype() {
    let dev = cpu();
    let a = Tensor::from_slice(&[1u8, 2, 3, 4, 5, 6], &[2, 3], &dev).unwrap();
    let b = Tensor::from_slice(&[7u8, 8], &[2, 1], &dev).unwrap();
    let c = Tensor::cat(&[&a, &b], 1).unwrap();
    assert_eq!(c.shape(), [2, 4]);
    assert_eq!(c.to_vec::<u8>().unwrap(), [1, 2, 3, 7, 4, 5, 6, 8]);
    let d = Tensor::cat(&[&a, &a.narrow(0, 1, 1).unwrap()], 0).unwrap();
    assert_eq!(d.to_vec::<u8>().unwrap(), [1, 2, 3, 4, 5, 6, 4, 5, 6]);
    let s = Tensor::stack(&[&a, &a], 0).unwrap();
    assert_eq!(s.shape(), [2, 2, 3]);
    let err = Tensor::cat(&[&a, &b], 0).unwrap_err().to_string();
    assert!(err.starts_with("cat:") && err.contains("[2, 1]"), "{err}");
    let f = a.to_dtype(DType::F32).unwrap();
    assert!(Tensor::cat(&[&f, &a], 0).is_err(), "dtypes must agree");
}

#[test]
fn pad_adds_zeros_or_edge_values_per_axis() {
    let dev = cpu();
    let mut rng = Rng::new(21);
    let shape = [2, 3, 4];
    let (x, vx) = rand(&mut rng, &shape, 1.0, &dev);
    let pads = [(1, 0), (2, 1), (0, 3)];
    for mode in [PadMode::Zeros, PadMode::Replicate] {
        let got = x.pad(&pads, mode).unwrap();
        let out_shape = [3, 6, 7];
        assert_eq!(got.shape(), out_shape);
        let got = got.to_vec::<f32>().unwrap();
        for (i, &g) in got.iter().enumerate() {
            let idx = unravel(i, &out_shape);
            let mut src = Vec::new();
            let mut inside = true;
            for a in 0..3 {
                let p = idx[a] as isize - pads[a].0 as isize;
                if p < 0 || p >= shape[a] as isize {
                    inside = false;
                }
                src.push(p.clamp(0, shape[a] as isize - 1) as usize);
            }
            let expected = match (inside, mode) {
                (false, PadMode::Zeros) => 0.0,
                _ => vx[ravel(&src, &shape)] as f32,
            };
            assert_eq!(g, expected, "at {idx:?}");
        }
    }
    assert!(x.pad(&[(1, 1)], PadMode::Zeros).is_err());
}

#[test]
fn upsample_repeats_each_pixel_two_by_two() {
    let dev = cpu();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[1, 2, 3], &dev).unwrap();
    let y = x.upsample_nearest2x().unwrap();
    assert_eq!(y.shape(), [1, 4, 6]);
    let v = y.to_vec::<f32>().unwrap();
    assert_eq!(&v[..6], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
    assert_eq!(&v[6..12], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
    assert_eq!(&v[12..18], &[4.0, 4.0, 5.0, 5.0, 6.0, 6.0]);
    assert_eq!(
        x.to_dtype(DType::BF16)
            .unwrap()
            .upsample_nearest2x()
            .unwrap()
            .dtype(),
        DType::BF16
    );
}

#[test]
fn pixel_shuffle_follows_pytorch_order_and_unshuffle_inverts_it() {
    let dev = cpu();
    let (b, c, h, w, r) = (2, 3, 2, 5, 2);
    let n = b * c * r * r * h * w;
    let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let x = Tensor::from_slice(&values, &[b, c * r * r, h, w], &dev).unwrap();
    let y = x.pixel_shuffle(r).unwrap();
    assert_eq!(y.shape(), [b, c, h * r, w * r]);
    let got = y.to_vec::<f32>().unwrap();
    for bi in 0..b {
        for ci in 0..c {
            for yi in 0..h * r {
                for xi in 0..w * r {
                    let src = ravel(
                        &[bi, ci * r * r + (yi % r) * r + xi % r, yi / r, xi / r],
                        &[b, c * r * r, h, w],
                    );
                    let dst = ravel(&[bi, ci, yi, xi], &[b, c, h * r, w * r]);
                    assert_eq!(got[dst], values[src]);
                }
            }
        }
    }
    let back = y.pixel_unshuffle(r).unwrap();
    assert_eq!(back.to_vec::<f32>().unwrap(), values);
    assert!(x.pixel_shuffle(3).is_err());
    assert!(y.pixel_unshuffle(3).is_err());
}
