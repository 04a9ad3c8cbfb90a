//! A read-only index of a zip archive whose entries are *stored* (not compressed), as
//! PyTorch's `torch.save` writes them: each entry's bytes are found through its own
//! local header, so a checkpoint's tensors can be read in place from a memory map.
//!
//! Only what the archive declares is trusted after checking it: the end-of-central-
//! directory record (zip64 included, for checkpoints over 4 GiB), every central
//! directory entry, and each local header it points to must lie inside the file, and
//! an entry's data range must too. A compressed or encrypted entry is refused by name:
//! inflating it would mean a copy, and torch never writes one.

use std::ops::Range;

/// What is wrong with an archive; the message names the entry or record.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ZipError {
    /// A record or entry breaks the format or points outside the file.
    #[error("zip archive: {0}")]
    Corrupt(String),
    /// An entry is compressed or encrypted; only stored entries can be read in place.
    #[error("zip archive: entry {name:?} is {what}; only stored (uncompressed) entries are supported, as torch.save writes them")]
    NotStored {
        /// The entry's name.
        name: String,
        /// "compressed (method N)" or "encrypted".
        what: String,
    },
}

/// One stored entry: its name and where its bytes are in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipEntry {
    /// The entry's path inside the archive.
    pub name: String,
    /// Its bytes, as a range of the whole file.
    pub data: Range<usize>,
}

const EOCD: u32 = 0x0605_4b50;
const ZIP64_LOCATOR: u32 = 0x0706_4b50;
const ZIP64_EOCD: u32 = 0x0606_4b50;
const CENTRAL: u32 = 0x0201_4b50;
const LOCAL: u32 = 0x0403_4b50;

fn corrupt(reason: impl Into<String>) -> ZipError {
    ZipError::Corrupt(reason.into())
}

/// Little-endian reads that fail instead of panicking past the end.
struct At<'a>(&'a [u8]);

impl At<'_> {
    fn bytes(&self, at: usize, n: usize, what: &str) -> Result<&[u8], ZipError> {
        at.checked_add(n)
            .and_then(|end| self.0.get(at..end))
            .ok_or_else(|| corrupt(format!("{what} at byte {at} runs past the end of the file")))
    }

    fn u16(&self, at: usize, what: &str) -> Result<u16, ZipError> {
        let b = self.bytes(at, 2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&self, at: usize, what: &str) -> Result<u32, ZipError> {
        let b = self.bytes(at, 4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&self, at: usize, what: &str) -> Result<u64, ZipError> {
        let b = self.bytes(at, 8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

fn to_usize(v: u64, what: &str) -> Result<usize, ZipError> {
    usize::try_from(v).map_err(|_| corrupt(format!("{what} {v} does not fit in memory")))
}

/// Where the central directory is and how many entries it has.
fn directory(file: &At<'_>) -> Result<(usize, usize, usize), ZipError> {
    let len = file.0.len();
    // The EOCD is 22 bytes plus a comment of at most 65535 bytes, at the very end.
    let earliest = len.saturating_sub(22 + 0xffff);
    let eocd = (earliest..=len.saturating_sub(22))
        .rev()
        .find(|&at| file.u32(at, "end record").is_ok_and(|s| s == EOCD))
        .ok_or_else(|| {
            corrupt("no end-of-central-directory record: not a zip file (or truncated)")
        })?;
    let mut entries = u64::from(file.u16(eocd + 10, "end record")?);
    let mut size = u64::from(file.u32(eocd + 12, "end record")?);
    let mut offset = u64::from(file.u32(eocd + 16, "end record")?);
    // Zip64: a locator just before the EOCD points to the 64-bit record.
    if eocd >= 20 && file.u32(eocd - 20, "zip64 locator")? == ZIP64_LOCATOR {
        let at = to_usize(
            file.u64(eocd - 20 + 8, "zip64 locator")?,
            "zip64 record offset",
        )?;
        if file.u32(at, "zip64 end record")? != ZIP64_EOCD {
            return Err(corrupt(format!(
                "zip64 locator points to byte {at}, which holds no zip64 end record"
            )));
        }
        entries = file.u64(at + 32, "zip64 end record")?;
        size = file.u64(at + 40, "zip64 end record")?;
        offset = file.u64(at + 48, "zip64 end record")?;
    }
    let (offset, size) = (
        to_usize(offset, "central directory offset")?,
        to_usize(size, "central directory size")?,
    );
    if offset.checked_add(size).is_none_or(|end| end > len) {
        return Err(corrupt(format!(
            "central directory (bytes {offset}..+{size}) lies outside the {len}-byte file"
        )));
    }
    // Each entry takes at least 46 bytes, which bounds a hostile count.
    let entries = to_usize(entries, "entry count")?;
    if entries > size / 46 + 1 {
        return Err(corrupt(format!(
            "{entries} entries cannot fit a {size}-byte central directory"
        )));
    }
    Ok((offset, size, entries))
}

/// The zip64 extended-information field's values, in the order the zip spec lists
/// them, for those 32-bit fields that are saturated.
fn zip64_extra(extra: &[u8], fields: [&mut u64; 3], name: &str) -> Result<(), ZipError> {
    let mut at = 0;
    while at + 4 <= extra.len() {
        let id = u16::from_le_bytes([extra[at], extra[at + 1]]);
        let n = usize::from(u16::from_le_bytes([extra[at + 2], extra[at + 3]]));
        let body = extra
            .get(at + 4..at + 4 + n)
            .ok_or_else(|| corrupt(format!("entry {name:?}: extra field runs past its end")))?;
        if id == 1 {
            let mut pos = 0;
            for field in fields {
                if *field == u64::from(u32::MAX) {
                    let v = body
                        .get(pos..pos + 8)
                        .ok_or_else(|| corrupt(format!("entry {name:?}: zip64 field too short")))?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(v);
                    *field = u64::from_le_bytes(a);
                    pos += 8;
                }
            }
            return Ok(());
        }
        at += 4 + n;
    }
    Ok(())
}

/// Every entry of the archive `file`, checked: stored, and inside the file.
pub fn stored_entries(file: &[u8]) -> Result<Vec<ZipEntry>, ZipError> {
    let at = At(file);
    let (mut pos, size, count) = directory(&at)?;
    let end = pos + size;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        if pos + 46 > end || at.u32(pos, "central directory entry")? != CENTRAL {
            return Err(corrupt(format!(
                "central directory entry at byte {pos} has no signature"
            )));
        }
        let flags = at.u16(pos + 8, "central directory entry")?;
        let method = at.u16(pos + 10, "central directory entry")?;
        let mut compressed = u64::from(at.u32(pos + 20, "central directory entry")?);
        let mut plain = u64::from(at.u32(pos + 24, "central directory entry")?);
        let name_len = usize::from(at.u16(pos + 28, "central directory entry")?);
        let extra_len = usize::from(at.u16(pos + 30, "central directory entry")?);
        let comment_len = usize::from(at.u16(pos + 32, "central directory entry")?);
        let mut local = u64::from(at.u32(pos + 42, "central directory entry")?);
        let name_bytes = at.bytes(pos + 46, name_len, "entry name")?;
        let name = String::from_utf8_lossy(name_bytes).into_owned();
        let extra = at.bytes(pos + 46 + name_len, extra_len, "entry extra field")?;
        zip64_extra(extra, [&mut plain, &mut compressed, &mut local], &name)?;
        pos += 46 + name_len + extra_len + comment_len;
        if flags & 1 != 0 {
            return Err(ZipError::NotStored {
                name,
                what: "encrypted".into(),
            });
        }
        if method != 0 || compressed != plain {
            return Err(ZipError::NotStored {
                name,
                what: format!("compressed (method {method})"),
            });
        }
        let local = to_usize(local, "local header offset")?;
        if at.u32(local, "local header")? != LOCAL {
            return Err(corrupt(format!(
                "entry {name:?}: no local header at byte {local}"
            )));
        }
        let local_name = usize::from(at.u16(local + 26, "local header")?);
        let local_extra = usize::from(at.u16(local + 28, "local header")?);
        let start = local + 30 + local_name + local_extra;
        let len = to_usize(plain, "entry size")?;
        let stop = start.checked_add(len).filter(|&e| e <= file.len()).ok_or_else(|| {
            corrupt(format!(
                "entry {name:?}: {len} bytes from byte {start} run past the end of the {}-byte file (truncated download?)",
                file.len()
            ))
        })?;
        out.push(ZipEntry {
            name,
            data: start..stop,
        });
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stored zip written by hand: local headers, central directory, EOCD.
    pub(crate) fn stored_zip(entries: &[(&str, &[u8])], method: u16) -> Vec<u8> {
        let mut out = Vec::new();
        let mut central = Vec::new();
        for (name, data) in entries {
            let offset = out.len() as u32;
            let header = |sig: u32, out: &mut Vec<u8>| {
                out.extend_from_slice(&sig.to_le_bytes());
            };
            header(LOCAL, &mut out);
            out.extend_from_slice(&[20, 0, 0, 0]);
            out.extend_from_slice(&method.to_le_bytes());
            out.extend_from_slice(&[0; 8]); // time, date, crc
            out.extend_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(data);
            header(CENTRAL, &mut central);
            central.extend_from_slice(&[20, 0, 20, 0, 0, 0]);
            central.extend_from_slice(&method.to_le_bytes());
            central.extend_from_slice(&[0; 8]);
            central.extend_from_slice(&(data.len() as u32).to_le_bytes());
            central.extend_from_slice(&(data.len() as u32).to_le_bytes());
            central.extend_from_slice(&(name.len() as u16).to_le_bytes());
            central.extend_from_slice(&[0; 12]);
            central.extend_from_slice(&offset.to_le_bytes());
            central.extend_from_slice(name.as_bytes());
        }
        let cd_offset = out.len() as u32;
        out.extend_from_slice(&central);
        out.extend_from_slice(&EOCD.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
        out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
        out.extend_from_slice(&(central.len() as u32).to_le_bytes());
        out.extend_from_slice(&cd_offset.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out
    }

    #[test]
    fn stored_entries_are_found_through_their_local_headers() {
        let zip = stored_zip(&[("a/data.pkl", b"xyz"), ("a/data/0", b"0123")], 0);
        let entries = stored_entries(&zip).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(&zip[entries[0].data.clone()], b"xyz");
        assert_eq!(entries[1].name, "a/data/0");
        assert_eq!(&zip[entries[1].data.clone()], b"0123");
    }

    /// One stored entry written the zip64 way (as torch does past 4 GiB): saturated
    /// 32-bit fields, the real values in a zip64 extra field, a zip64 end record and
    /// its locator before the classic end record.
    fn zip64_zip(name: &str, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&LOCAL.to_le_bytes());
        out.extend_from_slice(&[45, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&[0xff; 8]);
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&20u16.to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(data);
        let cd_offset = out.len() as u64;
        let mut central = Vec::new();
        central.extend_from_slice(&CENTRAL.to_le_bytes());
        central.extend_from_slice(&[45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        central.extend_from_slice(&[0xff; 8]);
        central.extend_from_slice(&(name.len() as u16).to_le_bytes());
        central.extend_from_slice(&28u16.to_le_bytes());
        central.extend_from_slice(&[0; 10]);
        central.extend_from_slice(&[0xff; 4]);
        central.extend_from_slice(name.as_bytes());
        central.extend_from_slice(&1u16.to_le_bytes());
        central.extend_from_slice(&24u16.to_le_bytes());
        central.extend_from_slice(&(data.len() as u64).to_le_bytes());
        central.extend_from_slice(&(data.len() as u64).to_le_bytes());
        central.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&central);
        let record = out.len() as u64;
        out.extend_from_slice(&ZIP64_EOCD.to_le_bytes());
        out.extend_from_slice(&44u64.to_le_bytes());
        out.extend_from_slice(&[45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&1u64.to_le_bytes());
        out.extend_from_slice(&1u64.to_le_bytes());
        out.extend_from_slice(&(central.len() as u64).to_le_bytes());
        out.extend_from_slice(&cd_offset.to_le_bytes());
        out.extend_from_slice(&ZIP64_LOCATOR.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&record.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&EOCD.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&[0xff; 4]);
        out.extend_from_slice(&[0xff; 8]);
        out.extend_from_slice(&0u16.to_le_bytes());
        out
    }

    #[test]
    fn zip64_records_and_extra_fields_are_followed() {
        let zip = zip64_zip("big/data/0", b"0123456789");
        let entries = stored_entries(&zip).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].name, "big/data/0");
        assert_eq!(&zip[entries[0].data.clone()], b"0123456789");
    }

    #[test]
    fn a_compressed_entry_is_refused_by_name() {
        let zip = stored_zip(&[("a/data.pkl", b"xyz")], 8);
        let err = stored_entries(&zip).unwrap_err().to_string();
        assert!(
            err.contains("\"a/data.pkl\"") && err.contains("compressed (method 8)"),
            "{err}"
        );
    }

    #[test]
    fn a_truncated_archive_is_refused() {
        let zip = stored_zip(&[("a/data/0", &[7u8; 100])], 0);
        assert!(stored_entries(&zip[..zip.len() - 10]).is_err());
        assert!(stored_entries(&zip[..60]).is_err());
        assert!(stored_entries(b"").is_err());
    }
}
