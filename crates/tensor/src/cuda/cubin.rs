//! The parameter table of every kernel in a cubin: the size of each parameter, read from
//! the `.nv.info.<kernel>` ELF sections ptxas writes (attribute `EIATTR_KPARAM_INFO`).
//! The checked launcher holds every launch's arguments against it, so a wrong argument
//! list is found on a machine without a GPU.

use std::collections::HashMap;

use super::error::{CudaError, Result};

/// `EIFMT_SVAL`: an attribute with a 16-bit length and a payload.
const EIFMT_SVAL: u8 = 4;
/// `EIFMT_HVAL`: an attribute with a 16-bit value.
const EIFMT_HVAL: u8 = 3;
/// `EIFMT_BVAL`: an attribute with an 8-bit value.
const EIFMT_BVAL: u8 = 2;
/// `EIATTR_KPARAM_INFO`: one kernel parameter (ordinal, offset, size).
const EIATTR_KPARAM_INFO: u8 = 0x17;

fn bad(reason: impl Into<String>) -> CudaError {
    CudaError::Launch {
        kernel: "cubin".into(),
        reason: reason.into(),
    }
}

fn u16_at(d: &[u8], at: usize) -> Result<u16> {
    d.get(at..at + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or_else(|| bad(format!("truncated at byte {at}")))
}

fn u32_at(d: &[u8], at: usize) -> Result<u32> {
    d.get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| bad(format!("truncated at byte {at}")))
}

fn u64_at(d: &[u8], at: usize) -> Result<u64> {
    d.get(at..at + 8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| bad(format!("truncated at byte {at}")))
}

/// Parameter sizes in bytes, by ordinal, of every kernel of `cubin` (a 64-bit ELF).
pub fn kernel_params(cubin: &[u8]) -> Result<HashMap<String, Vec<usize>>> {
    if cubin.get(..4) != Some(b"\x7fELF") || cubin.get(4) != Some(&2) {
        return Err(bad("not a 64-bit ELF file"));
    }
    let shoff = u64_at(cubin, 0x28)? as usize;
    let shentsize = u16_at(cubin, 0x3a)? as usize;
    let shnum = u16_at(cubin, 0x3c)? as usize;
    let shstrndx = u16_at(cubin, 0x3e)? as usize;
    let section = |i: usize| -> Result<(u32, usize, usize)> {
        let at = shoff + i * shentsize;
        Ok((
            u32_at(cubin, at)?,
            u64_at(cubin, at + 0x18)? as usize,
            u64_at(cubin, at + 0x20)? as usize,
        ))
    };
    let (_, names_at, names_len) = section(shstrndx)?;
    let names = cubin
        .get(names_at..names_at + names_len)
        .ok_or_else(|| bad("section names out of the file"))?;
    let mut out = HashMap::new();
    for i in 0..shnum {
        let (name_at, off, size) = section(i)?;
        let name = names
            .get(name_at as usize..)
            .and_then(|n| n.split(|&b| b == 0).next())
            .and_then(|n| std::str::from_utf8(n).ok())
            .ok_or_else(|| bad(format!("section {i} has no name")))?;
        let Some(kernel) = name.strip_prefix(".nv.info.") else {
            continue;
        };
        let data = cubin
            .get(off..off + size)
            .ok_or_else(|| bad(format!("section {name} out of the file")))?;
        let mut params: Vec<(u16, usize)> = Vec::new();
        let mut p = 0;
        while p + 2 <= data.len() {
            let (format, attr) = (data[p], data[p + 1]);
            match format {
                EIFMT_SVAL => {
                    let len = u16_at(data, p + 2)? as usize;
                    let payload = data
                        .get(p + 4..p + 4 + len)
                        .ok_or_else(|| bad(format!("{name}: attribute past the section")))?;
                    if attr == EIATTR_KPARAM_INFO && payload.len() >= 12 {
                        let ordinal = u16_at(payload, 4)?;
                        let size = (u32_at(payload, 8)? >> 18) as usize;
                        params.push((ordinal, size));
                    }
                    p += 4 + len;
                }
                EIFMT_HVAL => p += 4,
                EIFMT_BVAL => p += 3,
                _ => p += 2,
            }
        }
        params.sort_unstable();
        let sizes: Vec<usize> = params.iter().map(|&(_, s)| s).collect();
        if params
            .iter()
            .enumerate()
            .any(|(i, &(o, _))| o as usize != i)
        {
            return Err(bad(format!(
                "{name}: parameter ordinals are not 0..{}",
                sizes.len()
            )));
        }
        out.insert(kernel.to_string(), sizes);
    }
    Ok(out)
}
