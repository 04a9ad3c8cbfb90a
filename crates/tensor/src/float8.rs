//! The two 8-bit float formats checkpoints ship weights in, as PyTorch defines them:
//! `float8_e4m3fn` (4 exponent bits, bias 7, 3 mantissa bits, no infinities, largest
//! 448, NaN `S.1111.111`) and `float8_e5m2` (IEEE-like: 5 exponent bits, bias 15, 2
//! mantissa bits, infinities). Both widen to f32 (and bf16) exactly; narrowing rounds to
//! nearest even as PyTorch's casts do: e4m3fn turns what rounds past 448 into NaN, e5m2
//! into infinity.

/// A `float8_e4m3fn` value (its bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

/// A `float8_e5m2` value (its bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[repr(transparent)]
pub struct F8E5M2(pub u8);

impl F8E4M3 {
    /// The value, exactly.
    pub fn to_f32(self) -> f32 {
        let b = self.0;
        let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let (e, m) = ((b >> 3) & 0xf, b & 7);
        if e == 0xf && m == 7 {
            return f32::NAN;
        }
        let magnitude = if e == 0 {
            f32::from(m) * (1.0 / 512.0)
        } else {
            f32::from_bits(((u32::from(e) + 120) << 23) | (u32::from(m) << 20))
        };
        sign * magnitude
    }

    /// `x` rounded to nearest even; NaN and whatever rounds past 448 give NaN.
    pub fn from_f32(x: f32) -> Self {
        let sign = ((x.to_bits() >> 24) & 0x80) as u8;
        let a = x.abs();
        if a.is_nan() {
            return Self(sign | 0x7f);
        }
        // Below the smallest normal (2⁻⁶): a multiple of 2⁻⁹, exactly scaled.
        if a < 1.0 / 64.0 {
            return Self(sign | (a * 512.0).round_ties_even() as u8);
        }
        Self(sign | round_normal(a, 3, 7, 0x7f))
    }
}

impl F8E5M2 {
    /// The value, exactly (the top byte of an IEEE half).
    pub fn to_f32(self) -> f32 {
        half::f16::from_bits(u16::from(self.0) << 8).to_f32()
    }

    /// `x` rounded to nearest even; NaN gives NaN, whatever rounds past 57,344 infinity.
    pub fn from_f32(x: f32) -> Self {
        let sign = ((x.to_bits() >> 24) & 0x80) as u8;
        let a = x.abs();
        if a.is_nan() {
            return Self(sign | 0x7f);
        }
        // Below the smallest normal (2⁻¹⁴): a multiple of 2⁻¹⁶, exactly scaled.
        if a < 1.0 / 16384.0 {
            return Self(sign | (a * 65536.0).round_ties_even() as u8);
        }
        Self(sign | round_normal(a, 2, 15, 0x7c))
    }
}

/// A normal (or larger) finite-or-infinite `a ≥ 2^(1 − bias)` as the bits of an 8-bit
/// float with `mbits` mantissa bits and exponent bias `bias`, rounded to nearest even;
/// anything at or past `limit` (the format's NaN or infinity pattern) is `limit`.
fn round_normal(a: f32, mbits: u32, bias: i32, limit: u8) -> u8 {
    let bits = a.to_bits();
    if a.is_infinite() {
        return limit;
    }
    let e = ((bits >> 23) & 0xff) as i32 - 127;
    let m = bits & 0x7f_ffff;
    let drop = 23 - mbits;
    let half = 1u32 << (drop - 1);
    let odd = (m >> drop) & 1;
    let rounded = (m + half - 1 + odd) >> drop;
    // A carry out of the mantissa moves to the next exponent (`rounded` = 2^mbits).
    let code = (((e + bias) as u32) << mbits) + rounded;
    code.min(u32::from(limit)) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_e4m3_value_round_trips_and_the_edges_are_pytorchs() {
        for b in 0..=255u8 {
            let v = F8E4M3(b).to_f32();
            if v.is_nan() {
                assert_eq!(b & 0x7f, 0x7f);
                continue;
            }
            assert_eq!(F8E4M3::from_f32(v).0, b, "{b:#x} = {v}");
        }
        assert_eq!(F8E4M3(0x7e).to_f32(), 448.0);
        assert_eq!(F8E4M3(0x01).to_f32(), 1.0 / 512.0);
        assert_eq!(F8E4M3(0x08).to_f32(), 1.0 / 64.0);
        assert_eq!(
            F8E4M3::from_f32(464.0).0,
            0x7e,
            "a tie at 464 rounds to even 448"
        );
        assert_eq!(
            F8E4M3::from_f32(464.5).0,
            0x7f,
            "past it: NaN, as PyTorch casts"
        );
        assert_eq!(F8E4M3::from_f32(-1e9).0, 0xff);
        assert_eq!(F8E4M3::from_f32(f32::INFINITY).0, 0x7f);
        assert_eq!(
            F8E4M3::from_f32(1.0 / 1024.0).0,
            0x00,
            "half the smallest: to even 0"
        );
        assert_eq!(
            F8E4M3::from_f32(3.0 / 1024.0).0,
            0x02,
            "1.5 units: to even 2"
        );
        assert_eq!(F8E4M3::from_f32(1.0625).0, 0x38, "1 + 1/16 ties to 1");
        assert_eq!(F8E4M3::from_f32(1.1875).0, 0x3a, "1 + 3/16 ties to 1.25");
    }

    #[test]
    fn every_e5m2_value_round_trips_and_the_edges_are_pytorchs() {
        for b in 0..=255u8 {
            let v = F8E5M2(b).to_f32();
            if v.is_nan() {
                continue;
            }
            assert_eq!(F8E5M2::from_f32(v).0, b, "{b:#x} = {v}");
        }
        assert_eq!(F8E5M2(0x7b).to_f32(), 57344.0);
        assert_eq!(
            F8E5M2::from_f32(61440.0).0,
            0x7c,
            "the tie past 57,344 is infinity"
        );
        assert_eq!(F8E5M2::from_f32(61439.0).0, 0x7b);
        assert!(F8E5M2::from_f32(f32::NAN).to_f32().is_nan());
    }
}
