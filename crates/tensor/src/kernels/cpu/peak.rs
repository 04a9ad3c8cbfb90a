//! The machine's bare arithmetic peak per path, measured: the ceiling `bench kernels`
//! compares each kernel with. Each loop keeps independent accumulators in registers
//! (no memory traffic), on every thread of the kernel pool at once. Each thread's rate is
//! its FLOPs over its own CPU time, and the pool's peak is their sum: a thread that the
//! scheduler held back for part of the run (another pool's threads spinning down on its
//! core, another process) no longer halves the figure, as wall time over the whole pool
//! did (measured on a 2-core AMD EPYC: 113 or 230 GFLOP/s for the same FMA loop, run to
//! run). The kernel pool has one thread per core, so the sum is the cores' peak.

use super::CpuPath;
use crate::parallel;

/// GFLOP/s of the bare loop of `path` over the whole pool, or `None` when the path has no
/// peak loop here (scalar, AVX2) or the CPU cannot run it.
pub fn peak_gflops(path: CpuPath, iterations: usize) -> Option<f64> {
    if !path.supported() {
        return None;
    }
    let per_thread: fn(usize) -> f64 = match path {
        CpuPath::Amx => amx_loop,
        CpuPath::Avx512 => avx512_loop,
        CpuPath::Avx512Bf16 => avx512bf16_loop,
        _ => return None,
    };
    Some(pool_rate(per_thread, iterations))
}

/// GOP/s (one multiply and one add per int8 product) of 24 independent `vpdpbusd`
/// chains over the whole pool, the ceiling of the int8 products; `None` where the CPU has
/// no AVX512_VNNI.
pub fn peak_int8_gops(iterations: usize) -> Option<f64> {
    let f = super::features();
    if !(f.avx512 && f.avx512_vnni) {
        return None;
    }
    Some(pool_rate(vnni_loop, iterations))
}

/// G-operations per second of `per_thread(iterations)` (which returns the operations it
/// did) on every thread of the pool at once: after a warm-up run that brings the cores
/// to their sustained frequency, the best of five runs, each the sum of the threads'
/// rates over their own CPU time.
fn pool_rate(per_thread: fn(usize) -> f64, iterations: usize) -> f64 {
    parallel::pool().broadcast(|_| per_thread(iterations / 10 + 1));
    let mut best = 0.0f64;
    for _ in 0..5 {
        let rate: f64 = parallel::pool()
            .broadcast(|_| {
                let start = thread_cpu_seconds();
                let ops = per_thread(iterations);
                ops / (thread_cpu_seconds() - start).max(1e-9)
            })
            .into_iter()
            .sum();
        best = best.max(rate / 1e9);
    }
    best
}

/// CPU time this thread has run, in seconds.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID always exists
    // on the platforms headroom builds for.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// `iterations` rounds of four independent `tdpbf16ps` (16 × 16 × 32 each); FLOPs done.
#[cfg(target_arch = "x86_64")]
fn amx_loop(iterations: usize) -> f64 {
    use super::amx;
    assert!(amx::enable());
    let zeros = [0u8; 1024];
    // SAFETY: AMX is enabled; the tile configuration is this thread's and released on
    // drop; the loads read 16 rows of 64 bytes from `zeros` (1,024 bytes, stride 64).
    unsafe {
        let _tiles = amx::Tiles::configure();
        std::arch::asm!(
            "tileloadd tmm4, [{z} + {s}*1]",
            "tileloadd tmm5, [{z} + {s}*1]",
            "tileloadd tmm6, [{z} + {s}*1]",
            "tileloadd tmm7, [{z} + {s}*1]",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "dec {n}",
            "jnz 2b",
            z = in(reg) zeros.as_ptr(),
            s = in(reg) 64usize,
            n = inout(reg) iterations.max(1) => _,
            options(nostack),
        );
    }
    (iterations.max(1) * 4 * 16 * 16 * 32 * 2) as f64
}

/// `iterations` rounds of `$op` on 24 independent ZMM accumulators (enough chains to
/// hide the latency of a core that runs two 512-bit ops per cycle, or one as two 256-bit
/// halves), on registers only.
///
/// # Safety
/// The CPU runs `$op`.
#[cfg(target_arch = "x86_64")]
macro_rules! zmm_loop {
    ($op:literal, $iterations:expr) => {
        std::arch::asm!(
                "vxorps zmm0, zmm0, zmm0",
                "vxorps zmm1, zmm1, zmm1",
                "vxorps zmm2, zmm2, zmm2",
                "vxorps zmm3, zmm3, zmm3",
                "vxorps zmm4, zmm4, zmm4",
                "vxorps zmm5, zmm5, zmm5",
                "vxorps zmm6, zmm6, zmm6",
                "vxorps zmm7, zmm7, zmm7",
                "vxorps zmm8, zmm8, zmm8",
                "vxorps zmm9, zmm9, zmm9",
                "vxorps zmm10, zmm10, zmm10",
                "vxorps zmm11, zmm11, zmm11",
                "vxorps zmm12, zmm12, zmm12",
                "vxorps zmm13, zmm13, zmm13",
                "vxorps zmm14, zmm14, zmm14",
                "vxorps zmm15, zmm15, zmm15",
                "vxorps zmm16, zmm16, zmm16",
                "vxorps zmm17, zmm17, zmm17",
                "vxorps zmm18, zmm18, zmm18",
                "vxorps zmm19, zmm19, zmm19",
                "vxorps zmm20, zmm20, zmm20",
                "vxorps zmm21, zmm21, zmm21",
                "vxorps zmm22, zmm22, zmm22",
                "vxorps zmm23, zmm23, zmm23",
                "vxorps zmm24, zmm24, zmm24",
                "vxorps zmm25, zmm25, zmm25",
                "2:",
                concat!($op, " zmm0, zmm24, zmm25"),
                concat!($op, " zmm1, zmm24, zmm25"),
                concat!($op, " zmm2, zmm24, zmm25"),
                concat!($op, " zmm3, zmm24, zmm25"),
                concat!($op, " zmm4, zmm24, zmm25"),
                concat!($op, " zmm5, zmm24, zmm25"),
                concat!($op, " zmm6, zmm24, zmm25"),
                concat!($op, " zmm7, zmm24, zmm25"),
                concat!($op, " zmm8, zmm24, zmm25"),
                concat!($op, " zmm9, zmm24, zmm25"),
                concat!($op, " zmm10, zmm24, zmm25"),
                concat!($op, " zmm11, zmm24, zmm25"),
                concat!($op, " zmm12, zmm24, zmm25"),
                concat!($op, " zmm13, zmm24, zmm25"),
                concat!($op, " zmm14, zmm24, zmm25"),
                concat!($op, " zmm15, zmm24, zmm25"),
                concat!($op, " zmm16, zmm24, zmm25"),
                concat!($op, " zmm17, zmm24, zmm25"),
                concat!($op, " zmm18, zmm24, zmm25"),
                concat!($op, " zmm19, zmm24, zmm25"),
                concat!($op, " zmm20, zmm24, zmm25"),
                concat!($op, " zmm21, zmm24, zmm25"),
                concat!($op, " zmm22, zmm24, zmm25"),
                concat!($op, " zmm23, zmm24, zmm25"),
                "dec {n}",
                "jnz 2b",
                n = inout(reg) $iterations => _,
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _, out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _, out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _, out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _, out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _, out("zmm24") _, out("zmm25") _,
                options(nostack, nomem),
        )
    };
}

/// `iterations` rounds of 24 independent 16-lane FMAs; FLOPs done.
#[cfg(target_arch = "x86_64")]
fn avx512_loop(iterations: usize) -> f64 {
    // SAFETY: the caller checked AVX-512 support; only registers are touched.
    unsafe { zmm_loop!("vfmadd231ps", iterations.max(1)) };
    (iterations.max(1) * 24 * 16 * 2) as f64
}

/// `iterations` rounds of 24 independent `vdpbf16ps` (16 lanes × 2 bf16 products each);
/// FLOPs done.
#[cfg(target_arch = "x86_64")]
fn avx512bf16_loop(iterations: usize) -> f64 {
    // SAFETY: the caller checked AVX-512 and AVX512_BF16 support; only registers are
    // touched.
    unsafe { zmm_loop!("vdpbf16ps", iterations.max(1)) };
    (iterations.max(1) * 24 * 16 * 2 * 2) as f64
}

/// `iterations` rounds of 24 independent `vpdpbusd` (16 lanes × 4 int8 products each);
/// operations done.
#[cfg(target_arch = "x86_64")]
fn vnni_loop(iterations: usize) -> f64 {
    // SAFETY: the caller checked AVX-512 and AVX512_VNNI support; only registers are
    // touched.
    unsafe { zmm_loop!("vpdpbusd", iterations.max(1)) };
    (iterations.max(1) * 24 * 16 * 4 * 2) as f64
}

#[cfg(not(target_arch = "x86_64"))]
fn vnni_loop(_: usize) -> f64 {
    unreachable!("AVX512_VNNI is never detected off x86_64")
}

#[cfg(not(target_arch = "x86_64"))]
fn amx_loop(_: usize) -> f64 {
    unreachable!("AMX is never detected off x86_64")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_loop(_: usize) -> f64 {
    unreachable!("AVX-512 is never detected off x86_64")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512bf16_loop(_: usize) -> f64 {
    unreachable!("AVX512_BF16 is never detected off x86_64")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_are_positive_where_the_path_runs() {
        for path in [CpuPath::Amx, CpuPath::Avx512Bf16, CpuPath::Avx512] {
            match peak_gflops(path, 1000) {
                Some(g) => assert!(g > 0.0 && g.is_finite(), "{path}: {g}"),
                None => assert!(!path.supported(), "{path} runs but measured nothing"),
            }
        }
        assert_eq!(peak_gflops(CpuPath::Scalar, 10), None);
        let vnni = super::super::features().avx512_vnni && super::super::features().avx512;
        match peak_int8_gops(1000) {
            Some(g) => assert!(g > 0.0 && g.is_finite(), "int8: {g}"),
            None => assert!(!vnni, "VNNI runs but measured nothing"),
        }
    }
}
