//! Every op against a straightforward f64 reference, on random inputs including
//! non-contiguous views and broadcasting, with a stated tolerance per dtype.

mod common;

use common::{assert_close, cpu, rand, ravel, tolerance, unravel, Rng};
use headroom_tensor::{DType, Tensor};

/// Reference broadcast binary op.
fn ref_binary(
    a: &[f64],
    sa: &[usize],
    b: &[f64],
    sb: &[usize],
    out: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let n: usize = out.iter().product();
    let pick = |v: &[f64], s: &[usize], idx: &[usize]| {
        let off = idx.len() - s.len();
        let i: Vec<usize> = s
            .iter()
            .enumerate()
            .map(|(k, &d)| if d == 1 { 0 } else { idx[off + k] })
            .collect();
        v[ravel(&i, s)]
    };
    (0..n)
        .map(|i| {
            let idx = unravel(i, out);
            f(pick(a, sa, &idx), pick(b, sb, &idx))
        })
        .collect()
}

#[test]
fn binary_ops_broadcast_like_numpy() {
    let dev = cpu();
    let mut rng = Rng::new(1);
    let (a, va) = rand(&mut rng, &[4, 1, 5], 2.0, &dev);
    let (b, vb) = rand(&mut rng, &[3, 1], 2.0, &dev);
    let out = [4, 3, 5];
    type F = fn(f64, f64) -> f64;
    let cases: [(&str, F); 4] = [
        ("add", |x, y| x + y),
        ("sub", |x, y| x - y),
        ("mul", |x, y| x * y),
        ("div", |x, y| x / (y + 3.0)),
    ];
    for (name, f) in cases {
        let got = match name {
            "add" => a.add(&b),
            "sub" => a.sub(&b),
            "mul" => a.mul(&b),
            _ => a.div(&b.add_scalar(3.0).unwrap()),
        }
        .unwrap();
        assert_eq!(got.shape(), out);
        assert_close(
            &got,
            &ref_binary(&va, &[4, 1, 5], &vb, &[3, 1], &out, f),
            tolerance(DType::F32),
        );
    }
}

#[test]
fn binary_ops_read_non_contiguous_views() {
    let dev = cpu();
    let mut rng = Rng::new(2);
    let (a, va) = rand(&mut rng, &[3, 4], 1.0, &dev);
    let (b, vb) = rand(&mut rng, &[4, 3], 1.0, &dev);
    let at = a.transpose(0, 1).unwrap(); // [4, 3], strided
    let expected: Vec<f64> = (0..12).map(|i| va[(i % 3) * 4 + i / 3] * vb[i]).collect();
    assert_close(&at.mul(&b).unwrap(), &expected, tolerance(DType::F32));
    let narrow = b.narrow(1, 1, 2).unwrap();
    let expected: Vec<f64> = (0..8).map(|i| vb[(i / 2) * 3 + 1 + i % 2] + 1.0).collect();
    assert_close(
        &narrow.add_scalar(1.0).unwrap(),
        &expected,
        tolerance(DType::F32),
    );
}

#[test]
fn bf16_and_f16_store_narrow_and_compute_in_f32() {
    let dev = cpu();
    let mut rng = Rng::new(3);
    for dtype in [DType::BF16, DType::F16] {
        let (a, va) = rand(&mut rng, &[64], 4.0, &dev);
        let (b, vb) = rand(&mut rng, &[64], 4.0, &dev);
        let (an, bn) = (a.to_dtype(dtype).unwrap(), b.to_dtype(dtype).unwrap());
        let sum = an.add(&bn).unwrap();
        assert_eq!(sum.dtype(), dtype);
        let expected: Vec<f64> = va.iter().zip(&vb).map(|(x, y)| x + y).collect();
        assert_close(&sum, &expected, tolerance(dtype));
        assert_eq!(an.add(&b).unwrap().dtype(), DType::F32);
        assert_eq!(an.storage_bytes(), 128);
    }
}

#[test]
fn unary_ops_match_the_f64_reference() {
    let dev = cpu();
    let mut rng = Rng::new(4);
    let (x, vx) = rand(&mut rng, &[7, 9], 3.0, &dev);
    let (p, vp) = rand(&mut rng, &[7, 9], 1.0, &dev);
    let p = p.affine(1.0, 1.5).unwrap();
    let vp: Vec<f64> = vp.iter().map(|v| v + 1.5).collect();
    type F = fn(f64) -> f64;
    let erf_gelu = |v: f64| 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2));
    let tanh_gelu = |v: f64| {
        0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
    };
    let on_x: [(Tensor, F); 7] = [
        (x.exp().unwrap(), f64::exp),
        (x.sin().unwrap(), f64::sin),
        (x.cos().unwrap(), f64::cos),
        (x.silu().unwrap(), |v| v / (1.0 + (-v).exp())),
        (x.gelu_tanh().unwrap(), tanh_gelu),
        (x.gelu_erf().unwrap(), erf_gelu),
        (x.clamp(-1.0, 0.5).unwrap(), |v| v.clamp(-1.0, 0.5)),
    ];
    for (got, f) in on_x {
        let expected: Vec<f64> = vx.iter().map(|&v| f(v)).collect();
        assert_close(&got, &expected, tolerance(DType::F32));
    }
    let expected: Vec<f64> = vp.iter().map(|v| v.sqrt()).collect();
    assert_close(&p.sqrt().unwrap(), &expected, tolerance(DType::F32));
    let expected: Vec<f64> = vp.iter().map(|v| 1.0 / v.sqrt()).collect();
    assert_close(&p.rsqrt().unwrap(), &expected, tolerance(DType::F32));
    let expected: Vec<f64> = vx.iter().map(|v| v * 2.0 - 1.0).collect();
    assert_close(
        &x.affine(2.0, -1.0).unwrap(),
        &expected,
        tolerance(DType::F32),
    );
    assert!(x.clamp(1.0, 0.0).is_err());
}

#[test]
fn reductions_along_each_axis_match_the_reference() {
    let dev = cpu();
    let mut rng = Rng::new(5);
    let shape = [3, 4, 5];
    let (x, vx) = rand(&mut rng, &shape, 2.0, &dev);
    for axis in 0..3 {
        let mut out_shape = shape.to_vec();
        out_shape[axis] = 1;
        let n: usize = out_shape.iter().product();
        let mut sum = vec![0.0; n];
        let mut max = vec![f64::NEG_INFINITY; n];
        for (i, &v) in vx.iter().enumerate() {
            let mut idx = unravel(i, &shape);
            idx[axis] = 0;
            let o = ravel(&idx, &out_shape);
            sum[o] += v;
            max[o] = max[o].max(v);
        }
        let mean: Vec<f64> = sum.iter().map(|s| s / shape[axis] as f64).collect();
        assert_close(&x.sum(axis, false).unwrap(), &sum, tolerance(DType::F32));
        assert_close(&x.mean(axis, true).unwrap(), &mean, tolerance(DType::F32));
        assert_close(&x.max(axis, false).unwrap(), &max, tolerance(DType::F32));
        assert_eq!(x.mean(axis, true).unwrap().shape(), out_shape);
    }
    assert!(x.sum(3, false).is_err());
}

#[test]
fn softmax_rows_match_the_reference() {
    let dev = cpu();
    let mut rng = Rng::new(6);
    let (x, vx) = rand(&mut rng, &[5, 33], 20.0, &dev);
    let mut expected = Vec::new();
    for row in vx.chunks(33) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        expected.extend(e.iter().map(|v| v / s));
    }
    assert_close(&x.softmax().unwrap(), &expected, tolerance(DType::F32));
}

#[test]
fn norms_match_the_reference() {
    let dev = cpu();
    let mut rng = Rng::new(7);
    let (x, vx) = rand(&mut rng, &[6, 16], 3.0, &dev);
    let (w, vw) = rand(&mut rng, &[16], 1.0, &dev);
    let (b, vb) = rand(&mut rng, &[16], 1.0, &dev);
    let eps = 1e-6;
    let mut ln = Vec::new();
    let mut ln_plain = Vec::new();
    let mut rms = Vec::new();
    for row in vx.chunks(16) {
        let mean = row.iter().sum::<f64>() / 16.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 16.0;
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 16.0;
        for j in 0..16 {
            let n = (row[j] - mean) / (var + eps).sqrt();
            ln.push(n * vw[j] + vb[j]);
            ln_plain.push(n);
            rms.push(row[j] / (ms + eps).sqrt() * vw[j]);
        }
    }
    let tol = tolerance(DType::F32);
    assert_close(
        &x.layer_norm(Some(&w), Some(&b), eps as f32).unwrap(),
        &ln,
        tol,
    );
    assert_close(
        &x.layer_norm(None, None, eps as f32).unwrap(),
        &ln_plain,
        tol,
    );
    assert_close(&x.rms_norm(Some(&w), eps as f32).unwrap(), &rms, tol);
    assert!(x
        .layer_norm(Some(&b.narrow(0, 0, 8).unwrap()), None, 1e-6)
        .is_err());

    // Channel RMS norm of a [B, C, T, H, W] tensor.
    let shape = [2, 5, 2, 3, 4];
    let (v, vv) = rand(&mut rng, &shape, 2.0, &dev);
    let (g, vg) = rand(&mut rng, &[5], 1.0, &dev);
    let inner = 2 * 3 * 4;
    let mut expected = vec![0.0; vv.len()];
    for bidx in 0..2 {
        for p in 0..inner {
            let norm = (0..5)
                .map(|c| vv[(bidx * 5 + c) * inner + p].powi(2))
                .sum::<f64>()
                .sqrt()
                .max(1e-12);
            for (c, g) in vg.iter().enumerate() {
                let i = (bidx * 5 + c) * inner + p;
                expected[i] = vv[i] / norm * 5f64.sqrt() * g;
            }
        }
    }
    assert_close(&v.rms_norm_channels(&g).unwrap(), &expected, tol);
}

#[test]
fn matmul_broadcasts_batches_and_reads_transposed_views() {
    let dev = cpu();
    let mut rng = Rng::new(8);
    let (a, va) = rand(&mut rng, &[2, 3, 5, 7], 1.0, &dev);
    let (b, vb) = rand(&mut rng, &[3, 4, 7], 1.0, &dev); // used as [3, 7, 4] through transpose
    let bt = b.transpose(1, 2).unwrap();
    let got = a.matmul(&bt).unwrap();
    assert_eq!(got.shape(), [2, 3, 5, 4]);
    let mut expected = Vec::new();
    for i in 0..2 {
        for j in 0..3 {
            for r in 0..5 {
                for c in 0..4 {
                    let s: f64 = (0..7)
                        .map(|k| va[((i * 3 + j) * 5 + r) * 7 + k] * vb[(j * 4 + c) * 7 + k])
                        .sum();
                    expected.push(s);
                }
            }
        }
    }
    assert_close(&got, &expected, tolerance(DType::F32));
    let err = a.matmul(&b).unwrap_err().to_string();
    assert!(
        err.contains("matmul") && err.contains("inner sizes"),
        "{err}"
    );
}

#[test]
fn linear_applies_pytorch_weight_layout_and_bias_with_bf16_weights() {
    let dev = cpu();
    let mut rng = Rng::new(9);
    let (x, vx) = rand(&mut rng, &[2, 3, 16], 1.0, &dev);
    let (w, vw) = rand(&mut rng, &[8, 16], 1.0, &dev);
    let (b, vb) = rand(&mut rng, &[8], 1.0, &dev);
    let mut expected = Vec::new();
    for row in vx.chunks(16) {
        for o in 0..8 {
            expected.push(vb[o] + (0..16).map(|k| row[k] * vw[o * 16 + k]).sum::<f64>());
        }
    }
    let got = x.linear(&w, Some(&b)).unwrap();
    assert_eq!(got.shape(), [2, 3, 8]);
    assert_close(&got, &expected, tolerance(DType::F32));
    let got = x
        .linear(&w.to_dtype(DType::BF16).unwrap(), Some(&b))
        .unwrap();
    assert_close(&got, &expected, tolerance(DType::BF16));
    let err = x
        .linear(&w.transpose(0, 1).unwrap(), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("linear") && err.contains("[16, 8]"), "{err}");
}

#[test]
fn casts_round_trip_and_pixels_quantise() {
    let dev = cpu();
    let v = [-1.5f32, -1.0, -0.25, 0.0, 0.5, 1.0, 3.0];
    let t = Tensor::from_slice(&v, &[7], &dev).unwrap();
    let px = t.to_pixels().unwrap().to_vec::<u8>().unwrap();
    assert_eq!(px, [0, 0, 96, 128, 191, 255, 255]);
    let back = t
        .to_dtype(DType::F16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(back, v);
    let ints = Tensor::from_slice(&[1i64 << 40, -3], &[2], &dev).unwrap();
    assert_eq!(
        ints.contiguous().unwrap().to_vec::<i64>().unwrap(),
        [1i64 << 40, -3]
    );
}

#[test]
fn noise_is_the_same_however_the_stream_is_chunked() {
    let dev = cpu();
    let whole = Tensor::randn(&[1000], 7, 0, DType::F32, &dev)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let head = Tensor::randn(&[333], 7, 0, DType::F32, &dev)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let tail = Tensor::randn(&[667], 7, 333, DType::F32, &dev)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(whole, [head, tail].concat());
}

#[test]
fn views_share_storage_and_contiguous_copies_only_when_needed() {
    let dev = cpu();
    let t = Tensor::from_slice(
        &(0..24).map(|i| i as f32).collect::<Vec<_>>(),
        &[2, 3, 4],
        &dev,
    )
    .unwrap();
    let p = t.permute(&[2, 0, 1]).unwrap();
    assert!(p.shares_storage(&t));
    let c = p.contiguous().unwrap();
    assert!(!c.shares_storage(&t));
    assert!(t.contiguous().unwrap().shares_storage(&t));
    assert_eq!(c.shape(), [4, 2, 3]);
    assert_eq!(
        &c.to_vec::<f32>().unwrap()[..6],
        &[0.0, 4.0, 8.0, 12.0, 16.0, 20.0]
    );
    let r = t.reshape(&[6, 4]).unwrap();
    assert!(r.shares_storage(&t));
    assert!(t.reshape(&[5, 5]).is_err());
    let u = t.unsqueeze(1).unwrap();
    assert_eq!(u.shape(), [2, 1, 3, 4]);
    assert_eq!(u.squeeze(1).unwrap().shape(), [2, 3, 4]);
}
