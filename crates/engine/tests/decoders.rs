//! Sessions choose their decoder: the model's own VAE or a TAEHV tiny one (seeded weights
//! of taew2_1's shapes on the tiny built-in model), alone and batched together, with the
//! decoder state admission counts and the refusal of a tiny decoder that is not loaded.

use headroom_engine::{scheduler, Engine, EngineConfig, EngineError, Session, SessionRequest};
use headroom_model::DecoderKind;

fn engine(decoder: DecoderKind) -> Engine {
    Engine::new(EngineConfig {
        model: "tiny".to_string(),
        kv_budget_bytes: Some(64 << 20),
        max_sessions: 4,
        decoder,
        ..EngineConfig::default()
    })
    .unwrap()
}

fn request(k: usize, decoder: Option<DecoderKind>) -> SessionRequest {
    SessionRequest {
        seed: 20 + k as u64,
        decoder,
        ..SessionRequest::new(48, 32, [21, 33, 21, 33][k])
    }
}

fn run(engine: &Engine, request: SessionRequest) -> Vec<Vec<u8>> {
    let mut session = engine.open_session(request).unwrap();
    (0..session.chunks_total().unwrap())
        .map(|_| session.next_chunk().unwrap().frames.to_vec::<u8>().unwrap())
        .collect()
}

#[test]
fn a_tiny_decoder_session_streams_the_same_frames_count_and_its_own_bytes() {
    let engine = engine(DecoderKind::Tiny);
    let tiny = run(&engine, request(1, None));
    let again = run(&engine, request(1, Some(DecoderKind::Tiny)));
    let full = run(&engine, request(1, Some(DecoderKind::Full)));
    assert_eq!(tiny, again, "the same seed decodes to the same bytes");
    let sizes = |chunks: &[Vec<u8>]| {
        chunks
            .iter()
            .map(|c| c.len() / (32 * 48 * 3))
            .collect::<Vec<_>>()
    };
    assert_eq!(sizes(&tiny), [9, 12, 12]);
    assert_eq!(sizes(&tiny), sizes(&full));
    assert_ne!(tiny, full, "the two decoders make different pixels");
    // Admission counts one frame per memory block: 9 of them, f32 here.
    let tiny_state = engine
        .decoder_for(Some(DecoderKind::Tiny))
        .unwrap()
        .state_bytes(480, 832);
    let per_block: u64 = [(256, 60 * 104), (128, 120 * 208), (64, 240 * 416)]
        .iter()
        .map(|(c, px)| 3 * c * px * 4)
        .sum();
    assert_eq!(tiny_state, per_block);
}

#[test]
fn sessions_of_both_decoders_stepped_together_stream_what_each_streams_alone() {
    let engine = engine(DecoderKind::Tiny);
    let kinds = [
        Some(DecoderKind::Tiny),
        Some(DecoderKind::Full),
        None,
        Some(DecoderKind::Full),
    ];
    let expected: Vec<Vec<Vec<u8>>> = (0..4).map(|k| run(&engine, request(k, kinds[k]))).collect();
    let mut sessions: Vec<Session> = (0..4)
        .map(|k| engine.open_session(request(k, kinds[k])).unwrap())
        .collect();
    let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 4];
    loop {
        let (ids, mut refs): (Vec<usize>, Vec<&mut Session>) = sessions
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| s.chunks_total().is_some_and(|t| s.chunks_done() < t))
            .unzip();
        if ids.is_empty() {
            break;
        }
        for (k, chunk) in ids.into_iter().zip(scheduler::next_chunks(&mut refs)) {
            got[k].push(chunk.unwrap().frames.to_vec::<u8>().unwrap());
        }
    }
    assert_eq!(got, expected);
}

#[test]
fn a_tiny_decoder_is_refused_by_name_where_none_is_loaded() {
    let engine = engine(DecoderKind::Full);
    assert!(engine.tiny_decoder().is_none());
    match engine.open_session(request(0, Some(DecoderKind::Tiny))) {
        Err(EngineError::Request { field, rule }) => {
            assert_eq!(field, "decoder");
            assert!(rule.contains("--tiny-decoder"), "{rule}");
        }
        other => panic!("expected a refusal naming decoder, got {other:?}"),
    }
    // The engine keeps serving.
    assert_eq!(run(&engine, request(0, None)).len(), 2);
}
