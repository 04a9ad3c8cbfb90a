//! The opcode bytes the pickle reader and writer share, named as in CPython's
//! `pickletools`.

/// Pushes a mark that later opcodes collect the items above.
pub(super) const MARK: u8 = b'(';
/// Ends the pickle: the value on top of the stack is the result.
pub(super) const STOP: u8 = b'.';
/// Discards the top of the stack.
pub(super) const POP: u8 = b'0';
/// Discards everything above the topmost mark, and the mark.
pub(super) const POP_MARK: u8 = b'1';
/// Pushes the top of the stack again.
pub(super) const DUP: u8 = b'2';
/// Bytes behind a 4-byte length.
pub(super) const BINBYTES: u8 = b'B';
/// Bytes behind a 1-byte length.
pub(super) const SHORT_BINBYTES: u8 = b'C';
/// An 8-byte big-endian float.
pub(super) const BINFLOAT: u8 = b'G';
/// A 4-byte signed integer.
pub(super) const BININT: u8 = b'J';
/// A 1-byte unsigned integer.
pub(super) const BININT1: u8 = b'K';
/// A 2-byte unsigned integer.
pub(super) const BININT2: u8 = b'M';
/// Python `None`.
pub(super) const NONE: u8 = b'N';
/// UTF-8 text behind a 4-byte length.
pub(super) const BINUNICODE: u8 = b'X';
/// An empty list.
pub(super) const EMPTY_LIST: u8 = b']';
/// Appends the top of the stack to the list below it.
pub(super) const APPEND: u8 = b'a';
/// A dict of the key/value pairs above the topmost mark.
pub(super) const DICT: u8 = b'd';
/// Appends the items above the topmost mark to the list below it.
pub(super) const APPENDS: u8 = b'e';
/// Pushes the memo entry at a 1-byte index.
pub(super) const BINGET: u8 = b'h';
/// Pushes the memo entry at a 4-byte index.
pub(super) const LONG_BINGET: u8 = b'j';
/// A list of the items above the topmost mark.
pub(super) const LIST: u8 = b'l';
/// Stores the top of the stack in the memo at a 1-byte index.
pub(super) const BINPUT: u8 = b'q';
/// Stores the top of the stack in the memo at a 4-byte index.
pub(super) const LONG_BINPUT: u8 = b'r';
/// Sets the key and value on top of the stack in the dict below them.
pub(super) const SETITEM: u8 = b's';
/// A tuple of the items above the topmost mark.
pub(super) const TUPLE: u8 = b't';
/// Sets the key/value pairs above the topmost mark in the dict below it.
pub(super) const SETITEMS: u8 = b'u';
/// An empty dict.
pub(super) const EMPTY_DICT: u8 = b'}';
/// An empty tuple.
pub(super) const EMPTY_TUPLE: u8 = b')';
/// The protocol header: one byte of protocol number follows.
pub(super) const PROTO: u8 = 0x80;
/// A tuple of the top item of the stack.
pub(super) const TUPLE1: u8 = 0x85;
/// A tuple of the top two items of the stack.
pub(super) const TUPLE2: u8 = 0x86;
/// A tuple of the top three items of the stack.
pub(super) const TUPLE3: u8 = 0x87;
/// Python `True`.
pub(super) const NEWTRUE: u8 = 0x88;
/// Python `False`.
pub(super) const NEWFALSE: u8 = 0x89;
/// A little-endian two's complement integer behind a 1-byte length.
pub(super) const LONG1: u8 = 0x8a;
/// A little-endian two's complement integer behind a 4-byte length.
pub(super) const LONG4: u8 = 0x8b;
/// UTF-8 text behind a 1-byte length.
pub(super) const SHORT_BINUNICODE: u8 = 0x8c;
/// UTF-8 text behind an 8-byte length.
pub(super) const BINUNICODE8: u8 = 0x8d;
/// Bytes behind an 8-byte length.
pub(super) const BINBYTES8: u8 = 0x8e;
/// An empty set.
pub(super) const EMPTY_SET: u8 = 0x8f;
/// Adds the items above the topmost mark to the set below it.
pub(super) const ADDITEMS: u8 = 0x90;
/// Stores the top of the stack in the memo at the next free index.
pub(super) const MEMOIZE: u8 = 0x94;
/// Starts a frame: an 8-byte length of the opcodes it holds.
pub(super) const FRAME: u8 = 0x95;
/// Names `module.name` as two newline-terminated lines.
pub(super) const GLOBAL: u8 = b'c';
/// Names `module.name` from the two strings on top of the stack.
pub(super) const STACK_GLOBAL: u8 = 0x93;
/// Calls the callable below the argument tuple on top of the stack.
pub(super) const REDUCE: u8 = b'R';
/// Sets the state on top of the stack on the object below it.
pub(super) const BUILD: u8 = b'b';
/// A persistent id: the value on top of the stack, resolved by the file's owner.
pub(super) const BINPERSID: u8 = b'Q';
