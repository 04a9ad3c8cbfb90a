//! Plans kept on disk (`plan_cache`): a second engine replays the first's plan without
//! making one; a corrupt or stale file is deleted, counted and rebuilt, and never
//! changes a byte of the output (tiny model, planned allocator).

use std::path::Path;

use headroom_engine::plan_cache::PlanCacheCounts;
use headroom_engine::{Engine, EngineConfig, SessionRequest};
use headroom_mem::{AllocatorConfig, AllocatorPolicy};

/// Runs one session on a fresh engine with the cache in `dir`: its frames and what the
/// cache did.
fn run(dir: &Path) -> (Vec<Vec<u8>>, PlanCacheCounts) {
    let engine = Engine::new(EngineConfig {
        model: "tiny".to_string(),
        allocator: AllocatorConfig::with_policy(AllocatorPolicy::Planned),
        kv_budget_bytes: Some(16 << 20),
        plan_cache: Some(dir.to_path_buf()),
        ..EngineConfig::default()
    })
    .unwrap();
    let mut session = engine
        .open_session(SessionRequest {
            seed: 5,
            ..SessionRequest::new(48, 32, 21)
        })
        .unwrap();
    let frames = (0..session.chunks_total().unwrap())
        .map(|_| session.next_chunk().unwrap().frames.to_vec::<u8>().unwrap())
        .collect();
    drop(session);
    (frames, engine.plan_cache_counts().unwrap())
}

fn the_file(dir: &Path) -> std::path::PathBuf {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

fn counts(hits: u64, written: u64, corrupt: u64, stale: u64) -> PlanCacheCounts {
    PlanCacheCounts {
        hits,
        written,
        corrupt,
        stale,
        write_failed: 0,
    }
}

#[test]
fn a_cached_plan_is_replayed_and_a_corrupt_or_stale_one_is_rebuilt_with_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (frames, c) = run(d);
    assert_eq!(
        c,
        counts(0, 1, 0, 0),
        "the first run makes the plan and writes it"
    );
    let file = the_file(d);
    let (again, c) = run(d);
    assert_eq!(c, counts(1, 0, 0, 0), "the second run reads it");
    assert_eq!(again, frames);

    // Garbage: deleted as corrupt, rebuilt, the same bytes.
    std::fs::write(&file, b"{ not a plan").unwrap();
    let (out, c) = run(d);
    assert_eq!(c, counts(0, 1, 1, 0));
    assert_eq!(out, frames);

    // A plan edited without its checksum: corrupt.
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    v["plan"]["live_peak_bytes"] = serde_json::json!(1);
    std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
    let (out, c) = run(d);
    assert_eq!(c, counts(0, 1, 1, 0));
    assert_eq!(out, frames);

    // Another binary's file: stale.
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    v["version"] = serde_json::json!("headroom-engine 0.0.0");
    std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
    let (out, c) = run(d);
    assert_eq!(c, counts(0, 1, 0, 1));
    assert_eq!(out, frames);

    // The rebuilt file is good again.
    let (out, c) = run(d);
    assert_eq!(c, counts(1, 0, 0, 0));
    assert_eq!(out, frames);
    assert_eq!(the_file(d), file);
}

#[test]
fn a_plan_cache_that_cannot_be_a_folder_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, b"x").unwrap();
    let err = Engine::new(EngineConfig {
        model: "tiny".to_string(),
        plan_cache: Some(not_a_dir),
        ..EngineConfig::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("plan_cache"), "{err}");
}
