//! Tests of the pickle codec (kept in a file of their own so each codec file stays one concept).

use super::opcode::*;
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
fn one_shared_string_copied_past_the_byte_limit_is_an_error() {
    // Found with fuzz/fuzz_targets/pickle.rs: a 3.4 KiB pickle whose 1000-byte string is
    // referenced 600 × 600 times built 360 MB of copies; the limit counted values, not
    // the bytes they own.
    let mut bytes = b"\x80\x02X".to_vec();
    bytes.extend_from_slice(&1000u32.to_le_bytes());
    bytes.extend_from_slice(&[b'a'; 1000]);
    bytes.extend_from_slice(b"q\x00](");
    bytes.extend(b"h\x00".repeat(600));
    bytes.extend_from_slice(b"eq\x01](");
    bytes.extend(b"h\x01".repeat(600));
    bytes.extend_from_slice(b"e.");
    // 3418 bytes × 32 KiB of values per input byte.
    let message = error(&bytes);
    assert!(
        message.contains("expands to more than 112001024 bytes"),
        "{message}"
    );
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
