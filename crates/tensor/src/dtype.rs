//! Element types a tensor can hold. Compute is f32 (bf16/f16 are storage formats widened
//! on load and rounded on store); u8 holds pixels, i64 holds indices; the 8-bit floats and
//! i8 hold quantized weights as checkpoints ship them (converted, not computed on).

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

use crate::float8::{F8E4M3, F8E5M2};

/// The element type of a tensor's storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float.
    F32,
    /// bfloat16 storage, f32 compute.
    BF16,
    /// IEEE half storage, f32 compute.
    F16,
    /// Unsigned byte (pixels).
    U8,
    /// 64-bit signed integer (indices, token ids).
    I64,
    /// `float8_e4m3fn` storage (quantized weights).
    F8E4M3,
    /// `float8_e5m2` storage (quantized weights).
    F8E5M2,
    /// Signed byte (quantized weights).
    I8,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::U8 | DType::F8E4M3 | DType::F8E5M2 | DType::I8 => 1,
            DType::I64 => 8,
        }
    }

    /// Lower-case name (`f32`, `bf16`, …).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::U8 => "u8",
            DType::I64 => "i64",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
            DType::I8 => "i8",
        }
    }

    /// Whether the type holds floating-point values.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" | "float32" => Ok(DType::F32),
            "bf16" | "bfloat16" => Ok(DType::BF16),
            "f16" | "float16" => Ok(DType::F16),
            "u8" | "uint8" => Ok(DType::U8),
            "i64" | "int64" => Ok(DType::I64),
            "f8e4m3" | "float8_e4m3fn" => Ok(DType::F8E4M3),
            "f8e5m2" | "float8_e5m2" => Ok(DType::F8E5M2),
            "i8" | "int8" => Ok(DType::I8),
            other => Err(format!(
                "unknown dtype {other:?}; use f32, bf16, f16, u8, i64, f8e4m3, f8e5m2 or i8"
            )),
        }
    }
}

/// A Rust type that can live in tensor storage.
pub trait Element: Copy + Send + Sync + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Widens to f32 for compute.
    fn to_f32(self) -> f32;
    /// Rounds an f32 result into this type (round to nearest even for bf16/f16; u8
    /// rounds and saturates; i64 truncates toward zero).
    fn from_f32(value: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(value: f32) -> Self {
        value
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(value: f32) -> Self {
        bf16::from_f32(value)
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(value: f32) -> Self {
        f16::from_f32(value)
    }
}

impl Element for u8 {
    const DTYPE: DType = DType::U8;
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
    fn from_f32(value: f32) -> Self {
        value.round().clamp(0.0, 255.0) as u8
    }
}

impl Element for i64 {
    const DTYPE: DType = DType::I64;
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn from_f32(value: f32) -> Self {
        value as i64
    }
}

impl Element for F8E4M3 {
    const DTYPE: DType = DType::F8E4M3;
    fn to_f32(self) -> f32 {
        F8E4M3::to_f32(self)
    }
    fn from_f32(value: f32) -> Self {
        F8E4M3::from_f32(value)
    }
}

impl Element for F8E5M2 {
    const DTYPE: DType = DType::F8E5M2;
    fn to_f32(self) -> f32 {
        F8E5M2::to_f32(self)
    }
    fn from_f32(value: f32) -> Self {
        F8E5M2::from_f32(value)
    }
}

impl Element for i8 {
    const DTYPE: DType = DType::I8;
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
    fn from_f32(value: f32) -> Self {
        value.round().clamp(-128.0, 127.0) as i8
    }
}
