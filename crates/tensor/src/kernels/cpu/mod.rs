//! The CPU instruction-set paths and the choice between them.
//!
//! One path is picked once per process: the best the CPU offers (CPUID and XCR0, read
//! directly because `is_x86_feature_detected!("amx-bf16")` is not stable), or the one
//! `HEADROOM_CPU_PATH` names. Every GEMM in the runtime goes through [`crate::kernels::gemm`],
//! which routes to the file of the chosen path, except where operands stay packed for the
//! bf16 paths (`amx`, `avx512bf16`) across products (weights packed at load in
//! `ops::packed`, attention's tiles in `kernels::attention`, conv3d's weights): those call
//! [`amx`] directly, with the same loops and the path's micro-kernel.
//!
//! | path | bf16 GEMM | f32 GEMM |
//! |---|---|---|
//! | `amx` | AMX tiles (`tdpbf16ps`) | the `gemm` crate; near-f32 (`HEADROOM_F32_GEMM=amx`): AMX, each operand split into a bf16 high and low part (three products) |
//! | `avx512bf16` | `vdpbf16ps` on the AMX path's packed panels ([`vdp`]) | the `gemm` crate; near-f32 as on `amx`, with `vdpbf16ps` |
//! | `avx512`, `avx2` | bf16-rounded operands through the `gemm` crate | the `gemm` crate (it picks AVX-512 or AVX2 itself) |
//! | `scalar` | plain loops | plain loops |
//!
//! Same inputs, path and thread count give the same bytes; different paths round
//! differently and agree within the tolerances the tests hold.

pub mod amx;
pub mod fma;
pub mod fp8;
pub mod int8;
pub mod pack;
pub mod peak;
pub mod scalar;
pub mod vdp;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// The environment variable that forces a path.
pub const PATH_ENV: &str = "HEADROOM_CPU_PATH";

/// One instruction-set path for the CPU kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CpuPath {
    /// Plain Rust loops: the reference every other path is tested against.
    Scalar,
    /// 256-bit AVX2 + FMA.
    Avx2,
    /// 512-bit AVX-512F.
    Avx512,
    /// AVX-512 with the `vdpbf16ps` bf16 dot product.
    Avx512Bf16,
    /// Intel AMX tiles with bf16 dot products.
    Amx,
}

impl CpuPath {
    /// Every path, slowest first.
    pub const ALL: [CpuPath; 5] = [
        CpuPath::Scalar,
        CpuPath::Avx2,
        CpuPath::Avx512,
        CpuPath::Avx512Bf16,
        CpuPath::Amx,
    ];

    /// The name `HEADROOM_CPU_PATH` takes.
    pub fn name(self) -> &'static str {
        match self {
            CpuPath::Scalar => "scalar",
            CpuPath::Avx2 => "avx2",
            CpuPath::Avx512 => "avx512",
            CpuPath::Avx512Bf16 => "avx512bf16",
            CpuPath::Amx => "amx",
        }
    }

    /// Parses a path name.
    pub fn parse(name: &str) -> Option<CpuPath> {
        CpuPath::ALL
            .into_iter()
            .find(|p| p.name() == name.trim().to_ascii_lowercase())
    }

    /// Whether this CPU (and its operating system) can run the path.
    pub fn supported(self) -> bool {
        let f = features();
        match self {
            CpuPath::Scalar => true,
            CpuPath::Avx2 => f.avx2_fma,
            CpuPath::Avx512 => f.avx512,
            CpuPath::Avx512Bf16 => f.avx512 && f.avx512_bf16,
            CpuPath::Amx => f.avx512 && f.amx_bf16 && amx::enable(),
        }
    }

    /// Whether the path multiplies bf16 on packed panels ([`amx`]'s loops): `amx` and
    /// `avx512bf16`.
    pub fn packs_bf16(self) -> bool {
        amx::Kernel::of(self).is_some()
    }

    /// Why the path cannot run here (for test skips), or `None` when it can.
    pub fn unsupported_reason(self) -> Option<String> {
        (!self.supported()).then(|| format!("this CPU has no {} support", self.name()))
    }
}

impl std::fmt::Display for CpuPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What CPUID and XCR0 say about the instruction sets the paths need.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AVX2 and FMA, with the OS saving YMM state.
    pub avx2_fma: bool,
    /// AVX-512 F/BW/VL/DQ, with the OS saving ZMM state.
    pub avx512: bool,
    /// AVX512_BF16.
    pub avx512_bf16: bool,
    /// AVX512_VNNI (`vpdpbusd`: int8 dot products).
    pub avx512_vnni: bool,
    /// AMX-TILE and AMX-BF16, with the OS supporting tile state (XCR0 bits 17 and 18).
    pub amx_bf16: bool,
}

/// The CPU's features, read once.
pub fn features() -> CpuFeatures {
    static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
    *FEATURES.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> CpuFeatures {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    let leaf0 = __cpuid(0);
    if leaf0.eax < 7 {
        return CpuFeatures::default();
    }
    let (l1, l7, l7_1) = (__cpuid(1), __cpuid_count(7, 0), __cpuid_count(7, 1));
    let osxsave = l1.ecx & (1 << 27) != 0;
    let xcr0 = if osxsave {
        // SAFETY: OSXSAVE says XGETBV is enabled; register 0 is XCR0.
        unsafe { xgetbv0() }
    } else {
        0
    };
    let ymm_os = xcr0 & 0b110 == 0b110;
    let zmm_os = ymm_os && xcr0 & 0b1110_0000 == 0b1110_0000;
    let tile_os = xcr0 & (0b11 << 17) == (0b11 << 17);
    let bit = |r: u32, b: u32| r & (1 << b) != 0;
    let avx2_fma = ymm_os && bit(l7.ebx, 5) && bit(l1.ecx, 12);
    let avx512 = zmm_os
        && bit(l7.ebx, 16) // F
        && bit(l7.ebx, 17) // DQ
        && bit(l7.ebx, 30) // BW
        && bit(l7.ebx, 31); // VL
    CpuFeatures {
        avx2_fma,
        avx512,
        avx512_bf16: avx512 && bit(l7_1.eax, 5),
        avx512_vnni: avx512 && bit(l7.ecx, 11),
        amx_bf16: tile_os && bit(l7.edx, 22) && bit(l7.edx, 24),
    }
}

#[cfg(target_arch = "x86_64")]
unsafe fn xgetbv0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller checked OSXSAVE; XGETBV with ECX = 0 reads XCR0 and touches
    // nothing but EAX and EDX.
    unsafe {
        std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi,
            options(nomem, nostack, preserves_flags));
    }
    (u64::from(hi) << 32) | u64::from(lo)
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> CpuFeatures {
    CpuFeatures::default()
}

/// Whether CPUID's vendor string is AMD's (`AuthenticAMD`), for kernel choices measured
/// to differ between the vendors' cores.
pub fn vendor_is_amd() -> bool {
    static AMD: OnceLock<bool> = OnceLock::new();
    *AMD.get_or_init(vendor_amd)
}

#[cfg(target_arch = "x86_64")]
fn vendor_amd() -> bool {
    let r = std::arch::x86_64::__cpuid(0);
    let mut id = [0u8; 12];
    for (i, word) in [r.ebx, r.edx, r.ecx].into_iter().enumerate() {
        id[4 * i..4 * i + 4].copy_from_slice(&word.to_le_bytes());
    }
    &id == b"AuthenticAMD"
}

#[cfg(not(target_arch = "x86_64"))]
fn vendor_amd() -> bool {
    false
}

/// The CPU's model as its brand string says (CPUID leaves 0x8000_0002..4), for the
/// header of every speed figure; `"unknown CPU"` where it has none.
pub fn model_name() -> String {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(brand).clone()
}

#[cfg(target_arch = "x86_64")]
fn brand() -> String {
    use std::arch::x86_64::__cpuid;
    if __cpuid(0x8000_0000).eax < 0x8000_0004 {
        return "unknown CPU".into();
    }
    let mut bytes = Vec::with_capacity(48);
    for leaf in 0x8000_0002u32..=0x8000_0004 {
        let r = __cpuid(leaf);
        for word in [r.eax, r.ebx, r.ecx, r.edx] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    let name = text
        .trim_matches(char::from(0))
        .split_whitespace()
        .collect::<Vec<_>>();
    if name.is_empty() {
        "unknown CPU".into()
    } else {
        name.join(" ")
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn brand() -> String {
    std::env::consts::ARCH.to_string()
}

/// The best path this CPU supports.
pub fn best() -> CpuPath {
    CpuPath::ALL
        .into_iter()
        .rev()
        .find(|p| p.supported())
        .unwrap_or(CpuPath::Scalar)
}

/// A path set by [`set_path`] (benchmarks comparing paths in one run), 0 when none.
static OVERRIDE: AtomicU8 = AtomicU8::new(0);

/// Makes every kernel use `path` from now on (benchmarks that compare paths in one run);
/// `None` goes back to the start-up choice. Refuses a path this CPU cannot run.
pub fn set_path(path: Option<CpuPath>) -> Result<(), String> {
    match path {
        Some(p) if !p.supported() => Err(format!("this CPU cannot run the {p} path")),
        Some(p) => {
            let code = CpuPath::ALL.iter().position(|&q| q == p).unwrap_or(0) as u8 + 1;
            OVERRIDE.store(code, Ordering::SeqCst);
            Ok(())
        }
        None => {
            OVERRIDE.store(0, Ordering::SeqCst);
            Ok(())
        }
    }
}

/// The path the kernels use: the one [`set_path`] set, else `HEADROOM_CPU_PATH` when it
/// names a supported path, else the best one. A forced path this CPU cannot run falls
/// back to the best, with a warning on standard error, because a kernel has no error
/// channel.
pub fn selected() -> CpuPath {
    match OVERRIDE.load(Ordering::Relaxed) {
        0 => startup(),
        code => CpuPath::ALL[usize::from(code - 1)],
    }
}

fn startup() -> CpuPath {
    static SELECTED: OnceLock<CpuPath> = OnceLock::new();
    *SELECTED.get_or_init(|| match std::env::var(PATH_ENV) {
        Ok(v) if !v.trim().is_empty() => match CpuPath::parse(&v) {
            Some(p) if p.supported() => p,
            Some(p) => {
                eprintln!(
                    "warning: {PATH_ENV}={} is not supported on this CPU; using {}",
                    p.name(),
                    best()
                );
                best()
            }
            None => {
                eprintln!(
                    "warning: {PATH_ENV}={v:?} is not one of scalar, avx2, avx512, avx512bf16, amx; using {}",
                    best()
                );
                best()
            }
        },
        _ => best(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_name_parses_back() {
        for p in CpuPath::ALL {
            assert_eq!(CpuPath::parse(p.name()), Some(p));
        }
        assert_eq!(CpuPath::parse(" AMX "), Some(CpuPath::Amx));
        assert_eq!(CpuPath::parse("sse"), None);
    }

    #[test]
    fn the_best_path_is_supported_and_scalar_always_is() {
        assert!(CpuPath::Scalar.supported());
        assert!(best().supported());
        assert!(selected().supported());
    }

    #[test]
    fn the_cpu_model_name_is_one_clean_line() {
        let name = model_name();
        assert!(
            !name.is_empty() && !name.contains('\0') && !name.contains("  "),
            "{name:?}"
        );
    }
}
