//! NumPy `.npy` files (format 1.0/2.0/3.0, C order): `<f4`, `<f8` (read as f32), `<f2`,
//! `|u1`, `<i8`. bf16 has no NumPy dtype and is written as f32.

use std::path::Path;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::tensor::Tensor;

const MAGIC: &[u8] = b"\x93NUMPY";

fn err(path: &Path, reason: impl Into<String>) -> TensorError {
    TensorError::Io {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// Reads a `.npy` file onto `device`.
pub fn read_npy(path: impl AsRef<Path>, device: &Device) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| err(path, e.to_string()))?;
    parse_npy(&bytes, device).map_err(|reason| match reason {
        TensorError::Io { reason, .. } => err(path, reason),
        other => other,
    })
}

/// Parses the bytes of a `.npy` file.
pub fn parse_npy(bytes: &[u8], device: &Device) -> Result<Tensor> {
    let bad = |r: &str| {
        err(
            Path::new("<npy>"),
            format!("not a supported .npy file: {r}"),
        )
    };
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("missing the \\x93NUMPY magic"));
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(bad(&format!("format version {v}"))),
    };
    let header = bytes
        .get(start..start + header_len)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(|| bad("truncated header"))?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}'"))?;
        let rest = header[at + key.len() + 2..]
            .trim_start()
            .strip_prefix(':')?
            .trim_start();
        Some(rest)
    };
    let descr = field("descr")
        .and_then(|r| r.strip_prefix('\''))
        .and_then(|r| r.split('\'').next())
        .ok_or_else(|| bad("no descr"))?;
    if field("fortran_order").is_some_and(|r| r.starts_with("True")) {
        return Err(bad(
            "Fortran order is not supported; save with np.ascontiguousarray",
        ));
    }
    let shape_text = field("shape")
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| bad("no shape"))?;
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| bad("shape is not a tuple of integers"))
        })
        .collect::<Result<Vec<usize>>>()?;
    let data = &bytes[start + header_len..];
    let (dtype, size) = match descr {
        "<f4" => (DType::F32, 4),
        "<f8" => (DType::F32, 8),
        "<f2" => (DType::F16, 2),
        "|u1" | "<u1" => (DType::U8, 1),
        "<i8" => (DType::I64, 8),
        other => {
            return Err(bad(&format!(
                "dtype {other:?} (supported: <f4, <f8, <f2, |u1, <i8)"
            )))
        }
    };
    // The shape is untrusted: its byte count must be addressable before it is compared
    // with the data (which then bounds every allocation). Zero-length axes count as 1
    // here, as the row-major strides of a tensor count them.
    let addressable = shape
        .iter()
        .try_fold(size, |n: usize, &d| n.checked_mul(d.max(1)))
        .is_some();
    if !addressable {
        return Err(bad(&format!(
            "shape {shape:?} is larger than memory can address"
        )));
    }
    let n: usize = shape.iter().product();
    let data = data
        .get(..n * size)
        .ok_or_else(|| bad("data shorter than its shape"))?;
    if descr == "<f8" {
        let values: Vec<f32> = data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
            .collect();
        return Tensor::from_slice(&values, &shape, device);
    }
    Tensor::from_bytes(data, &shape, dtype, device)
}

/// Writes `tensor` as a `.npy` file (format 1.0; bf16 and the 8-bit floats are widened
/// to f32).
pub fn write_npy(path: impl AsRef<Path>, tensor: &Tensor) -> Result<()> {
    let path = path.as_ref();
    let tensor = match tensor.dtype() {
        DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => tensor.to_dtype(DType::F32)?,
        _ => tensor.contiguous()?,
    }
    .to_host()?;
    let descr = match tensor.dtype() {
        DType::F32 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => "<f4",
        DType::F16 => "<f2",
        DType::U8 => "|u1",
        DType::I64 => "<i8",
        DType::I8 => "|i1",
    };
    let shape = match tensor.shape() {
        [d] => format!("({d},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Pad so the data starts on a 64-byte boundary, ending the header with a newline.
    let total = MAGIC.len() + 4 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let bytes = tensor
        .storage_data()
        .ok_or(TensorError::Meta { op: "write_npy" })?;
    let start = tensor.layout().offset() * tensor.dtype().size();
    let data = &bytes[start..start + tensor.numel() * tensor.dtype().size()];
    let mut out = Vec::with_capacity(header.len() + 10 + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).map_err(|e| err(path, e.to_string()))
}
