//! The pickle reader: [`from_pickle`] for plain data (protocols 2..=4) and
//! [`from_pickle_restricted`] for pickles that may name allow-listed globals, whose
//! calls and persistent ids are recorded, never made. Values are built as a graph of
//! nodes first (memo references share them), then copied out as a tree under depth
//! and size limits.

use std::collections::HashMap;

use super::opcode::*;
use super::{PickleError, PickleResult, PickleValue};

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
        // Shared references (BINGET of frame lists) make the tree bigger than the file; a
        // bound that grows with the file stops a tiny hostile pickle from doubling itself,
        // or copying one long string, into gigabytes, and leaves real snapshots alone.
        // It counts bytes (each value, and the text of strings, bytes and globals), so a
        // pickle of a few KiB builds at most 64 MiB.
        limit: bytes
            .len()
            .saturating_mul(32 << 10)
            .clamp(64 << 20, 16 << 30),
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
    /// How many bytes of values `build` may make.
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
        // Every id comes from `run`, so the node exists; None only keeps this
        // path free of indexing.
        let Some(node) = self.nodes.get(id) else {
            return Ok(PickleValue::None);
        };
        // Charged before the copy is made: the value itself, and the text it owns.
        let text = match node {
            Node::Leaf(PickleValue::Str(s)) => s.len(),
            Node::Leaf(PickleValue::Bytes(b)) => b.len(),
            Node::Leaf(PickleValue::Global { module, name }) => module.len() + name.len(),
            _ => 0,
        };
        *budget = budget
            .checked_sub(std::mem::size_of::<PickleValue>() + text)
            .ok_or(PickleError::TooLarge { limit: self.limit })?;
        let mut child = |id: usize| self.build(id, depth + 1, budget);
        Ok(match node {
            Node::Leaf(value) => value.clone(),
            // Containers are allocated at their exact size, so the budget is what they take.
            Node::List(items) => PickleValue::List(exact(items, |&i| child(i))?),
            Node::Tuple(items) => PickleValue::Tuple(exact(items, |&i| child(i))?),
            Node::Dict(pairs) => {
                PickleValue::Dict(exact(pairs, |&(k, v)| Ok((child(k)?, child(v)?)))?)
            }
            Node::Call(callable, args) => PickleValue::Call {
                callable: Box::new(child(*callable)?),
                args: Box::new(child(*args)?),
            },
            Node::Persistent(id) => PickleValue::Persistent(Box::new(child(*id)?)),
        })
    }
}

/// `items` mapped through `f` into a vector of exactly their number (collecting a
/// `Result` would grow it by doubling, up to twice what the size limit counted).
fn exact<T, U>(items: &[T], mut f: impl FnMut(&T) -> PickleResult<U>) -> PickleResult<Vec<U>> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        out.push(f(item)?);
    }
    Ok(out)
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
