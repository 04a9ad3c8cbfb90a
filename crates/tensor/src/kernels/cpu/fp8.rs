//! 8-bit float operands widened to bf16 as they are packed: both formats fit bf16
//! exactly (3 or 2 mantissa bits, exponents inside bf16's), so a 256-entry table of bf16
//! bits per format is the whole conversion, and a GEMM on an fp8 weight multiplies the
//! very values the file holds, never keeping a bf16 copy of the weight.

use std::sync::OnceLock;

use crate::dtype::DType;
use crate::float8::{F8E4M3, F8E5M2};

/// bf16 bits of each 8-bit code of one format.
pub type Table = [u16; 256];

/// The bf16 bits of every code of `dtype` (`F8E4M3` or `F8E5M2`); `None` for another
/// dtype.
pub fn table(dtype: DType) -> Option<&'static Table> {
    static E4M3: OnceLock<Table> = OnceLock::new();
    static E5M2: OnceLock<Table> = OnceLock::new();
    let build = |widen: fn(u8) -> f32| -> Table {
        // Exact: every value of both formats is a bf16 value (the low 16 bits are zero),
        // NaNs aside, which become bf16's quiet NaN.
        std::array::from_fn(|b| {
            let v = widen(b as u8);
            if v.is_nan() {
                0x7fc0 | (((b as u16) & 0x80) << 8)
            } else {
                (v.to_bits() >> 16) as u16
            }
        })
    };
    match dtype {
        DType::F8E4M3 => Some(E4M3.get_or_init(|| build(|b| F8E4M3(b).to_f32()))),
        DType::F8E5M2 => Some(E5M2.get_or_init(|| build(|b| F8E5M2(b).to_f32()))),
        _ => None,
    }
}

/// 32 codes (the bytes of `bytes`) → their bf16 bits through `table`, in order.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512BW.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn words32(
    bytes: std::arch::x86_64::__m256i,
    table: &Table,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let idx = _mm512_cvtepu8_epi16(bytes);
    // Four 64-entry lookups (two 32-word registers each), the code's top two bits pick.
    let quarter = _mm512_srli_epi16::<6>(idx);
    let mut out = _mm512_setzero_si512();
    for q in 0..4 {
        // SAFETY: `table` holds 256 u16; quarter q reads values 64q..64q + 64.
        let (lo, hi) = unsafe {
            let p = table.as_ptr().add(64 * q);
            (
                _mm512_loadu_si512(p.cast()),
                _mm512_loadu_si512(p.add(32).cast()),
            )
        };
        let hit = _mm512_cmpeq_epi16_mask(quarter, _mm512_set1_epi16(q as i16));
        out = _mm512_mask_mov_epi16(out, hit, _mm512_permutex2var_epi16(lo, idx, hi));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_hold_each_code_exactly_as_bf16() {
        for dtype in [DType::F8E4M3, DType::F8E5M2] {
            let t = table(dtype).unwrap();
            for b in 0..=255u8 {
                let v = match dtype {
                    DType::F8E4M3 => F8E4M3(b).to_f32(),
                    _ => F8E5M2(b).to_f32(),
                };
                let w = f32::from_bits(u32::from(t[b as usize]) << 16);
                assert!(
                    v == w || (v.is_nan() && w.is_nan()),
                    "{dtype} {b:#x}: {v} vs {w}"
                );
            }
        }
        assert!(table(DType::BF16).is_none());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vector_lookup_is_the_table() {
        if !super::super::features().avx512 {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        use std::arch::x86_64::*;
        let t = table(DType::F8E4M3).unwrap();
        for start in (0..256).step_by(32) {
            let bytes: [u8; 32] = std::array::from_fn(|i| (start + i * 7) as u8);
            let mut out = [0u16; 32];
            // SAFETY: AVX-512 is present (checked); 32 bytes in, 32 words out.
            unsafe {
                let v = words32(_mm256_loadu_si256(bytes.as_ptr().cast()), t);
                _mm512_storeu_si512(out.as_mut_ptr().cast(), v);
            }
            let want: Vec<u16> = bytes.iter().map(|&b| t[b as usize]).collect();
            assert_eq!(out.to_vec(), want);
        }
    }
}
