//! PyTorch's tanh-GELU, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, without a division:
//! on (−6, 6) it is `x · p(r)`, with `p` a degree-6 polynomial per interval of 0.75 (16
//! intervals, the coefficients one AVX-512 register per degree, picked with
//! `vpermps`); at or above 6 it is `x` (the factor rounds to 1) and at or below −6 it is
//! −0 (the true value is below 1e-10 in size). The fit (`tools/fit_gelu.py`) is within
//! 3.9e-7 of the f64 GELU everywhere, under one f32 ulp at 6.
//!
//! The scalar function and the AVX-512 loop perform the same IEEE operations in the same
//! order (separate multiplies and adds, never fused), so they give the same bits; the
//! AVX-512 loop only does sixteen at a time.

/// Where the polynomial ends: beyond ±6 the GELU is `x` or −0.
const HI: f32 = 6.0;
/// `t = (x + 6) · 4/3` numbers the 16 intervals of (−6, 6) by `⌊t⌋`.
const SCALE: f32 = 1.333_333_4;

/// Coefficient of `r^k` (row k) for each interval (column), `r = t − ⌊t⌋` in [0, 1].
#[rustfmt::skip]
const GELU_COEFFS: [[f32; 16]; 7] = [
    [1.5579428e-11, 7.5945445e-09, 1.141872e-06, 5.8467136e-05, 0.001212461, 0.012089479, 0.066952296, 0.22671925, 0.5, 0.77328074, 0.9330477, 0.9879105, 0.9987875, 0.9999415, 0.99999887, 1.0],
    [-4.467283e-11, 3.7170757e-08, 5.04092e-06, 0.00020197191, 0.0031994472, 0.024001429, 0.09733016, 0.22565846, 0.2992079, 0.22565614, 0.09733153, 0.024001652, 0.003199179, 0.00020192629, 5.0707727e-06, 4.218635e-08],
    [2.5064963e-09, 1.9512406e-07, 1.1247558e-05, 0.00032233723, 0.0037734408, 0.020296052, 0.054409914, 0.06352778, -1.972375e-05, -0.06352013, -0.05438751, -0.020302787, -0.0037783908, -0.00032177725, -1.0565026e-05, -1.109451e-07],
    [-1.1460462e-08, -2.6557143e-07, 1.0643537e-05, 0.0003123061, 0.0026045307, 0.009023105, 0.011143355, -0.009014103, -0.028066548, -0.009226369, 0.011269201, 0.00904231, 0.0025803407, 0.00030830214, 1.3342502e-05, 1.7424556e-07],
    [3.2638088e-08, 1.4729926e-06, 2.2194892e-05, 0.00020179116, 0.0010011522, 0.0018119903, -0.0014473927, -0.0075173383, -0.00036973882, 0.0076821335, 0.0018410074, -0.0019420653, -0.0010847078, -0.0001900837, -1.0718486e-05, -1.6837708e-07],
    [-3.7749523e-08, -1.3833667e-06, -4.491815e-06, 8.509433e-05, 0.00035358567, -3.9360566e-05, -0.0018801496, 0.00015024176, 0.0030045891, -0.0006137467, -0.0014218385, 2.277958e-05, 0.00026807233, 7.164734e-05, 5.0815643e-06, 9.2045084e-08],
    [2.1632449e-08, 1.0774885e-06, 1.26898585e-05, 3.049633e-05, -5.5134347e-05, -0.00023041299, 0.00021106713, 0.00047572455, -0.00047572455, -0.00021106713, 0.00023041299, 5.5134347e-05, -3.049633e-05, -1.26898585e-05, -1.0774885e-06, -2.1632424e-08],
];

/// The tanh-GELU of `x` (see the module docs).
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    if x.is_nan() || x >= HI {
        return x;
    }
    if x <= -HI {
        return -0.0;
    }
    let t = (x + HI) * SCALE;
    let i = (t as usize).min(15);
    let r = t - i as f32;
    let c = &GELU_COEFFS;
    let mut p = c[6][i];
    p = p * r + c[5][i];
    p = p * r + c[4][i];
    p = p * r + c[3][i];
    p = p * r + c[2][i];
    p = p * r + c[1][i];
    p = p * r + c[0][i];
    x * p
}

/// `dst[i] = gelu_tanh(src[i])` over the shorter of the two.
pub fn gelu_tanh_into(dst: &mut [f32], src: &[f32]) {
    let n = dst.len().min(src.len());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F checked just above; both slices hold at least `n` values.
        return unsafe { avx512::gelu(dst.as_mut_ptr(), src.as_ptr(), n) };
    }
    for (d, &s) in dst[..n].iter_mut().zip(&src[..n]) {
        *d = gelu_tanh(s);
    }
}

/// `x += bias[j]` (when given) then, when `gelu`, `x = gelu_tanh(x)` on each of `h` rows
/// of `w` values starting `ldc` apart in `data`, in one pass: a GEMM epilogue over one
/// finished block.
pub fn bias_gelu_rows(
    data: &mut [f32],
    ldc: usize,
    h: usize,
    w: usize,
    bias: Option<&[f32]>,
    gelu: bool,
) {
    if h == 0 || w == 0 {
        return;
    }
    assert!((h - 1) * ldc + w <= data.len() && bias.is_none_or(|b| b.len() >= w));
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        let bias = bias.map(<[f32]>::as_ptr);
        // SAFETY: AVX-512F checked just above; the rows and the bias are in bounds
        // (asserted above).
        return unsafe { avx512::bias_gelu_rows(data.as_mut_ptr(), ldc, h, w, bias, gelu) };
    }
    for r in 0..h {
        let row = &mut data[r * ldc..r * ldc + w];
        if let Some(bias) = bias {
            row.iter_mut().zip(bias).for_each(|(o, &b)| *o += b);
        }
        if gelu {
            row.iter_mut().for_each(|x| *x = gelu_tanh(*x));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{GELU_COEFFS, HI, SCALE};

    /// The coefficient tables and constants in registers.
    #[derive(Clone, Copy)]
    struct Gelu {
        c: [__m512; 7],
        hi: __m512,
        lo: __m512,
        scale: __m512,
        last: __m512i,
        neg_zero: __m512,
    }

    impl Gelu {
        #[target_feature(enable = "avx512f")]
        fn new() -> Self {
            Self {
                // SAFETY: each table row holds 16 f32.
                c: std::array::from_fn(|k| unsafe { _mm512_loadu_ps(GELU_COEFFS[k].as_ptr()) }),
                hi: _mm512_set1_ps(HI),
                lo: _mm512_set1_ps(-HI),
                scale: _mm512_set1_ps(SCALE),
                last: _mm512_set1_epi32(15),
                neg_zero: _mm512_set1_ps(-0.0),
            }
        }

        /// The GELU of 16 values: the operations of [`super::gelu_tanh`], in its order.
        #[target_feature(enable = "avx512f")]
        #[inline]
        fn of(&self, x: __m512) -> __m512 {
            let t = _mm512_mul_ps(_mm512_add_ps(x, self.hi), self.scale);
            let i = _mm512_min_epi32(_mm512_cvttps_epi32(t), self.last);
            let r = _mm512_sub_ps(t, _mm512_cvtepi32_ps(i));
            let mut p = _mm512_permutexvar_ps(i, self.c[6]);
            for k in (0..6).rev() {
                p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_permutexvar_ps(i, self.c[k]));
            }
            let y = _mm512_mul_ps(x, p);
            let low = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, self.lo);
            let y = _mm512_mask_blend_ps(low, y, self.neg_zero);
            let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, self.hi)
                | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
            _mm512_mask_blend_ps(keep, y, x)
        }
    }

    /// `dst[i] = gelu_tanh(src[i])` for `i < n`, sixteen at a time, the tail masked.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `src` and `dst` hold `n` values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gelu(dst: *mut f32, src: *const f32, n: usize) {
        let g = Gelu::new();
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: `i + 16 <= n` values are in bounds of both.
            unsafe { _mm512_storeu_ps(dst.add(i), g.of(_mm512_loadu_ps(src.add(i)))) };
            i += 16;
        }
        if i < n {
            let mask: __mmask16 = (1u16 << (n - i)) - 1;
            // SAFETY: the mask covers only the `n - i` values left, in bounds of both.
            unsafe {
                let x = _mm512_maskz_loadu_ps(mask, src.add(i));
                _mm512_mask_storeu_ps(dst.add(i), mask, g.of(x));
            }
        }
    }

    /// [`super::bias_gelu_rows`] sixteen values at a time, the row tails masked.
    ///
    /// # Safety
    /// The CPU has AVX-512F; rows `0..h` of `w` values `ldc` apart at `data`, and `w`
    /// values at `bias` when given, are in bounds.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn bias_gelu_rows(
        data: *mut f32,
        ldc: usize,
        h: usize,
        w: usize,
        bias: Option<*const f32>,
        gelu: bool,
    ) {
        let g = Gelu::new();
        // One vector: bias added, then the GELU when asked (the scalar order).
        let apply = |x: __m512, b: Option<__m512>| {
            let x = b.map_or(x, |b| _mm512_add_ps(x, b));
            if gelu {
                g.of(x)
            } else {
                x
            }
        };
        for r in 0..h {
            // SAFETY: row `r` is in bounds (caller).
            let row = unsafe { data.add(r * ldc) };
            let mut j = 0;
            while j + 16 <= w {
                // SAFETY: values `j..j + 16` of the row and of the bias are in bounds.
                unsafe {
                    let b = bias.map(|b| _mm512_loadu_ps(b.add(j)));
                    _mm512_storeu_ps(row.add(j), apply(_mm512_loadu_ps(row.add(j)), b));
                }
                j += 16;
            }
            if j < w {
                let mask: __mmask16 = (1u16 << (w - j)) - 1;
                // SAFETY: the mask covers only the `w - j` values left of the row and of
                // the bias.
                unsafe {
                    let b = bias.map(|b| _mm512_maskz_loadu_ps(mask, b.add(j)));
                    let y = apply(_mm512_maskz_loadu_ps(mask, row.add(j)), b);
                    _mm512_mask_storeu_ps(row.add(j), mask, y);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: f32) -> f64 {
        let x = f64::from(x);
        let u = 0.797_884_560_802_865_4 * (x + 0.044_715 * x * x * x);
        0.5 * x * (1.0 + u.tanh())
    }

    #[test]
    fn the_polynomial_gelu_is_within_4e_7_of_the_f64_one() {
        let mut worst = 0f64;
        for i in -2_000_000..=2_000_000 {
            let x = i as f32 * 4e-6;
            worst = worst.max((f64::from(gelu_tanh(x)) - reference(x)).abs());
        }
        assert!(worst < 4e-7, "worst {worst}");
        assert_eq!(gelu_tanh(1e30), 1e30);
        assert_eq!(gelu_tanh(-1e30).to_bits(), (-0.0f32).to_bits());
        assert!(gelu_tanh(f32::NAN).is_nan());
    }

    #[test]
    fn the_simd_loop_gives_the_scalar_bits() {
        let mut xs: Vec<f32> = (0..20_011)
            .map(|i| (i as f32 - 10_000.0) * 7.3e-4)
            .collect();
        xs.extend([
            6.0,
            -6.0,
            5.999_999_5,
            -5.999_999_5,
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            -1e-40,
            1e-40,
            0.75,
            -0.75,
            3.0,
            -3.0,
        ]);
        let mut out = vec![0f32; xs.len()];
        gelu_tanh_into(&mut out, &xs);
        let mut inplace = xs.clone();
        let n = inplace.len();
        bias_gelu_rows(&mut inplace, n, 1, n, None, true);
        let (ldc, w) = (45, 37);
        let h = xs.len() / ldc;
        let bias: Vec<f32> = (0..w).map(|j| j as f32 * 0.01 - 0.2).collect();
        let mut rows = xs.clone();
        bias_gelu_rows(&mut rows, ldc, h, w, Some(&bias), true);
        for (i, (&x, &y)) in xs.iter().zip(&rows).enumerate() {
            let (r, j) = (i / ldc, i % ldc);
            let want = if r < h && j < w {
                gelu_tanh(x + bias[j])
            } else {
                x
            };
            assert_eq!(y.to_bits(), want.to_bits(), "row {r} col {j}");
        }
        for ((&x, &a), &b) in xs.iter().zip(&out).zip(&inplace) {
            let want = gelu_tanh(x);
            assert_eq!(
                a.to_bits(),
                want.to_bits(),
                "gelu({x}) = {a}, scalar {want}"
            );
            assert_eq!(b.to_bits(), want.to_bits(), "in place gelu({x})");
        }
    }
}
