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
mod tests {
    use super::*;

    const FIXTURE: &[u8] = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/torch_snapshot_small.pickle"
    ));

    fn read(bytes: &[u8]) -> PickleValue {
        match from_pickle(bytes) {
            Ok(value) => value,
            Err(e) => panic!("{bytes:?} did not read: {e}"),
        }
    }

    fn error(bytes: &[u8]) -> String {
        match from_pickle(bytes) {
            Ok(value) => panic!("{bytes:?} read as {value:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn int(v: i64) -> PickleValue {
        PickleValue::Int(v)
    }

    fn s(text: &str) -> PickleValue {
        PickleValue::str(text)
    }

    /// Every width boundary of the integer opcodes, both signs.
    fn boundary_ints() -> Vec<i64> {
        let mut ints = vec![
            0, 1, 255, 256, 65535, 65536, -1, -128, -129, -255, -256, -257,
        ];
        for bits in [15, 16, 23, 24, 31, 32, 39, 40, 47, 48, 55, 56, 62] {
            let p = 1i64 << bits;
            ints.extend([p - 1, p, p + 1, -p, -p - 1, -p + 1]);
        }
        ints.extend([i32::MAX.into(), i64::from(i32::MAX) + 1, i32::MIN.into()]);
        ints.extend([i64::from(i32::MIN) - 1, i64::MAX, i64::MIN, i64::MIN + 1]);
        ints.push(0x7f00_0000_0000);
        ints
    }

    fn snapshot_shaped() -> PickleValue {
        let frame = PickleValue::dict([("filename", s("trâin.py")), ("line", int(12))]);
        let blocks: Vec<PickleValue> = (0..2500u64)
            .map(|i| PickleValue::dict([("address", (0x7f00_0000_0000 + i * 512).into())]))
            .collect();
        let big_dict = PickleValue::Dict((0..1001).map(|i| (int(i), s(&i.to_string()))).collect());
        let floats = [
            0.0,
            -0.0,
            1.5,
            -2.25e-300,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::INFINITY,
        ];
        PickleValue::dict([
            (
                "ints",
                PickleValue::List(boundary_ints().into_iter().map(int).collect()),
            ),
            (
                "floats",
                PickleValue::List(floats.into_iter().map(Into::into).collect()),
            ),
            (
                "strs",
                vec![s(""), s("日本語"), s("🦀 crab"), s(&"x".repeat(300))].into(),
            ),
            (
                "bytes",
                vec![PickleValue::Bytes(vec![]), PickleValue::Bytes(vec![7; 300])].into(),
            ),
            ("blocks", blocks.into()),
            ("big_dict", big_dict),
            ("empty_list", PickleValue::List(vec![])),
            ("empty_dict", PickleValue::Dict(vec![])),
            ("pool", PickleValue::Tuple(vec![int(0), int(0)])),
            (
                "tuples",
                vec![PickleValue::Tuple(vec![]), PickleValue::Tuple(vec![int(1)])].into(),
            ),
            ("frames", vec![frame.clone(), frame].into()),
            (
                "flags",
                vec![true.into(), false.into(), PickleValue::None].into(),
            ),
            ("huge", u64::MAX.into()),
        ])
    }

    #[test]
    fn round_trips_a_nested_snapshot_shaped_value() {
        let value = snapshot_shaped();
        assert_eq!(read(&to_pickle(&value)), value);
        assert_eq!(value.get("huge"), Some(&int(i64::MAX)));
        let nan = read(&to_pickle(&f64::NAN.into()));
        assert!(nan.as_float().is_some_and(f64::is_nan));
    }

    /// Opcodes memory_viz's unpickler understands, with their argument sizes.
    fn walk_writer_output(bytes: &[u8]) -> Vec<u8> {
        let mut ops = Vec::new();
        let mut at = 0;
        while let Some(&op) = bytes.get(at) {
            ops.push(op);
            let len_at = |n: usize| {
                let arg = bytes.get(at + 1..at + 1 + n).expect("length");
                arg.iter()
                    .rev()
                    .fold(0, |acc, &b| acc << 8 | usize::from(b))
            };
            at += 1 + match op {
                b'}' | b']' | b'(' | b'u' | b'e' | b')' | b't' | b'N' | 0x88 | 0x89 | b'.' => 0,
                0x80 | b'K' => 1,
                b'M' => 2,
                b'J' => 4,
                b'G' => 8,
                0x8a | b'C' => 1 + len_at(1),
                b'X' | b'B' => 4 + len_at(4),
                _ => panic!("writer emitted opcode {op:#04x} at byte {at}"),
            };
        }
        assert_eq!(at, bytes.len(), "last opcode overran the output");
        ops
    }

    #[test]
    fn writer_emits_only_opcodes_memory_viz_reads() {
        let out = to_pickle(&snapshot_shaped());
        assert_eq!(out.get(..2), Some(&[0x80, 2][..]));
        let ops = walk_writer_output(&out);
        assert_eq!(ops.last(), Some(&STOP));
        assert_eq!(ops.iter().filter(|&&op| op == STOP).count(), 1);
        // 2500 list items and 1001 dict items go out in batches of 1000.
        assert!(ops.iter().filter(|&&op| op == APPENDS).count() >= 3);
        assert!(ops.iter().filter(|&&op| op == SETITEMS).count() >= 2);
    }

    #[test]
    fn writer_uses_the_smallest_integer_opcode() {
        let body = |v: i64| {
            let out = to_pickle(&int(v));
            out.get(2..out.len() - 1).map(<[u8]>::to_vec)
        };
        assert_eq!(body(255), Some(vec![b'K', 255]));
        assert_eq!(body(256), Some(vec![b'M', 0, 1]));
        assert_eq!(body(-1), Some(vec![b'J', 255, 255, 255, 255]));
        assert_eq!(body(1 << 31), Some(vec![0x8a, 5, 0, 0, 0, 0x80, 0]));
        assert_eq!(
            body(-(1 << 31) - 1),
            Some(vec![0x8a, 5, 255, 255, 255, 0x7f, 255])
        );
        assert_eq!(
            body(0x7f00_0000_0000),
            Some(vec![0x8a, 6, 0, 0, 0, 0, 0, 0x7f])
        );
        assert_eq!(
            body(i64::MIN),
            Some([&[0x8a, 8][..], &i64::MIN.to_le_bytes()].concat())
        );
        assert_eq!(to_pickle(&PickleValue::List(vec![])), b"\x80\x02]."[..]);
        assert_eq!(
            to_pickle(&PickleValue::Tuple(vec![int(1)])),
            b"\x80\x02(K\x01t."[..]
        );
    }

    #[test]
    fn reads_protocol_4_frames_memo_and_short_strings() {
        // {"k": ("a", "k")}, as pickle.dumps(..., protocol=4) lays it out.
        let body = b"}\x94\x8c\x01k\x94\x8c\x01a\x94h\x01\x86\x94s.";
        let mut bytes = vec![0x80, 4, 0x95];
        bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(body);
        let expected = PickleValue::dict([("k", PickleValue::Tuple(vec![s("a"), s("k")]))]);
        assert_eq!(read(&bytes), expected);
    }

    #[test]
    fn reads_binput_long_binput_and_their_gets() {
        let bytes = b"\x80\x02(X\x02\x00\x00\x00hiq\x07Nr\x09\x00\x00\x00h\x07j\x09\x00\x00\x00l.";
        assert_eq!(
            read(bytes),
            vec![s("hi"), PickleValue::None, s("hi"), PickleValue::None].into()
        );
    }

    #[test]
    fn memoized_list_sees_items_appended_after_it_was_referenced() {
        // outer = [inner, inner]; then inner.append(7) through the memo.
        let bytes = b"\x80\x04]\x94(]\x94h\x01eh\x01K\x07a0.";
        let inner = PickleValue::List(vec![int(7)]);
        assert_eq!(read(bytes), vec![inner.clone(), inner].into());
    }

    #[test]
    fn reads_mark_based_and_one_by_one_containers() {
        assert_eq!(
            read(b"(K\x01K\x02d."),
            PickleValue::Dict(vec![(int(1), int(2))])
        );
        assert_eq!(read(b"(K\x03l."), vec![int(3)].into());
        assert_eq!(read(b"]K\x03aK\x04a."), vec![int(3), int(4)].into());
        assert_eq!(
            read(b"}K\x01K\x02s."),
            PickleValue::Dict(vec![(int(1), int(2))])
        );
        assert_eq!(
            read(b"(K\x01K\x02t."),
            PickleValue::Tuple(vec![int(1), int(2)])
        );
        assert_eq!(read(b")."), PickleValue::Tuple(vec![]));
        assert_eq!(read(b"K\x01\x85."), PickleValue::Tuple(vec![int(1)]));
        let three = PickleValue::Tuple(vec![int(1), int(2), int(3)]);
        assert_eq!(read(b"K\x01K\x02K\x03\x87."), three);
        assert_eq!(read(b"\x8f(K\x01K\x02\x90."), vec![int(1), int(2)].into());
    }

    #[test]
    fn reads_pop_pop_mark_and_dup() {
        assert_eq!(read(b"K\x05N0."), int(5));
        assert_eq!(read(b"K\x05(K\x01K\x021."), int(5));
        assert_eq!(
            read(b"K\x052\x86."),
            PickleValue::Tuple(vec![int(5), int(5)])
        );
    }

    #[test]
    fn reads_every_scalar_opcode() {
        assert_eq!(read(b"N."), PickleValue::None);
        assert_eq!(read(b"\x88."), true.into());
        assert_eq!(read(b"\x89."), false.into());
        assert_eq!(read(b"M\x00\x01."), int(256));
        assert_eq!(read(b"J\xfe\xff\xff\xff."), int(-2));
        assert_eq!(read(b"G\x3f\xf8\x00\x00\x00\x00\x00\x00."), 1.5.into());
        assert_eq!(read(b"\x8a\x00."), int(0));
        assert_eq!(read(b"\x8a\x01\xff."), int(-1));
        // Not minimal, but still a 64-bit value.
        assert_eq!(
            read(b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff."),
            int(-1)
        );
        assert_eq!(read(b"\x8b\x02\x00\x00\x00\x00\x01."), int(256));
        assert_eq!(
            read(b"\x8d\x02\x00\x00\x00\x00\x00\x00\x00\xc3\xa9."),
            s("é")
        );
        assert_eq!(read(b"C\x02ab."), PickleValue::Bytes(b"ab".to_vec()));
        assert_eq!(
            read(b"B\x01\x00\x00\x00z."),
            PickleValue::Bytes(b"z".to_vec())
        );
        let bytes8 = b"\x8e\x01\x00\x00\x00\x00\x00\x00\x00z.";
        assert_eq!(read(bytes8), PickleValue::Bytes(b"z".to_vec()));
    }

    #[test]
    fn reads_the_torch_snapshot_fixture() {
        let snapshot = read(FIXTURE);
        let segment = &snapshot
            .get("segments")
            .and_then(|s| s.as_list())
            .expect("segments")[0];
        assert_eq!(
            segment.get("address").and_then(PickleValue::as_int),
            Some(139637976727552)
        );
        assert_eq!(
            segment.get("segment_pool_id"),
            Some(&PickleValue::Tuple(vec![int(0), int(0)]))
        );
        assert_eq!(segment.get("is_expandable"), Some(&false.into()));
        let block = &segment
            .get("blocks")
            .and_then(|b| b.as_list())
            .expect("blocks")[0];
        let frame = &block
            .get("frames")
            .and_then(|f| f.as_list())
            .expect("frames")[0];
        assert_eq!(
            frame.get("name").and_then(PickleValue::as_str),
            Some("forward")
        );

        let traces = snapshot
            .get("device_traces")
            .and_then(|t| t.as_list())
            .expect("traces");
        let trace = traces[0].as_list().expect("device 0");
        assert_eq!(trace.len(), 8 * 2 + 8 * 2 + 4 * 2);
        let field = |i: usize, key: &str| trace[i].get(key).cloned();
        assert_eq!(field(0, "action"), Some(s("segment_alloc")));
        assert_eq!(field(0, "addr"), Some(int(0x7f00_0000_0000)));
        assert_eq!(field(17, "action"), Some(s("free_completed")));
        assert_eq!(
            field(39, "addr"),
            Some(int(0x7f00_1000_0000 + 3 * 0x200_0000))
        );
        assert_eq!(field(39, "size"), Some(int(33554432)));
        let times: Vec<_> = trace
            .iter()
            .filter_map(|e| e.get("time_us")?.as_int())
            .collect();
        assert!(times.len() == trace.len() && times.windows(2).all(|w| w[0] < w[1]));
        // The shared frames list was memoized empty and filled later.
        for entry in trace {
            let frames = entry
                .get("frames")
                .and_then(PickleValue::as_list)
                .expect("frames");
            assert_eq!(frames.len(), 1);
            assert_eq!(frames[0].get("filename"), Some(&s("train.py")));
        }

        let settings = snapshot.get("allocator_settings").expect("settings");
        assert_eq!(settings.get("max_split_size"), Some(&int(-1)));
        assert_eq!(
            settings.get("garbage_collection_threshold"),
            Some(&0.0.into())
        );
        assert_eq!(
            settings.get("roundup_power2_divisions"),
            Some(&PickleValue::Dict(vec![]))
        );
        assert_eq!(read(&to_pickle(&snapshot)), snapshot);
    }

    #[test]
    fn unsupported_opcode_error_names_opcode_and_offset() {
        let message = error(b"\x80\x02cos\nsystem\n.");
        assert_eq!(message, "unsupported pickle opcode 0x63 ('c') at byte 2");
        let message = error(b"\x80\x04\x8c\x01a\x93.");
        assert_eq!(message, "unsupported pickle opcode 0x93 at byte 5");
        assert!(error(b"\x80\x02NR.").contains("0x52 ('R') at byte 3"));
    }

    #[test]
    fn refuses_protocols_memory_viz_refuses() {
        assert_eq!(
            error(b"\x80\x05N."),
            "pickle protocol 5 at byte 1 is not supported (2..=4)"
        );
        assert!(error(b"\x80\x01N.").contains("protocol 1"));
    }

    #[test]
    fn truncated_input_is_an_error() {
        let message = error(b"\x80\x02J\x01\x00");
        assert_eq!(
            message,
            "truncated pickle at byte 5 (inside opcode 0x4a ('J') at byte 2)"
        );
        assert!(error(b"X\xff\xff\xff\xffab.").starts_with("truncated pickle"));
        assert!(error(b"\x8e\xff\xff\xff\xff\xff\xff\xff\xff.").starts_with("truncated"));
    }

    #[test]
    fn input_without_stop_is_an_error() {
        assert_eq!(error(b"\x80\x02N"), "pickle ended without STOP at byte 3");
        assert_eq!(error(b""), "pickle ended without STOP at byte 0");
    }

    #[test]
    fn malformed_stacks_are_errors() {
        assert!(error(b"\x80\x02.").contains("needs a value but the stack has none"));
        assert!(error(b"(.").contains("needs a value"));
        assert!(error(b"]e.").contains("0x65 ('e') at byte 1 needs a MARK"));
        assert!(error(b"}K\x01a.").contains("needs a list"));
        assert!(error(b"](K\x01K\x02u.").contains("needs a dict"));
        assert!(error(b"}(K\x01u.").contains("key without a value"));
        assert_eq!(
            error(b"h\x05."),
            "pickle memo entry 5 read at byte 0 was never stored"
        );
    }

    #[test]
    fn integers_beyond_64_bits_are_errors() {
        let message = error(b"N\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00.");
        assert_eq!(message, "integer at byte 1 does not fit in 64 bits");
        assert!(error(b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\xff.").contains("64 bits"));
    }

    #[test]
    fn self_containing_and_exploding_values_are_errors() {
        assert!(error(b"]\x94h\x00a.").contains("nests deeper than 512"));
        // Each level is a list holding the previous one twice: 2^40 values.
        let mut bytes = b"]\x94".to_vec();
        for level in 0..40u32 {
            bytes.extend_from_slice(b"](j");
            bytes.extend_from_slice(&level.to_le_bytes());
            bytes.push(b'j');
            bytes.extend_from_slice(&level.to_le_bytes());
            bytes.extend_from_slice(b"e\x94");
        }
        bytes.push(b'.');
        assert!(error(&bytes).contains("expands to more than"));
    }

    #[test]
    fn never_panics_on_prefixes_or_noise() {
        // Every prefix costs a parse, so leave out the 1000+ item containers.
        let PickleValue::Dict(mut pairs) = snapshot_shaped() else {
            panic!("snapshot_shaped is a dict");
        };
        pairs.retain(|(k, _)| !matches!(k.as_str(), Some("blocks" | "big_dict")));
        let valid = to_pickle(&PickleValue::Dict(pairs));
        for input in [&valid[..], FIXTURE] {
            for end in 0..input.len() {
                assert!(from_pickle(&input[..end]).is_err(), "prefix of {end} bytes");
            }
        }
        // Random bytes, and valid pickles with random bytes overwritten.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..4000 {
            let mut input = if round % 2 == 0 {
                FIXTURE.to_vec()
            } else {
                vec![0; 64]
            };
            let len = input.len() as u64;
            for _ in 0..(1 + next() % 8) {
                let at = (next() % len) as usize;
                input[at] = next() as u8;
            }
            let _ = from_pickle(&input);
        }
    }

    #[test]
    fn helpers_and_conversions() {
        let value = PickleValue::dict([("a", int(1)), ("b", "x".into()), ("a", int(2))]);
        assert_eq!(
            value.get("a"),
            Some(&int(2)),
            "the last duplicate wins, as in Python"
        );
        assert_eq!(value.get("b").and_then(PickleValue::as_str), Some("x"));
        assert_eq!(value.get("c"), None);
        assert_eq!(value.as_dict().map(<[_]>::len), Some(3));
        assert_eq!(PickleValue::from(u64::MAX), int(i64::MAX));
        assert_eq!(PickleValue::from(7usize).as_int(), Some(7));
        assert_eq!(PickleValue::from(String::from("y")), s("y"));
        assert_eq!(
            PickleValue::Tuple(vec![int(1)]).as_list(),
            Some(&[int(1)][..])
        );
        assert_eq!(PickleValue::from(true).as_bool(), Some(true));
        assert_eq!(int(1).as_str(), None);
    }
}
