//! Replaying traces: our JSON lines and PyTorch snapshot pickles.

use headroom_mem::pickle::{from_pickle, PickleValue};
use headroom_mem::{
    parse_jsonl, parse_pytorch_snapshot, parse_trace, replay, AllocatorConfig, AllocatorPolicy,
    CachingPlatform, Phase, Platform, ReclaimPolicy, TraceOp, GIB, MIB,
};

const FIXTURE: &[u8] = include_bytes!("fixtures/torch_snapshot_small.pickle");

fn sim(policy: AllocatorPolicy, reclaim: ReclaimPolicy) -> CachingPlatform {
    CachingPlatform::sim(64 * GIB, AllocatorConfig::with_policy(policy), reclaim).unwrap()
}

#[test]
fn json_lines_parse_into_trace_ops() {
    let ops = parse_jsonl(
        r#"{"op":"alloc","id":7,"size":1048576,"stream":1}
{"op":"alloc","id":8,"size":512}

{"op":"free","id":7}
{"op":"empty_cache"}
{"op":"phase","name":"decode_start"}
"#,
    )
    .unwrap();
    assert_eq!(
        ops,
        [
            TraceOp::Alloc {
                id: 7,
                size: MIB,
                stream: 1
            },
            TraceOp::Alloc {
                id: 8,
                size: 512,
                stream: 0
            },
            TraceOp::Free { id: 7 },
            TraceOp::EmptyCache,
            TraceOp::Phase(Phase::DecodeStart),
        ]
    );
}

#[test]
fn malformed_lines_are_rejected_with_their_number_and_reason() {
    let cases = [
        ("{\"op\":\"alloc\",\"id\":1}", 1, "size"),
        ("{\"op\":\"alloc\",\"id\":1,\"size\":5}\n{\"op\":\"alloc\",\"id\":1,\"size\":5}", 2, "already live"),
        ("{\"op\":\"free\",\"id\":3}", 1, "never allocated"),
        ("{\"op\":\"alloc\",\"id\":1,\"size\":5}\n{\"op\":\"free\",\"id\":1}\n{\"op\":\"free\",\"id\":1}", 3, "already freed"),
        ("{\"op\":\"phase\",\"name\":\"lunch\"}", 1, "decode_start"),
        ("{\"op\":\"grow\"}", 1, "unknown variant"),
        ("not json", 1, "expected"),
        ("{\"op\":\"alloc\",\"id\":1,\"size\":-5}", 1, "invalid value"),
    ];
    for (text, line, reason) in cases {
        let err = parse_jsonl(text).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("trace line {line}:")),
            "{text}: {err}"
        );
        assert!(err.contains(reason), "{text}: {err}");
    }
}

#[test]
fn a_failed_allocation_is_counted_and_its_later_free_ignored() {
    let platform =
        CachingPlatform::sim(100 * MIB, AllocatorConfig::default(), ReclaimPolicy::Never).unwrap();
    let ops = parse_jsonl(
        r#"{"op":"alloc","id":1,"size":83886080}
{"op":"alloc","id":2,"size":83886080}
{"op":"free","id":2}
{"op":"free","id":1}
{"op":"alloc","id":3,"size":83886080}"#,
    )
    .unwrap();
    let report = replay(&platform, &ops);
    assert_eq!(report.failed_allocs, 1);
    assert_eq!(report.ignored_frees, 1);
    assert_eq!(report.stats.num_ooms, 1);
    assert_eq!(report.stats.allocated_bytes.all().current as u64, 80 * MIB);
}

#[test]
fn phase_lines_let_the_reclaim_policy_act() {
    let ops = parse_jsonl(
        r#"{"op":"alloc","id":1,"size":67108864}
{"op":"free","id":1}
{"op":"phase","name":"decode_start"}
{"op":"alloc","id":2,"size":1024}"#,
    )
    .unwrap();
    let never = replay(&sim(AllocatorPolicy::Pytorch, ReclaimPolicy::Never), &ops);
    let before = replay(
        &sim(AllocatorPolicy::Pytorch, ReclaimPolicy::BeforeDecode),
        &ops,
    );
    assert_eq!((never.reclaims, before.reclaims), (0, 1));
    assert_eq!(
        never.stats.reserved_bytes.all().current as u64,
        64 * MIB + 2 * MIB
    );
    assert_eq!(before.stats.reserved_bytes.all().current as u64, 2 * MIB);
    assert_eq!(before.stats.reserved_bytes.all().peak as u64, 64 * MIB);
}

#[test]
fn a_pytorch_snapshot_replays_its_alloc_and_free_events() {
    let ops = parse_pytorch_snapshot(FIXTURE).unwrap();
    assert_eq!(ops.len(), 8 + 8 + 4);
    assert_eq!(parse_trace(FIXTURE).unwrap(), ops);
    let pytorch = replay(&sim(AllocatorPolicy::Pytorch, ReclaimPolicy::Never), &ops);
    let expandable = replay(
        &sim(AllocatorPolicy::Expandable, ReclaimPolicy::Never),
        &ops,
    );
    assert_eq!(pytorch.stats.reserved_bytes.all().peak as u64, 256 * MIB);
    assert_eq!(expandable.stats.reserved_bytes.all().peak as u64, 140 * MIB);
}

#[test]
fn something_that_is_not_a_snapshot_is_rejected_clearly() {
    let not_snapshot = headroom_mem::pickle::to_pickle(&PickleValue::dict([("x", 1i64.into())]));
    let err = parse_pytorch_snapshot(&not_snapshot)
        .unwrap_err()
        .to_string();
    assert!(err.contains("device_traces"), "{err}");
    let err = parse_trace(b"\x80\x02c__builtin__\neval\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unsupported pickle opcode"), "{err}");
}

#[test]
fn snapshots_export_in_pytorch_layout_that_reads_back() {
    let platform = sim(AllocatorPolicy::Pytorch, ReclaimPolicy::Never);
    platform.allocator().set_history(100);
    let live = platform.allocator().allocate(1000, 0).unwrap();
    drop(platform.allocator().allocate(12 * MIB, 0).unwrap());
    platform.phase(Phase::DecodeStart);
    let snapshot = platform.allocator().snapshot();
    assert_eq!(snapshot.reserved_bytes(), 14 * MIB);
    let value = from_pickle(&snapshot.to_pickle()).unwrap();
    let segments = value
        .get("segments")
        .and_then(PickleValue::as_list)
        .unwrap();
    assert_eq!(segments.len(), 2);
    let first = &segments[0];
    assert_eq!(
        first.get("total_size").and_then(PickleValue::as_int),
        Some(2 * MIB as i64)
    );
    assert_eq!(
        first.get("segment_type").and_then(PickleValue::as_str),
        Some("small")
    );
    let blocks = first.get("blocks").and_then(PickleValue::as_list).unwrap();
    assert_eq!(
        blocks[0].get("state").and_then(PickleValue::as_str),
        Some("active_allocated")
    );
    assert_eq!(
        blocks[0]
            .get("requested_size")
            .and_then(PickleValue::as_int),
        Some(1000)
    );
    assert_eq!(
        blocks[1].get("state").and_then(PickleValue::as_str),
        Some("inactive")
    );
    let trace = value
        .get("device_traces")
        .and_then(PickleValue::as_list)
        .unwrap()[0]
        .as_list()
        .unwrap();
    let actions: Vec<_> = trace
        .iter()
        .map(|e| e.get("action").and_then(PickleValue::as_str).unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "segment_alloc",
            "alloc",
            "segment_alloc",
            "alloc",
            "free_requested",
            "free_completed",
            "user_defined"
        ]
    );
    // Our own export replays through our reader.
    let ops = parse_pytorch_snapshot(&snapshot.to_pickle()).unwrap();
    assert_eq!(ops.len(), 3);
    let json: serde_json::Value = serde_json::from_str(&snapshot.to_json()).unwrap();
    assert_eq!(
        json["segments"][0]["blocks"][0]["state"],
        "active_allocated"
    );
    assert_eq!(json["stats"]["reserved_bytes.all.current"], 14 * MIB);
    drop(live);
}
