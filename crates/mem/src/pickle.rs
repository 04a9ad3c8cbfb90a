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
//! Python globals (PyTorch checkpoints, see [`crate::pth`]): GLOBAL and STACK_GLOBAL
//! are accepted only for names on the caller's allow-list, and REDUCE, BUILD and
//! BINPERSID are *recorded* as [`PickleValue::Call`] and [`PickleValue::Persistent`]
//! values, never executed. The one call it interprets itself is
//! `collections.OrderedDict()`, which becomes a plain dict so that SETITEMS can fill it;
//! BUILD on a dict drops the state (attributes such as a state dict's `_metadata`).

use std::collections::HashMap;

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
    #[error("pickle value expands to more than {limit} values through shared references")]
    TooLarge {
        /// The limit on values built.
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

// Opcode bytes, named as in CPython's pickletools.
const MARK: u8 = b'(';
const STOP: u8 = b'.';
const POP: u8 = b'0';
const POP_MARK: u8 = b'1';
const DUP: u8 = b'2';
const BINBYTES: u8 = b'B';
const SHORT_BINBYTES: u8 = b'C';
const BINFLOAT: u8 = b'G';
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const NONE: u8 = b'N';
const BINUNICODE: u8 = b'X';
const EMPTY_LIST: u8 = b']';
const APPEND: u8 = b'a';
const DICT: u8 = b'd';
const APPENDS: u8 = b'e';
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';
const LIST: u8 = b'l';
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const SETITEM: u8 = b's';
const TUPLE: u8 = b't';
const SETITEMS: u8 = b'u';
const EMPTY_DICT: u8 = b'}';
const EMPTY_TUPLE: u8 = b')';
const PROTO: u8 = 0x80;
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const LONG1: u8 = 0x8a;
const LONG4: u8 = 0x8b;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE8: u8 = 0x8d;
const BINBYTES8: u8 = 0x8e;
const EMPTY_SET: u8 = 0x8f;
const ADDITEMS: u8 = 0x90;
const MEMOIZE: u8 = 0x94;
const FRAME: u8 = 0x95;
const GLOBAL: u8 = b'c';
const STACK_GLOBAL: u8 = 0x93;
const REDUCE: u8 = b'R';
const BUILD: u8 = b'b';
const BINPERSID: u8 = b'Q';

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

const NO_VALUE: &str = "needs a value but the stack has none";

/// How deeply values may nest. Snapshots nest about 7 levels; the limit keeps
/// recursion (here, and in `Drop`/`Debug`/`PartialEq`) off the stack's edge and
/// turns self-containing values into an error.
const MAX_DEPTH: usize = 512;

/// Parse a pickle (protocols 2..=4, or binary opcodes without a PROTO header).
pub fn from_pickle(bytes: &[u8]) -> PickleResult<PickleValue> {
    read(bytes, None)
}

/// Parse a pickle that may name the globals in `allowed` (`(module, name)` pairs):
/// REDUCE and BINPERSID become [`PickleValue::Call`] / [`PickleValue::Persistent`]
/// records, nothing is ever called, and any other global is refused by name.
pub fn from_pickle_restricted(bytes: &[u8], allowed: &[(&str, &str)]) -> PickleResult<PickleValue> {
    read(bytes, Some(allowed))
}

fn read(bytes: &[u8], globals: Option<&[(&str, &str)]>) -> PickleResult<PickleValue> {
    let mut reader = Reader {
        globals,
        bytes,
        pos: 0,
        op: 0,
        op_at: 0,
        nodes: Vec::new(),
        stack: Vec::new(),
        memo: HashMap::new(),
        // Shared references (BINGET of frame lists) make the tree bigger than
        // the file; a bound that grows with the file stops a tiny hostile
        // pickle from doubling itself into gigabytes, and leaves real
        // snapshots alone.
        limit: bytes.len().saturating_mul(1024).clamp(1 << 22, 1 << 28),
    };
    let root = reader.run()?;
    let mut budget = reader.limit;
    reader.build(root, 0, &mut budget)
}

/// A value under construction. Containers hold node ids so that a list that was
/// memoized and referenced before its items were appended (CPython memoizes
/// the empty list, then fills it) still sees them through every reference.
enum Node {
    Leaf(PickleValue),
    List(Vec<usize>),
    Tuple(Vec<usize>),
    Dict(Vec<(usize, usize)>),
    Call(usize, usize),
    Persistent(usize),
}

enum Slot {
    Mark,
    Value(usize),
}

struct Reader<'a> {
    /// The globals the pickle may name; `None` refuses every object opcode.
    globals: Option<&'a [(&'a str, &'a str)]>,
    bytes: &'a [u8],
    pos: usize,
    /// The opcode being run and its offset, for error messages.
    op: u8,
    op_at: usize,
    nodes: Vec<Node>,
    stack: Vec<Slot>,
    memo: HashMap<u64, usize>,
    /// How many values `build` may make.
    limit: usize,
}

impl<'a> Reader<'a> {
    /// Runs opcodes up to STOP and returns the id of the value it pops.
    fn run(&mut self) -> PickleResult<usize> {
        loop {
            let Some(&op) = self.bytes.get(self.pos) else {
                return Err(PickleError::MissingStop {
                    offset: self.bytes.len(),
                });
            };
            (self.op, self.op_at) = (op, self.pos);
            self.pos += 1;
            if op == STOP {
                return self.pop_value();
            }
            if let Some(node) = self.step(op)? {
                self.stack.push(Slot::Value(self.nodes.len()));
                self.nodes.push(node);
            }
        }
    }

    /// Runs one opcode other than STOP; returns the new value it pushes, if any.
    fn step(&mut self, op: u8) -> PickleResult<Option<Node>> {
        let leaf = |value| Some(Node::Leaf(value));
        Ok(match op {
            PROTO => {
                let protocol = self.byte()?;
                if !(2..=4).contains(&protocol) {
                    let offset = self.op_at + 1;
                    return Err(PickleError::UnsupportedProtocol { protocol, offset });
                }
                None
            }
            // Frames only help buffered readers; the opcodes inside just follow.
            FRAME => self.take(8).map(|_| None)?,
            MARK => {
                self.stack.push(Slot::Mark);
                None
            }
            POP => {
                let popped = self.stack.pop();
                popped
                    .ok_or_else(|| self.malformed(NO_VALUE))
                    .map(|_| None)?
            }
            POP_MARK => self.pop_mark().map(|_| None)?,
            DUP => {
                let top = self.top_value()?;
                self.stack.push(Slot::Value(top));
                None
            }
            NONE => leaf(PickleValue::None),
            NEWTRUE => leaf(PickleValue::Bool(true)),
            NEWFALSE => leaf(PickleValue::Bool(false)),
            BININT1 => leaf(PickleValue::Int(self.byte()?.into())),
            BININT2 => leaf(PickleValue::Int(u16::from_le_bytes(self.array()?).into())),
            BININT => leaf(PickleValue::Int(i32::from_le_bytes(self.array()?).into())),
            // LONG4's length is signed in CPython; a "negative" one read as
            // unsigned is over 2 GiB and ends as a truncation error.
            LONG1 | LONG4 => {
                let bytes = self.sized(if op == LONG1 { 1 } else { 4 })?;
                let value = decode_long(bytes)
                    .ok_or(PickleError::IntegerOverflow { offset: self.op_at })?;
                leaf(PickleValue::Int(value))
            }
            BINFLOAT => leaf(PickleValue::Float(f64::from_be_bytes(self.array()?))),
            // Lossy: CPython writes lone surrogates (say, an undecodable file
            // name in a stack frame) as invalid UTF-8, and one odd frame should
            // not make a whole snapshot unreadable.
            SHORT_BINUNICODE | BINUNICODE | BINUNICODE8 => {
                let text = String::from_utf8_lossy(self.sized(width(op))?);
                leaf(PickleValue::Str(text.into_owned()))
            }
            SHORT_BINBYTES | BINBYTES | BINBYTES8 => {
                leaf(PickleValue::Bytes(self.sized(width(op))?.to_vec()))
            }
            EMPTY_LIST | EMPTY_SET => Some(Node::List(Vec::new())),
            EMPTY_DICT => Some(Node::Dict(Vec::new())),
            EMPTY_TUPLE => Some(Node::Tuple(Vec::new())),
            LIST => Some(Node::List(self.pop_mark()?)),
            TUPLE => Some(Node::Tuple(self.pop_mark()?)),
            TUPLE1 | TUPLE2 | TUPLE3 => {
                let mut items = Vec::with_capacity(3);
                for _ in TUPLE1..=op {
                    items.push(self.pop_value()?);
                }
                items.reverse();
                Some(Node::Tuple(items))
            }
            DICT => {
                let items = self.pop_mark()?;
                Some(Node::Dict(self.pairs(items)?))
            }
            APPEND => {
                let item = self.pop_value()?;
                self.list_mut()?.push(item);
                None
            }
            APPENDS | ADDITEMS => {
                let items = self.pop_mark()?;
                self.list_mut()?.extend(items);
                None
            }
            SETITEM => {
                let value = self.pop_value()?;
                let key = self.pop_value()?;
                self.dict_mut()?.push((key, value));
                None
            }
            SETITEMS => {
                let items = self.pop_mark()?;
                let pairs = self.pairs(items)?;
                self.dict_mut()?.extend(pairs);
                None
            }
            MEMOIZE | BINPUT | LONG_BINPUT => {
                // MEMOIZE stores at the next free index, as CPython does.
                let index = match op {
                    MEMOIZE => self.memo.len() as u64,
                    _ => self.uint(width(op))?,
                };
                let id = self.top_value()?;
                self.memo.insert(index, id);
                None
            }
            BINGET | LONG_BINGET => {
                let index = self.uint(width(op))?;
                let Some(&id) = self.memo.get(&index) else {
                    let offset = self.op_at;
                    return Err(PickleError::MemoMissing { index, offset });
                };
                self.stack.push(Slot::Value(id));
                None
            }
            GLOBAL | STACK_GLOBAL | REDUCE | BUILD | BINPERSID if self.globals.is_some() => {
                self.object_step(op)?
            }
            _ => {
                let offset = self.op_at;
                return Err(PickleError::UnsupportedOpcode { opcode: op, offset });
            }
        })
    }

    /// The object opcodes of a restricted read: names are checked against the
    /// allow-list, calls and persistent ids are recorded, nothing runs.
    fn object_step(&mut self, op: u8) -> PickleResult<Option<Node>> {
        Ok(match op {
            GLOBAL => {
                let module = self.line()?;
                let name = self.line()?;
                Some(self.global(module, name)?)
            }
            STACK_GLOBAL => {
                let name = self.pop_value()?;
                let module = self.pop_value()?;
                let text = |id: usize| match self.nodes.get(id) {
                    Some(Node::Leaf(PickleValue::Str(s))) => Some(s.clone()),
                    _ => None,
                };
                let (Some(module), Some(name)) = (text(module), text(name)) else {
                    return Err(self.malformed("needs two strings (module, name)"));
                };
                Some(self.global(module, name)?)
            }
            REDUCE => {
                let args = self.pop_value()?;
                let callable = self.pop_value()?;
                let ordered_dict = matches!(
                    self.nodes.get(callable),
                    Some(Node::Leaf(PickleValue::Global { module, name }))
                        if module == "collections" && name == "OrderedDict"
                );
                let no_args =
                    matches!(self.nodes.get(args), Some(Node::Tuple(items)) if items.is_empty());
                if ordered_dict && no_args {
                    // The only call interpreted: an empty OrderedDict is a dict that
                    // SETITEMS then fills.
                    Some(Node::Dict(Vec::new()))
                } else {
                    Some(Node::Call(callable, args))
                }
            }
            BUILD => {
                let _state = self.pop_value()?;
                match self.top_value().map(|id| self.nodes.get(id)) {
                    Ok(Some(Node::Dict(_))) => None,
                    _ => return Err(self.malformed("sets state on something other than a dict")),
                }
            }
            _ => {
                let id = self.pop_value()?;
                Some(Node::Persistent(id))
            }
        })
    }

    /// A GLOBAL node for `module.name` if the allow-list has it, else the refusal.
    fn global(&self, module: String, name: String) -> PickleResult<Node> {
        let allowed = self.globals.unwrap_or_default();
        if allowed.iter().any(|&(m, n)| m == module && n == name) {
            return Ok(Node::Leaf(PickleValue::Global { module, name }));
        }
        let list: Vec<String> = allowed.iter().map(|(m, n)| format!("{m}.{n}")).collect();
        Err(PickleError::GlobalNotAllowed {
            module,
            name,
            offset: self.op_at,
            allowed: list.join(", "),
        })
    }

    /// A GLOBAL argument: text up to a newline (at most 256 bytes).
    fn line(&mut self) -> PickleResult<String> {
        let rest = self.bytes.get(self.pos..).unwrap_or_default();
        let Some(n) = rest.iter().take(256).position(|&b| b == b'\n') else {
            return Err(PickleError::Truncated {
                offset: self.bytes.len().min(self.pos + 256),
                opcode: self.op,
                opcode_offset: self.op_at,
            });
        };
        let text = String::from_utf8_lossy(&rest[..n]).into_owned();
        self.pos += n + 1;
        Ok(text)
    }

    /// The next `n` bytes, or a truncation error.
    fn take(&mut self, n: u64) -> PickleResult<&'a [u8]> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n));
        match end.and_then(|end| Some((self.bytes.get(self.pos..end)?, end))) {
            Some((slice, end)) => {
                self.pos = end;
                Ok(slice)
            }
            None => Err(PickleError::Truncated {
                offset: self.bytes.len(),
                opcode: self.op,
                opcode_offset: self.op_at,
            }),
        }
    }

    fn array<const N: usize>(&mut self) -> PickleResult<[u8; N]> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N as u64)?);
        Ok(array)
    }

    fn byte(&mut self) -> PickleResult<u8> {
        let [b] = self.array()?;
        Ok(b)
    }

    /// An unsigned little-endian integer `width` (at most 8) bytes wide.
    fn uint(&mut self, width: u64) -> PickleResult<u64> {
        let bytes = self.take(width)?;
        Ok(bytes.iter().rev().fold(0, |n, &b| n << 8 | u64::from(b)))
    }

    /// Data behind a little-endian length `width` bytes wide.
    fn sized(&mut self, width: u64) -> PickleResult<&'a [u8]> {
        let n = self.uint(width)?;
        self.take(n)
    }

    fn malformed(&self, reason: &'static str) -> PickleError {
        PickleError::Malformed {
            opcode: self.op,
            offset: self.op_at,
            reason,
        }
    }

    fn top_value(&self) -> PickleResult<usize> {
        match self.stack.last() {
            Some(Slot::Value(id)) => Ok(*id),
            _ => Err(self.malformed(NO_VALUE)),
        }
    }

    fn pop_value(&mut self) -> PickleResult<usize> {
        let id = self.top_value()?;
        self.stack.pop();
        Ok(id)
    }

    /// Pops everything above the topmost MARK, and the MARK.
    fn pop_mark(&mut self) -> PickleResult<Vec<usize>> {
        let Some(at) = self.stack.iter().rposition(|s| matches!(s, Slot::Mark)) else {
            return Err(self.malformed("needs a MARK but there is none"));
        };
        let items = self.stack.drain(at..).filter_map(|slot| match slot {
            Slot::Value(id) => Some(id),
            Slot::Mark => None,
        });
        Ok(items.collect())
    }

    fn pairs(&self, items: Vec<usize>) -> PickleResult<Vec<(usize, usize)>> {
        if items.len() % 2 == 1 {
            return Err(self.malformed("has a key without a value"));
        }
        let mut items = items.into_iter();
        Ok(std::iter::from_fn(|| Some((items.next()?, items.next()?))).collect())
    }

    fn list_mut(&mut self) -> PickleResult<&mut Vec<usize>> {
        let err = self.malformed("needs a list below its items");
        match self.top_value().map(|id| self.nodes.get_mut(id)) {
            Ok(Some(Node::List(items))) => Ok(items),
            _ => Err(err),
        }
    }

    fn dict_mut(&mut self) -> PickleResult<&mut Vec<(usize, usize)>> {
        let err = self.malformed("needs a dict below its items");
        match self.top_value().map(|id| self.nodes.get_mut(id)) {
            Ok(Some(Node::Dict(pairs))) => Ok(pairs),
            _ => Err(err),
        }
    }

    /// Turns node `id` into a tree, copying shared nodes at each reference.
    fn build(&self, id: usize, depth: usize, budget: &mut usize) -> PickleResult<PickleValue> {
        if depth > MAX_DEPTH {
            return Err(PickleError::TooDeep { limit: MAX_DEPTH });
        }
        *budget = budget
            .checked_sub(1)
            .ok_or(PickleError::TooLarge { limit: self.limit })?;
        let mut child = |id: usize| self.build(id, depth + 1, budget);
        // Every id comes from `run`, so the node exists; None only keeps this
        // path free of indexing.
        let Some(node) = self.nodes.get(id) else {
            return Ok(PickleValue::None);
        };
        Ok(match node {
            Node::Leaf(value) => value.clone(),
            Node::List(items) => {
                PickleValue::List(items.iter().map(|&i| child(i)).collect::<Result<_, _>>()?)
            }
            Node::Tuple(items) => {
                PickleValue::Tuple(items.iter().map(|&i| child(i)).collect::<Result<_, _>>()?)
            }
            Node::Dict(pairs) => PickleValue::Dict(
                pairs
                    .iter()
                    .map(|&(k, v)| Ok((child(k)?, child(v)?)))
                    .collect::<PickleResult<_>>()?,
            ),
            Node::Call(callable, args) => PickleValue::Call {
                callable: Box::new(child(*callable)?),
                args: Box::new(child(*args)?),
            },
            Node::Persistent(id) => PickleValue::Persistent(Box::new(child(*id)?)),
        })
    }
}

/// Width in bytes of the length or index argument of a sized or memo opcode.
fn width(op: u8) -> u64 {
    match op {
        SHORT_BINUNICODE | SHORT_BINBYTES | BINGET | BINPUT => 1,
        BINUNICODE8 | BINBYTES8 => 8,
        _ => 4,
    }
}

/// Little-endian two's complement to i64, if it fits (longer inputs may pad
/// with sign bytes).
fn decode_long(bytes: &[u8]) -> Option<i64> {
    let negative = bytes.last().is_some_and(|&b| b >= 0x80);
    let fill = if negative { 0xff } else { 0 };
    let (low, high) = bytes.split_at(bytes.len().min(8));
    let mut array = [fill; 8];
    array.get_mut(..low.len())?.copy_from_slice(low);
    let value = i64::from_le_bytes(array);
    // Anything past 8 bytes must only repeat the sign, and agree with it.
    let fits = high.iter().all(|&b| b == fill) && (value < 0) == negative;
    fits.then_some(value)
}

#[cfg(test)]
#[path = "pickle_tests.rs"]
mod tests;
