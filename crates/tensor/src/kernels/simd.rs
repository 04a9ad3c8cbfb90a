//! Elementwise loops compiled for the selected CPU path (multiversioned): each loop exists
//! as an AVX-512 build, an AVX2 build and the baseline x86-64 (SSE2) build, and the
//! path [`cpu::selected`] names picks one at run time (`amx`, `avx512bf16` and `avx512`
//! run the AVX-512 build, `avx2` the AVX2 one, `scalar` the baseline), so
//! `HEADROOM_CPU_PATH` forces each of them in tests.
//!
//! The loops take the element function as a closure inlined into each build, so its
//! arithmetic is vectorised at that width. Every build performs the same IEEE operations
//! in the same order (Rust never fuses a multiply and an add, nor reassociates a sum,
//! on its own), so the bits depend on the function, not on the path.

use super::cpu::{self, CpuPath};

/// The vector width of the selected path's loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Width {
    Baseline,
    Avx2,
    Avx512,
}

#[cfg(test)]
thread_local! {
    /// A width forced on this thread by a test (the path itself is process-wide).
    static FORCED: std::cell::Cell<Option<Width>> = const { std::cell::Cell::new(None) };
}

fn width() -> Width {
    #[cfg(test)]
    if let Some(w) = FORCED.with(|f| f.get()) {
        return w;
    }
    match cpu::selected() {
        CpuPath::Scalar => Width::Baseline,
        CpuPath::Avx2 => Width::Avx2,
        CpuPath::Avx512 | CpuPath::Avx512Bf16 | CpuPath::Amx => Width::Avx512,
    }
}

/// Defines `$name` running `$body` (over the parameters) in the build of the selected
/// path: one `#[target_feature]` function per width around one `#[inline(always)]` body.
macro_rules! multiversion {
    (
        $(#[$doc:meta])*
        pub fn $name:ident<$($g:ident $(: $bound:path)?),*>($($arg:ident: $ty:ty),*) $body:block
    ) => {
        $(#[$doc])*
        #[inline]
        pub fn $name<$($g $(: $bound)?),*>($($arg: $ty),*) {
            #[inline(always)]
            fn body<$($g $(: $bound)?),*>($($arg: $ty),*) $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
            fn avx512<$($g $(: $bound)?),*>($($arg: $ty),*) {
                body($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            fn avx2<$($g $(: $bound)?),*>($($arg: $ty),*) {
                body($($arg),*)
            }

            match width() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the selected path runs only where CPUID and XCR0 report
                // AVX-512 F/BW/DQ/VL (`CpuPath::supported`).
                Width::Avx512 => unsafe { avx512($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the selected path runs only where AVX2 is reported.
                Width::Avx2 => unsafe { avx2($($arg),*) },
                _ => body($($arg),*),
            }
        }
    };
}

multiversion! {
    /// `dst[i] = f(src[i])` over the shorter of the two.
    pub fn map<S: Copy, D, F: Fn(S) -> D>(dst: &mut [D], src: &[S], f: F) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f(s);
        }
    }
}

multiversion! {
    /// `buf[i] = f(buf[i])`.
    pub fn map_in_place<F: Fn(f32) -> f32>(buf: &mut [f32], f: F) {
        for x in buf.iter_mut() {
            *x = f(*x);
        }
    }
}

multiversion! {
    /// `dst[i] = f(a[i], b[i])` over the shortest of the three.
    pub fn zip_map<A: Copy, B: Copy, D, F: Fn(A, B) -> D>(dst: &mut [D], a: &[A], b: &[B], f: F) {
        for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
            *d = f(x, y);
        }
    }
}

multiversion! {
    /// `dst[i] = f(a[i], b[i], c[i])` over the shortest of the four.
    pub fn zip3_map<A: Copy, B: Copy, C: Copy, D, F: Fn(A, B, C) -> D>(
        dst: &mut [D],
        a: &[A],
        b: &[B],
        c: &[C],
        f: F
    ) {
        for (((d, &x), &y), &z) in dst.iter_mut().zip(a).zip(b).zip(c) {
            *d = f(x, y, z);
        }
    }
}

multiversion! {
    /// `acc[i] += x[i]²`, in f64, over the shorter of the two.
    pub fn add_squares_f64<>(acc: &mut [f64], x: &[f32]) {
        for (a, &v) in acc.iter_mut().zip(x) {
            *a += f64::from(v) * f64::from(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_build_gives_the_bits_of_the_baseline() {
        let a: Vec<f32> = (0..1001).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let b: Vec<f32> = (0..1001).map(|i| (i as f32 * 0.11).cos() + 0.5).collect();
        let run = || {
            let mut out = vec![0f32; a.len()];
            zip_map(&mut out, &a, &b, |x, y| x * y + x / y);
            let mut m = vec![0f32; a.len()];
            map(&mut m, &out, |x| (x - 0.25) * 1.5);
            map_in_place(&mut m, |x| x.max(-1.0));
            // The activations' libm-free exp and tanh, as the models run them.
            let mut g = vec![0f32; a.len()];
            map(&mut g, &a, super::super::activation::gelu_tanh);
            map_in_place(&mut g, super::super::activation::silu);
            m.extend(g);
            let mut h = vec![half::bf16::ZERO; m.len()];
            map(&mut h, &m, half::bf16::from_f32);
            let mut z = vec![0f32; a.len()];
            zip3_map(&mut z, &a, &b, &m, |x, y, w| x * (1.0 + y) + w);
            (
                m.iter().chain(&z).map(|v| v.to_bits()).collect::<Vec<_>>(),
                h,
            )
        };
        let at = |w: Width| {
            FORCED.with(|f| f.set(Some(w)));
            let got = run();
            FORCED.with(|f| f.set(None));
            got
        };
        let want = at(Width::Baseline);
        let f = cpu::features();
        for (w, here) in [(Width::Avx2, f.avx2_fma), (Width::Avx512, f.avx512)] {
            if here {
                assert!(at(w) == want, "{w:?}");
            } else {
                eprintln!("skipped {w:?}: not on this CPU");
            }
        }
    }
}
