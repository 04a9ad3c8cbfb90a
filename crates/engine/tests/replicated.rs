//! Sessions led by rank 0 and followed by every other rank (ranks as threads here; the
//! same protocol runs across MPI processes): the frames of direct sharded execution, a
//! refused open that leaves every rank serving, and a rank that fails mid-session
//! ending every rank with an error that names it.

use std::sync::Arc;

use headroom_engine::replicated::{follow, lead_open, lead_shutdown};
use headroom_engine::{Engine, EngineConfig, EngineError, Mesh, Placement, SessionRequest};
use headroom_mem::{AllocatorConfig, CachingPlatform, Platform, ReclaimPolicy, MIB};
use headroom_model::camera::Keys;
use headroom_tensor::Device;

fn config() -> EngineConfig {
    EngineConfig {
        model: "tiny".to_string(),
        ..EngineConfig::default()
    }
}

fn platform(capacity: Option<u64>) -> Arc<dyn Platform> {
    Arc::new(
        CachingPlatform::cpu(capacity, AllocatorConfig::default(), ReclaimPolicy::Never).unwrap(),
    )
}

fn request() -> SessionRequest {
    SessionRequest {
        actions: vec![
            Keys {
                w: true,
                ..Keys::default()
            };
            6
        ],
        ..SessionRequest::new(64, 32, 21)
    }
}

#[test]
fn led_sessions_produce_the_frames_of_direct_sharded_execution() {
    let mesh = Mesh { tp: 2, sp: 2 };
    let direct = Engine::on_each_rank(
        mesh,
        &config(),
        |_| Ok(platform(None)),
        |_, engine| {
            let mut session = engine.open_session(request())?;
            let mut out = Vec::new();
            for _ in 0..session.chunks_total().unwrap() {
                out.extend(session.next_chunk()?.frames.to_vec::<u8>()?);
            }
            Ok(out)
        },
    )
    .unwrap();
    let led = mesh
        .run_threads(|groups| {
            let engine = Engine::load(
                config(),
                Placement::rank(Device::new(platform(None)), &groups),
            )?;
            if groups.rank() != 0 {
                follow(&engine, &groups.world)?;
                return Ok(None);
            }
            // A refused open (a frame count that is not 12·K − 3) leaves every rank
            // following, ready for the next one.
            let refused = lead_open(&engine, &groups.world, SessionRequest::new(64, 32, 20));
            assert!(
                matches!(refused, Err(EngineError::Request { .. })),
                "{refused:?}"
            );
            let mut session = lead_open(&engine, &groups.world, request())?;
            let total = session.session().map_or(0, |s| s.chunks_total().unwrap());
            let mut out = Vec::new();
            for _ in 0..total {
                out.extend(session.next_chunk()?.frames.to_vec::<u8>()?);
            }
            let ranks = session.close(&engine)?;
            lead_shutdown(&groups.world)?;
            Ok(Some((out, ranks)))
        })
        .unwrap();
    let (frames, ranks) = led[0].clone().unwrap();
    assert_eq!(frames, direct[0], "rank 0 leads the same session");
    assert_eq!(ranks.len(), 4);
    for (w, r) in ranks.iter().enumerate() {
        assert_eq!((r.rank, r.tp_rank, r.sp_rank), (w, w % 2, w / 2));
        assert!(r.reserved_peak_bytes >= r.allocated_peak_bytes && r.allocated_peak_bytes > 0);
        assert!(r.post_session_reserved_bytes <= r.reserved_peak_bytes);
    }
}

#[test]
fn a_rank_that_runs_out_of_memory_mid_session_ends_every_rank_naming_it() {
    let mesh = Mesh { tp: 1, sp: 2 };
    // Rank 1 holds its weights but not a session's activations.
    let weights = {
        let p = platform(None);
        let _engine = Engine::load(config(), Placement::host(Arc::clone(&p))).unwrap();
        p.memory_stats().reserved_bytes.all().current as u64
    };
    let err = mesh
        .run_threads(|groups| {
            let capacity = (groups.rank() == 1).then_some(weights + 2 * MIB);
            let engine = Engine::load(
                config(),
                Placement::rank(Device::new(platform(capacity)), &groups),
            )?;
            if groups.rank() != 0 {
                return follow(&engine, &groups.world);
            }
            let mut session = lead_open(&engine, &groups.world, request())?;
            for _ in 0..3 {
                session.next_chunk()?;
            }
            Ok(())
        })
        .unwrap_err();
    match &err {
        EngineError::Rank { rank, reason, .. } => {
            assert!(*rank == 1, "rank {rank}: {reason}");
        }
        other => panic!("not a rank failure: {other}"),
    }
}
