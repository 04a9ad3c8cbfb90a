//! The pickle writer: [`to_pickle`] serialises a [`PickleValue`] tree as protocol 2
//! with only the opcodes pytorch.org/memory_viz's unpickler understands (and protocol
//! 3's byte opcodes for bytes), no memo.

use super::opcode::*;
use super::PickleValue;

/// CPython batches APPENDS/SETITEMS in groups of this size; so do we.
const BATCH: usize = 1000;

/// Serialise with protocol 2 using only opcodes memory_viz's unpickler understands.
pub fn to_pickle(value: &PickleValue) -> Vec<u8> {
    let mut out = vec![PROTO, 2];
    write_value(value, &mut out);
    out.push(STOP);
    out
}

fn write_value(value: &PickleValue, out: &mut Vec<u8>) {
    match value {
        PickleValue::None => out.push(NONE),
        PickleValue::Bool(true) => out.push(NEWTRUE),
        PickleValue::Bool(false) => out.push(NEWFALSE),
        PickleValue::Int(i) => write_int(*i, out),
        PickleValue::Float(f) => {
            out.push(BINFLOAT);
            out.extend_from_slice(&f.to_be_bytes());
        }
        PickleValue::Str(s) => {
            // BINUNICODE8 only past 4 GiB, where memory_viz could not cope anyway.
            write_sized(BINUNICODE, BINUNICODE8, s.as_bytes(), out);
        }
        PickleValue::Bytes(b) => match u8::try_from(b.len()) {
            Ok(n) => {
                out.extend_from_slice(&[SHORT_BINBYTES, n]);
                out.extend_from_slice(b);
            }
            Err(_) => write_sized(BINBYTES, BINBYTES8, b, out),
        },
        PickleValue::List(items) => {
            out.push(EMPTY_LIST);
            for batch in items.chunks(BATCH) {
                out.push(MARK);
                batch.iter().for_each(|item| write_value(item, out));
                out.push(APPENDS);
            }
        }
        PickleValue::Tuple(items) if items.is_empty() => out.push(EMPTY_TUPLE),
        PickleValue::Tuple(items) => {
            out.push(MARK);
            items.iter().for_each(|item| write_value(item, out));
            out.push(TUPLE);
        }
        PickleValue::Dict(pairs) => {
            out.push(EMPTY_DICT);
            for batch in pairs.chunks(BATCH) {
                out.push(MARK);
                for (k, v) in batch {
                    write_value(k, out);
                    write_value(v, out);
                }
                out.push(SETITEMS);
            }
        }
        PickleValue::Global { module, name } => {
            out.push(GLOBAL);
            for part in [module, name] {
                out.extend_from_slice(part.as_bytes());
                out.push(b'\n');
            }
        }
        PickleValue::Call { callable, args } => {
            write_value(callable, out);
            write_value(args, out);
            out.push(REDUCE);
        }
        PickleValue::Persistent(id) => {
            write_value(id, out);
            out.push(BINPERSID);
        }
    }
}

/// Writes `data` behind a u32 length, or behind a u64 length if it is that big.
fn write_sized(op4: u8, op8: u8, data: &[u8], out: &mut Vec<u8>) {
    match u32::try_from(data.len()) {
        Ok(n) => {
            out.push(op4);
            out.extend_from_slice(&n.to_le_bytes());
        }
        Err(_) => {
            out.push(op8);
            out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        }
    }
    out.extend_from_slice(data);
}

fn write_int(i: i64, out: &mut Vec<u8>) {
    if let Ok(b) = u8::try_from(i) {
        out.extend_from_slice(&[BININT1, b]);
    } else if let Ok(h) = u16::try_from(i) {
        out.push(BININT2);
        out.extend_from_slice(&h.to_le_bytes());
    } else if let Ok(w) = i32::try_from(i) {
        out.push(BININT);
        out.extend_from_slice(&w.to_le_bytes());
    } else {
        // Minimal two's complement, as CPython writes it: the value's bits
        // plus a sign bit, rounded up to whole bytes (5..=8 here).
        // (`i ^ (i >> 63)` flips negatives, so leading ones count as zeros.)
        let redundant = (i ^ (i >> 63)).leading_zeros();
        let n = (65 - redundant).div_ceil(8) as usize;
        let bytes = i.to_le_bytes();
        let bytes = bytes.get(..n).unwrap_or(&bytes);
        out.extend_from_slice(&[LONG1, bytes.len() as u8]);
        out.extend_from_slice(bytes);
    }
}
