//! The AMX tile state and the tile micro-kernel: the process's permission to use the
//! tiles ([`enable`]), a thread's tile configuration ([`Tiles`]), and the `tdpbf16ps`
//! loop over one 32 × 32 block of C ([`tile_kernel`]).

use std::sync::OnceLock;

/// Asks the kernel for AMX tile state once; true when it granted it.
pub fn enable() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            if !super::super::features().amx_bf16 {
                return false;
            }
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM only changes this process's
            // permission to use the tile data state; it reads and writes no memory of ours.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            };
            rc == 0
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            false
        }
    })
}

/// The tile registers configured as eight 16 × 64-byte tiles, released on drop.
#[derive(Debug)]
pub(crate) struct Tiles;

#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl Tiles {
    /// # Safety
    /// AMX must be enabled for the process ([`enable`]).
    pub(crate) unsafe fn configure() -> Tiles {
        let mut cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            cfg.colsb[t] = 64;
            cfg.rows[t] = 16;
        }
        // SAFETY: `cfg` is a valid 64-byte palette-1 configuration; the caller has the
        // tile permission.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        }
        Tiles
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: releasing the tile state this thread configured; touches no memory.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// `u16` values of the next B panel [`tile_kernel`] prefetches per k-step: four cache
/// lines, so the A panels of a block (eight at [`MC`](super::MC) rows) fetch one whole
/// panel.
pub(super) const PREFETCH_PER_STEP: usize = 128;

/// C (32 × 32 f32 at `c`, rows `ldc_bytes` apart) `(load ? C : 0) +=` A panel · B panel
/// over `steps` packed k-steps, prefetching `steps` × [`PREFETCH_PER_STEP`] values at
/// `pf` on the way.
///
/// # Safety
/// Tiles configured (8 × 16 rows × 64 bytes); `a` and `b` point at `steps` packed
/// k-steps (2,048 bytes each); the 32 rows of 128 bytes at `c` are writable; `steps ≥ 1`.
/// `pf` may point anywhere (a prefetch never faults), but should be in some buffer.
#[inline]
pub(super) unsafe fn tile_kernel(
    a: *const u16,
    b: *const u16,
    pf: *const u16,
    c: *mut f32,
    ldc_bytes: usize,
    steps: usize,
    load: bool,
) {
    debug_assert!(steps >= 1);
    // SAFETY: the caller's contract; the four C tiles are at c, c + 64 B, c + 16 rows and
    // c + 16 rows + 64 B; A and B tiles at +0 and +1024 B of each 2,048-byte k-step.
    unsafe {
        let c1 = c.add(16);
        let c2 = c.cast::<u8>().add(16 * ldc_bytes).cast::<f32>();
        let c3 = c2.add(16);
        std::arch::asm!(
            "test {load}, {load}",
            "jz 2f",
            "tileloadd tmm0, [{c0} + {ldc}*1]",
            "tileloadd tmm1, [{c1} + {ldc}*1]",
            "tileloadd tmm2, [{c2} + {ldc}*1]",
            "tileloadd tmm3, [{c3} + {ldc}*1]",
            "jmp 3f",
            "2:",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "3:",
            "tileloadd tmm4, [{a} + {s64}*1]",
            "tileloadd tmm6, [{b} + {s64}*1]",
            "tileloadd tmm5, [{a} + {s64}*1 + 1024]",
            "tileloadd tmm7, [{b} + {s64}*1 + 1024]",
            "prefetcht0 [{pf}]",
            "prefetcht0 [{pf} + 64]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "prefetcht0 [{pf} + 128]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "prefetcht0 [{pf} + 192]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a}, 2048",
            "add {b}, 2048",
            "add {pf}, 256",
            "dec {k}",
            "jnz 3b",
            "tilestored [{c0} + {ldc}*1], tmm0",
            "tilestored [{c1} + {ldc}*1], tmm1",
            "tilestored [{c2} + {ldc}*1], tmm2",
            "tilestored [{c3} + {ldc}*1], tmm3",
            load = in(reg) u64::from(load),
            a = inout(reg) a => _,
            b = inout(reg) b => _,
            pf = inout(reg) pf => _,
            k = inout(reg) steps => _,
            c0 = in(reg) c,
            c1 = in(reg) c1,
            c2 = in(reg) c2,
            c3 = in(reg) c3,
            ldc = in(reg) ldc_bytes,
            s64 = in(reg) 64usize,
            options(nostack),
        );
    }
}
