//! Cancelling a chunk while it runs (tiny model, 48×32): the chunk stops at the safe point
//! the token is first seen, returns `Cancelled`, and the session gives back its KV pages,
//! decoder state and conditioning, with the allocator back at its floor. The token is
//! set from inside the chunk by a platform that cancels when the chunk crosses a phase,
//! so where the stop lands does not depend on timing.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use headroom_engine::{
    CancelReason, CancelToken, Checkpoint, Engine, EngineConfig, EngineError, Placement,
    SessionRequest,
};
use headroom_mem::{
    AllocatorConfig, CachingAllocator, CachingPlatform, MemoryStats, Phase, Platform, PlatformKind,
    Reclaim, ReclaimPolicy,
};

/// Forwards to a CPU platform and cancels `token` the first time a chunk crosses `at`.
#[derive(Debug)]
struct CancelAt {
    inner: CachingPlatform,
    at: Phase,
    token: Mutex<Option<CancelToken>>,
}

impl Platform for CancelAt {
    fn kind(&self) -> PlatformKind {
        self.inner.kind()
    }
    fn synchronize(&self) {
        self.inner.synchronize()
    }
    fn mem_info(&self) -> (u64, u64) {
        self.inner.mem_info()
    }
    fn memory_stats(&self) -> MemoryStats {
        self.inner.memory_stats()
    }
    fn reset_peak_stats(&self) {
        self.inner.reset_peak_stats()
    }
    fn empty_cache(&self) {
        self.inner.empty_cache()
    }
    fn caches_device_memory(&self) -> bool {
        self.inner.caches_device_memory()
    }
    fn allocator(&self) -> &CachingAllocator {
        self.inner.allocator()
    }
    fn reclaim_policy(&self) -> ReclaimPolicy {
        self.inner.reclaim_policy()
    }
    fn phase(&self, phase: Phase) -> Option<Reclaim> {
        if phase == self.at {
            if let Some(token) = self.token.lock().unwrap().take() {
                token.cancel();
            }
        }
        self.inner.phase(phase)
    }
}

fn engine_on(at: Phase) -> (Engine, Arc<CancelAt>) {
    let platform = Arc::new(CancelAt {
        inner: CachingPlatform::cpu(None, AllocatorConfig::default(), ReclaimPolicy::Always)
            .unwrap(),
        at,
        token: Mutex::new(None),
    });
    let config = EngineConfig {
        model: "tiny".to_string(),
        kv_budget_bytes: Some(8 << 20),
        ..EngineConfig::default()
    };
    let engine = Engine::load(config, Placement::host(platform.clone())).unwrap();
    (engine, platform)
}

fn allocated(engine: &Engine) -> i64 {
    engine
        .platform()
        .memory_stats()
        .allocated_bytes
        .all()
        .current
}

fn request(seed: u64) -> SessionRequest {
    SessionRequest {
        seed,
        ..SessionRequest::new(48, 32, 33)
    }
}

/// Runs a whole session and returns its frames.
fn frames(engine: &Engine, seed: u64) -> Vec<Vec<u8>> {
    let mut s = engine.open_session(request(seed)).unwrap();
    (0..s.chunks_total().unwrap())
        .map(|_| s.next_chunk().unwrap().frames.to_vec::<u8>().unwrap())
        .collect()
}

/// Opens a session, lets the platform cancel it when its second chunk crosses `at`, and
/// returns where it stopped; checks everything was given back.
fn stop_second_chunk_at(at: Phase) -> (Checkpoint, CancelReason) {
    let (engine, platform) = engine_on(at);
    let reference = frames(&engine, 5);
    let floor = allocated(&engine);
    let mut session = engine.open_session(request(5)).unwrap();
    let token = CancelToken::new();
    session.set_cancel(token.clone());
    let first = session.next_chunk().unwrap();
    assert_eq!(first.frames.to_vec::<u8>().unwrap(), reference[0]);
    drop(first);
    *platform.token.lock().unwrap() = Some(token);
    let stopped = match session.next_chunk() {
        Err(EngineError::Cancelled { at, reason, .. }) => (at, reason),
        other => panic!("expected a cancelled chunk, got {other:?}"),
    };
    // Released on the cancel path itself, before the session is dropped.
    let pool = engine.kv_pool().unwrap();
    assert_eq!(pool.free_pages(), pool.total_pages(), "KV pages held");
    assert_eq!(allocated(&engine), floor, "bytes held after the cancel");
    assert!(matches!(
        session.next_chunk(),
        Err(EngineError::Finished(_))
    ));
    drop(session);
    assert_eq!(allocated(&engine), floor);
    // The engine serves the next session as if nothing happened.
    assert_eq!(frames(&engine, 5), reference);
    stopped
}

#[test]
fn a_cancel_seen_after_the_denoise_stops_before_the_decode_and_releases_everything() {
    let (at, reason) = stop_second_chunk_at(Phase::DenoiseEnd);
    assert_eq!(at, Checkpoint::Decode);
    assert_eq!(reason, CancelReason::Cancelled);
}

#[test]
fn a_cancel_during_the_decode_stops_after_the_first_latent_frame_and_releases_everything() {
    let (at, _) = stop_second_chunk_at(Phase::DecodeStart);
    assert_eq!(at, Checkpoint::DecodedFrames { frames: 1 });
}

#[test]
fn a_passed_deadline_stops_a_chunk_at_its_start_and_frees_the_pool() {
    let (engine, _) = engine_on(Phase::Sleep);
    let mut session = engine.open_session(request(1)).unwrap();
    session.set_cancel(CancelToken::new().with_deadline(Instant::now()));
    match session.next_chunk() {
        Err(EngineError::Cancelled { at, reason, .. }) => {
            assert_eq!(at, Checkpoint::ChunkStart);
            assert_eq!(reason, CancelReason::DeadlinePassed);
        }
        other => panic!("expected a cancelled chunk, got {other:?}"),
    }
    let pool = engine.kv_pool().unwrap();
    assert_eq!(pool.free_pages(), pool.total_pages());
}

#[test]
fn a_cancel_while_overlapped_decode_and_denoise_run_ends_both_and_releases_everything() {
    let (engine, platform) = engine_on(Phase::DecodeStart);
    let overlapped = || SessionRequest {
        overlap: true,
        ..request(3)
    };
    let reference: Vec<Vec<u8>> = {
        let mut s = engine.open_session(overlapped()).unwrap();
        (0..s.chunks_total().unwrap())
            .map(|_| s.next_chunk().unwrap().frames.to_vec::<u8>().unwrap())
            .collect()
    };
    let floor = allocated(&engine);
    let mut session = engine.open_session(overlapped()).unwrap();
    let token = CancelToken::new();
    session.set_cancel(token.clone());
    // The first chunk's decode runs beside the second block's denoise; the platform
    // cancels as that decode starts.
    *platform.token.lock().unwrap() = Some(token);
    assert!(matches!(
        session.next_chunk(),
        Err(EngineError::Cancelled { .. })
    ));
    let pool = engine.kv_pool().unwrap();
    assert_eq!(pool.free_pages(), pool.total_pages());
    assert_eq!(allocated(&engine), floor);
    drop(session);
    let mut again = engine.open_session(overlapped()).unwrap();
    assert_eq!(
        again.next_chunk().unwrap().frames.to_vec::<u8>().unwrap(),
        reference[0]
    );
}
