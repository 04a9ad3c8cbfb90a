//! `generate --json`'s schema through the real binary: every key, nested, that scripts
//! read, printed as one line with its keys sorted, as it always has been.

mod common;
use common::{assert_ok, headroom, tiny_generate};

use std::collections::BTreeSet;

/// Objects whose keys are names (kernels, collective kinds), not fields of the schema.
const MAPS: [&str; 2] = ["launches", "collectives"];

/// Every key path of `value` (`chunks[].frames`, `ranks[].collectives.*.bytes`).
fn key_paths(value: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            let last = prefix.rsplit('.').next().unwrap_or("");
            for (key, inner) in map {
                let name = if MAPS.contains(&last) { "*" } else { key };
                let path = if prefix.is_empty() {
                    name.to_string()
                } else {
                    format!("{prefix}.{name}")
                };
                out.insert(path.clone());
                key_paths(inner, &path, out);
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                key_paths(item, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

/// `generate --json` on the tiny model with `extra`: the report, checked to print as one
/// line of JSON whose keys are sorted at every level.
fn report(extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.y4m");
    let mut flags = vec!["--json"];
    flags.extend_from_slice(extra);
    let res = headroom(&tiny_generate(out.to_str().unwrap(), &flags));
    assert_ok(&res);
    let text = String::from_utf8(res.stdout).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    // serde_json's maps keep keys sorted: re-printing the parsed report gives back the
    // same line only if it was printed compact with sorted keys.
    assert_eq!(text, format!("{value}\n"));
    value
}

#[test]
fn generate_json_has_every_key_of_its_schema_and_no_other() {
    let plan_cache = tempfile::tempdir().unwrap();
    let runs = [
        report(&[
            "--prompt",
            "a cat",
            "--plan-cache",
            plan_cache.path().to_str().unwrap(),
        ]),
        report(&["--device", "cuda-check"]),
        report(&["--tp", "2"]),
    ];
    let mut seen = BTreeSet::new();
    for run in &runs {
        key_paths(run, "", &mut seen);
    }
    let expected: BTreeSet<String> = SCHEMA.iter().map(|k| k.to_string()).collect();
    assert_eq!(seen, expected);
    // Only a mesh reports its ranks and backend; an absent part is null, not missing.
    let single = &runs[0];
    assert!(single.get("ranks").is_none() && single.get("comm").is_none());
    assert!(single["checked_launches"].is_null());
    assert!(runs[1]["text_encoder"].is_null() && runs[1]["plan_cache"].is_null());
    assert_eq!(runs[2]["comm"], "threads");
}

/// The key paths of `generate --json` as the CLI printed them before its report became a
/// type (a single run, `--prompt` + `--plan-cache`, `--device cuda-check`, `--tp 2`).
const SCHEMA: [&str; 59] = [
    "allocated_peak_bytes",
    "checked_launches",
    "checked_launches.downloaded_bytes",
    "checked_launches.gemm_flops",
    "checked_launches.gemms",
    "checked_launches.launches",
    "checked_launches.launches.*",
    "checked_launches.uploaded_bytes",
    "chunk_mean_s",
    "chunks",
    "chunks[].allocated_bytes",
    "chunks[].commit_s",
    "chunks[].decode_s",
    "chunks[].denoise_s",
    "chunks[].frames",
    "chunks[].reserved_bytes",
    "chunks[].total_s",
    "comm",
    "decoder",
    "device",
    "frames",
    "height",
    "output",
    "plan_cache",
    "plan_cache.corrupt",
    "plan_cache.hits",
    "plan_cache.stale",
    "plan_cache.write_failed",
    "plan_cache.written",
    "post_session_reserved_bytes",
    "ranks",
    "ranks[].allocated_peak_bytes",
    "ranks[].collectives",
    "ranks[].collectives.*",
    "ranks[].collectives.*.bytes",
    "ranks[].collectives.*.calls",
    "ranks[].collectives.*.seconds",
    "ranks[].post_session_reserved_bytes",
    "ranks[].rank",
    "ranks[].reserved_peak_bytes",
    "ranks[].sp_rank",
    "ranks[].tp_rank",
    "reclaim_s",
    "reclaims",
    "reserved_peak_bytes",
    "text_encoder",
    "text_encoder.cache_budget_bytes",
    "text_encoder.cache_bytes",
    "text_encoder.cache_entries",
    "text_encoder.cache_hits",
    "text_encoder.cache_misses",
    "text_encoder.encodes",
    "text_encoder.loads",
    "text_encoder.mode",
    "text_encoder.resident_weight_bytes",
    "text_encoder.weight_bytes",
    "ttfc_s",
    "weights_bytes",
    "width",
];
