//! Byte sizes as people write them (`64GiB`, `128MiB`, `512B`) and as we print them.

/// A size string that is not a size: what the user wrote and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {input:?}: {reason} (examples: 512B, 64KiB, 128MiB, 64GiB)")]
pub struct SizeError {
    /// What the user wrote.
    pub input: String,
    /// Why it is not a size.
    pub reason: String,
}

/// One kibibyte.
pub const KIB: u64 = 1 << 10;
/// One mebibyte.
pub const MIB: u64 = 1 << 20;
/// One gibibyte.
pub const GIB: u64 = 1 << 30;

/// Parses `N`, `NB`, `NKiB`, `NMiB`, `NGiB` or `NTiB` (N may have a fraction; units are
/// case-insensitive) into bytes.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    let err = |reason: &str| SizeError {
        input: input.to_string(),
        reason: reason.to_string(),
    };
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    if number.is_empty() {
        return Err(err("it does not start with a number"));
    }
    let multiplier = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => KIB,
        "mib" => MIB,
        "gib" => GIB,
        "tib" => GIB * KIB,
        other => {
            return Err(err(&format!(
                "unknown unit {other:?}; use B, KiB, MiB, GiB or TiB"
            )))
        }
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole
            .checked_mul(multiplier)
            .ok_or_else(|| err("it does not fit in 64 bits"));
    }
    let value: f64 = number.parse().map_err(|_| err("the number is malformed"))?;
    if multiplier == 1 && value.fract() != 0.0 {
        return Err(err("a byte count must be whole; give a unit (e.g. 1.5MiB)"));
    }
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err("it does not fit in 64 bits"));
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes with a binary unit and one decimal, e.g. `1.5 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_accept_binary_units_and_fractions() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("512B").unwrap(), 512);
        assert_eq!(parse_size("64KiB").unwrap(), 64 * KIB);
        assert_eq!(parse_size("128MiB").unwrap(), 128 * MIB);
        assert_eq!(parse_size("64GiB").unwrap(), 64 * GIB);
        assert_eq!(parse_size("1.5gib").unwrap(), 3 * GIB / 2);
        assert_eq!(parse_size(" 2 MiB ").unwrap(), 2 * MIB);
    }

    #[test]
    fn malformed_sizes_name_the_problem() {
        let e = parse_size("12XB").unwrap_err().to_string();
        assert!(e.contains("unknown unit"), "{e}");
        let e = parse_size("MiB").unwrap_err().to_string();
        assert!(e.contains("number"), "{e}");
        assert!(parse_size("99999999999TiB").is_err());
        // A fraction without a unit is never silently rounded to 0 B.
        let e = parse_size("0.25").unwrap_err().to_string();
        assert!(e.contains("whole"), "{e}");
    }

    #[test]
    fn bytes_format_with_binary_units() {
        assert_eq!(format_bytes(100), "100 B");
        assert_eq!(format_bytes(3 * MIB / 2), "1.5 MiB");
        assert_eq!(format_bytes(64 * GIB), "64.0 GiB");
    }
}
