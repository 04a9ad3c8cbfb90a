//! `headroom bench batch` through the real binary: sessions stepped together stream the
//! bytes they stream one at a time, and the report says so.

mod common;
use common::headroom;

#[test]
fn bench_batch_reports_each_concurrency_and_byte_identical_streams() {
    let res = headroom(&[
        "bench",
        "batch",
        "--model",
        "tiny",
        "--width",
        "48",
        "--height",
        "32",
        "--frames",
        "21",
        "--concurrency",
        "1,3",
        "--json",
    ]);
    common::assert_ok(&res);
    let rows: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (row, n) in rows.iter().zip([1, 3]) {
        assert_eq!(row["sessions"], n);
        assert_eq!(row["identical"], true, "{row}");
        assert!(row["batched_fps"].as_f64().unwrap() > 0.0);
    }
    let res = headroom(&["bench", "batch", "--model", "tiny", "--concurrency", "0"]);
    assert_eq!(res.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&res.stderr).contains("concurrency"));
}
