//! A small Python pickle codec for PyTorch memory snapshots.
//!
//! `torch.cuda.memory._dump_snapshot` writes the dict returned by
//! `torch.cuda.memory._snapshot()` with `pickle.dump`, and pytorch.org/memory_viz
//! reads it back with a tiny JavaScript unpickler that accepts only protocols
//! 2..=4 and a fixed set of opcodes. This module reads and writes that format,
//! so headroom's snapshots open in memory_viz and PyTorch's open in headroom.
//!
//! [`to_pickle`] writes protocol 2 with only opcodes memory_viz understands:
//! PROTO, EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE, MARK, SETITEMS, APPENDS, TUPLE,
//! NONE, NEWTRUE, NEWFALSE, BININT1, BININT2, BININT, LONG1, BINFLOAT,
//! BINUNICODE and STOP. Bytes, which snapshots never hold, use protocol 3's
//! SHORT_BINBYTES/BINBYTES. It writes no memo opcodes: values are trees.
//!
//! [`from_pickle`] reads what CPython's `pickle.dump` writes for None, bool,
//! int, float, str, bytes, list, tuple and dict with protocols 2..=4 (and
//! binary pickles without a PROTO header): all of the above plus FRAME,
//! MEMOIZE, BINPUT, LONG_BINPUT, BINGET, LONG_BINGET, SHORT_BINUNICODE,
//! BINUNICODE8, BINBYTES8, TUPLE1..3, APPEND, SETITEM, DICT, LIST, POP,
//! POP_MARK, DUP, LONG4 and EMPTY_SET/ADDITEMS (a set becomes a `List`).
//! Opcodes that name or build arbitrary Python objects (GLOBAL, REDUCE, BUILD,
//! STACK_GLOBAL, NEWOBJ, ...) are refused: snapshots never need them, and they
//! are how a pickle runs code.
//!
//! [`from_pickle_restricted`] is the same reader for pickles that must name a few
//! Python globals (PyTorch checkpoints, read by `headroom_tensor::io::pth`): GLOBAL and
//! STACK_GLOBAL are accepted only for names on the caller's allow-list, and REDUCE,
//! BUILD and BINPERSID are *recorded* as [`PickleValue::Call`] and
//! [`PickleValue::Persistent`] values, never executed. The one call it interprets itself is
//! `collections.OrderedDict()`, which becomes a plain dict so that SETITEMS can fill it;
//! BUILD on a dict drops the state (attributes such as a state dict's `_metadata`).
//!
//! The codec's parts: `opcode` names the opcode bytes both directions share, `write`
//! serialises ([`to_pickle`]) and `read` parses ([`from_pickle`],
//! [`from_pickle_restricted`]).

mod opcode;
mod read;
mod write;

pub use read::{from_pickle, from_pickle_restricted};
pub use write::to_pickle;

/// A Python value as it appears in a memory snapshot pickle.
#[derive(Debug, Clone, PartialEq)]
pub enum PickleValue {
    /// Python `None`.
    None,
    /// Python `bool`.
    Bool(bool),
    /// Python `int` that fits in 64 bits.
    Int(i64),
    /// Python `float`.
    Float(f64),
    /// Python `str`.
    Str(String),
    /// Python `bytes`.
    Bytes(Vec<u8>),
    /// Python `list` (and, when read, `set`).
    List(Vec<PickleValue>),
    /// Python `tuple`.
    Tuple(Vec<PickleValue>),
    /// Python `dict`, in insertion order.
    Dict(Vec<(PickleValue, PickleValue)>),
    /// A global `module.name` that the allow-list let the pickle name; never resolved.
    Global {
        /// The module, e.g. `torch._utils`.
        module: String,
        /// The name in it, e.g. `_rebuild_tensor_v2`.
        name: String,
    },
    /// A call the pickle asks for (REDUCE), recorded and never made.
    Call {
        /// What would be called (a [`PickleValue::Global`] in well-formed files).
        callable: Box<PickleValue>,
        /// The argument tuple.
        args: Box<PickleValue>,
    },
    /// A persistent id (BINPERSID) that the file's owner resolves (torch: a storage).
    Persistent(Box<PickleValue>),
}

/// Errors reading a pickle.
#[derive(Debug, thiserror::Error)]
pub enum PickleError {
    /// An opcode this reader does not implement, e.g. GLOBAL or REDUCE.
    #[error("unsupported pickle opcode {} at byte {offset}", describe(*.opcode))]
    UnsupportedOpcode {
        /// The opcode byte.
        opcode: u8,
        /// Where it is in the input.
        offset: usize,
    },
    /// A PROTO opcode naming a protocol outside 2..=4.
    #[error("pickle protocol {protocol} at byte {offset} is not supported (2..=4)")]
    UnsupportedProtocol {
        /// The protocol number.
        protocol: u8,
        /// Where the number is in the input.
        offset: usize,
    },
    /// The input ends inside an opcode's argument.
    #[error("truncated pickle at byte {offset} (inside opcode {} at byte {opcode_offset})", describe(*.opcode))]
    Truncated {
        /// Where the input ran out.
        offset: usize,
        /// The opcode whose argument was cut off.
        opcode: u8,
        /// Where that opcode is.
        opcode_offset: usize,
    },
    /// A LONG1/LONG4 integer outside the i64 range.
    #[error("integer at byte {offset} does not fit in 64 bits")]
    IntegerOverflow {
        /// Where the integer's opcode is.
        offset: usize,
    },
    /// An opcode found the stack not as it needs it, e.g. APPEND with no list.
    #[error("malformed pickle: opcode {} at byte {offset} {reason}", describe(*.opcode))]
    Malformed {
        /// The opcode.
        opcode: u8,
        /// Where it is.
        offset: usize,
        /// What was wrong, e.g. "needs a MARK but there is none".
        reason: &'static str,
    },
    /// A memo read of an entry that was never stored.
    #[error("pickle memo entry {index} read at byte {offset} was never stored")]
    MemoMissing {
        /// The memo index.
        index: u64,
        /// Where the read is.
        offset: usize,
    },
    /// A GLOBAL naming something off the caller's allow-list (e.g. `os.system`).
    #[error("pickle names the global {module}.{name} at byte {offset}, which is not allowed here; refusing it (only {allowed} may appear)")]
    GlobalNotAllowed {
        /// The module named.
        module: String,
        /// The name in the module.
        name: String,
        /// Where the GLOBAL is.
        offset: usize,
        /// The allow-list, for the message.
        allowed: String,
    },
    /// The input ends before a STOP opcode.
    #[error("pickle ended without STOP at byte {offset}")]
    MissingStop {
        /// The input's length.
        offset: usize,
    },
    /// The value nests deeper than the reader allows, or contains itself.
    #[error("pickle value nests deeper than {limit} levels (or contains itself)")]
    TooDeep {
        /// The nesting limit.
        limit: usize,
    },
    /// Shared references expand the value past the reader's size limit.
    #[error("pickle value expands to more than {limit} bytes through shared references")]
    TooLarge {
        /// The limit on the bytes of the values built (each value and the text it owns).
        limit: usize,
    },
}

/// Result of reading a pickle.
pub type PickleResult<T> = std::result::Result<T, PickleError>;

/// `0x63 ('c')` for printable opcodes, `0x93` for the rest.
fn describe(opcode: u8) -> String {
    if opcode.is_ascii_graphic() {
        format!("{opcode:#04x} ('{}')", char::from(opcode))
    } else {
        format!("{opcode:#04x}")
    }
}

impl PickleValue {
    /// The value under string key `key` of a dict (the last one, as Python keeps).
    pub fn get(&self, key: &str) -> Option<&PickleValue> {
        self.as_dict()?
            .iter()
            .rev()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// The integer, if this is an `Int`.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            PickleValue::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The float, if this is a `Float`.
    pub fn as_float(&self) -> Option<f64> {
        match self {
            PickleValue::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The bool, if this is a `Bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            PickleValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The string, if this is a `Str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            PickleValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The items, if this is a `List` or a `Tuple`.
    pub fn as_list(&self) -> Option<&[PickleValue]> {
        match self {
            PickleValue::List(items) | PickleValue::Tuple(items) => Some(items),
            _ => None,
        }
    }

    /// The key/value pairs, if this is a `Dict`.
    pub fn as_dict(&self) -> Option<&[(PickleValue, PickleValue)]> {
        match self {
            PickleValue::Dict(pairs) => Some(pairs),
            _ => None,
        }
    }

    /// A dict with string keys, in the given order.
    pub fn dict<K: Into<String>>(items: impl IntoIterator<Item = (K, PickleValue)>) -> PickleValue {
        PickleValue::Dict(
            items
                .into_iter()
                .map(|(k, v)| (PickleValue::Str(k.into()), v))
                .collect(),
        )
    }

    /// A `Str`.
    pub fn str(s: impl Into<String>) -> PickleValue {
        PickleValue::Str(s.into())
    }
}

/// Integers wider than i64 saturate at `i64::MAX`: no byte count or address
/// gets near it, and saturating keeps conversion panic-free.
macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for PickleValue {
            fn from(v: $t) -> Self {
                PickleValue::Int(i64::try_from(v).unwrap_or(i64::MAX))
            }
        }
    )*};
}
from_int!(i32, i64, u32, u64, usize);

impl From<bool> for PickleValue {
    fn from(v: bool) -> Self {
        PickleValue::Bool(v)
    }
}

impl From<f64> for PickleValue {
    fn from(v: f64) -> Self {
        PickleValue::Float(v)
    }
}

impl From<&str> for PickleValue {
    fn from(v: &str) -> Self {
        PickleValue::Str(v.to_owned())
    }
}

impl From<String> for PickleValue {
    fn from(v: String) -> Self {
        PickleValue::Str(v)
    }
}

impl From<Vec<PickleValue>> for PickleValue {
    fn from(v: Vec<PickleValue>) -> Self {
        PickleValue::List(v)
    }
}

#[cfg(test)]
mod tests;
