//! Contracts of the streaming decoder (REFERENCE.md §5), on seeded tiny VAEs.

use std::sync::Arc;

use headroom_mem::{
    AllocatorConfig, CachingPlatform, Phase, Platform, PlatformCall, ReclaimPolicy,
    RecordingPlatform, TraceAction,
};
use headroom_model::{
    DecodeControl, OutputFormat, StreamingDecodeState, StreamingDecoder, VaeConfig, WanVae,
};
use headroom_tensor::{DType, Device, Tensor};

/// WAN.md §2.11's tiny config with attention in the encoder: temporal ×2, spatial ×2.
fn tiny() -> VaeConfig {
    VaeConfig {
        base_dim: 8,
        z_dim: 4,
        dim_mult: vec![1, 2],
        num_res_blocks: 1,
        temperal_downsample: vec![true],
        latents_mean: vec![0.1, -0.2, 0.3, 0.0],
        latents_std: vec![1.5, 0.5, 2.0, 1.0],
        ..VaeConfig::default()
    }
}

/// Two temporal stages (×4 like Wan 2.1), spatial ×4.
fn tiny_x4() -> VaeConfig {
    VaeConfig {
        dim_mult: vec![1, 2, 2],
        temperal_downsample: vec![true, true],
        ..tiny()
    }
}

fn vae(config: VaeConfig, device: &Device) -> WanVae {
    WanVae::seeded(config, 7, device, DType::F32).unwrap()
}

fn latents(t: usize, seed: u64, device: &Device) -> Tensor {
    Tensor::randn(&[1, 4, t, 4, 6], seed, 0, DType::F32, device).unwrap()
}

/// Decodes frames `start..start + len` of `z` as the session's next chunk.
fn decode(
    decoder: &StreamingDecoder<'_>,
    z: &Tensor,
    state: &mut StreamingDecodeState,
    start: usize,
    len: usize,
) -> Tensor {
    let chunk = z.narrow(2, start, len).unwrap();
    decoder
        .decode_chunk(&chunk, state, OutputFormat::Video, true)
        .unwrap()
        .unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn decode_in_chunks(vae: &WanVae, z: &Tensor, chunks: &[usize]) -> Tensor {
    let decoder = StreamingDecoder::new(vae, None);
    let mut state = StreamingDecodeState::new("s").unwrap();
    let mut outs = Vec::new();
    let mut at = 0;
    for &n in chunks {
        let chunk = z.narrow(2, at, n).unwrap();
        outs.push(
            decoder
                .decode_chunk(&chunk, &mut state, OutputFormat::Video, true)
                .unwrap()
                .unwrap(),
        );
        at += n;
    }
    let refs: Vec<&Tensor> = outs.iter().collect();
    Tensor::cat(&refs, 2).unwrap()
}

/// In f32 and in bf16 (whose 3×3×3 convs run on pair planes on the avx512bf16 path).
#[test]
fn chunked_decode_equals_one_call_decode_bit_for_bit() {
    let dev = Device::cpu().unwrap();
    for dtype in [DType::F32, DType::BF16] {
        let vae = WanVae::seeded(tiny_x4(), 7, &dev, dtype).unwrap();
        let z9 = latents(9, 1, &dev);
        let whole = vae.decode(&z9).unwrap();
        assert_eq!(whole.shape(), [1, 3, 1 + 4 * 8, 16, 24]);
        for chunks in [&[3, 3, 3][..], &[2, 4, 3], &[9]] {
            assert_eq!(
                bits(&decode_in_chunks(&vae, &z9, chunks)),
                bits(&whole),
                "{dtype:?} {chunks:?}"
            );
        }
        let z5 = z9.narrow(2, 0, 5).unwrap();
        assert_eq!(
            bits(&decode_in_chunks(&vae, &z5, &[1, 1, 1, 1, 1])),
            bits(&vae.decode(&z5).unwrap()),
            "{dtype:?}"
        );
    }
}

#[test]
fn the_state_is_read_a_continued_chunk_differs_from_a_fresh_one() {
    let dev = Device::cpu().unwrap();
    let vae = vae(tiny_x4(), &dev);
    let z = latents(6, 2, &dev);
    let decoder = StreamingDecoder::new(&vae, None);
    let mut state = StreamingDecodeState::new("a").unwrap();
    decoder
        .decode_chunk(
            &z.narrow(2, 0, 3).unwrap(),
            &mut state,
            OutputFormat::Video,
            true,
        )
        .unwrap();
    let continued = decode(&decoder, &z, &mut state, 3, 3);
    let mut fresh = StreamingDecodeState::new("b").unwrap();
    let alone = decode(&decoder, &z, &mut fresh, 3, 3);
    assert_eq!(continued.shape(), [1, 3, 12, 16, 24]);
    assert_eq!(alone.shape(), [1, 3, 9, 16, 24]);
    assert_ne!(
        bits(&continued.narrow(2, 3, 9).unwrap().contiguous().unwrap()),
        bits(&alone)
    );
}

#[test]
fn interleaved_sessions_keep_independent_context() {
    let dev = Device::cpu().unwrap();
    let vae = vae(tiny(), &dev);
    let (za, zb) = (latents(4, 3, &dev), latents(4, 4, &dev));
    let decoder = StreamingDecoder::new(&vae, None);
    let (mut sa, mut sb) = (
        StreamingDecodeState::new("a").unwrap(),
        StreamingDecodeState::new("b").unwrap(),
    );
    let mut outs_a = Vec::new();
    let mut outs_b = Vec::new();
    for i in 0..2 {
        let ca = za.narrow(2, 2 * i, 2).unwrap();
        let cb = zb.narrow(2, 2 * i, 2).unwrap();
        outs_a.push(
            decoder
                .decode_chunk(&ca, &mut sa, OutputFormat::Video, true)
                .unwrap()
                .unwrap(),
        );
        outs_b.push(
            decoder
                .decode_chunk(&cb, &mut sb, OutputFormat::Video, true)
                .unwrap()
                .unwrap(),
        );
    }
    let a = Tensor::cat(&outs_a.iter().collect::<Vec<_>>(), 2).unwrap();
    let b = Tensor::cat(&outs_b.iter().collect::<Vec<_>>(), 2).unwrap();
    assert_eq!(bits(&a), bits(&vae.decode(&za).unwrap()));
    assert_eq!(bits(&b), bits(&vae.decode(&zb).unwrap()));
}

#[test]
fn frame_counts_and_counters_follow_the_temporal_factor() {
    let dev = Device::cpu().unwrap();
    let vae = vae(tiny_x4(), &dev);
    let decoder = StreamingDecoder::new(&vae, None);
    let mut state = StreamingDecodeState::new("s").unwrap();
    let z = latents(6, 5, &dev);
    let first = decode(&decoder, &z, &mut state, 0, 3);
    assert_eq!(first.shape()[2], 9);
    assert_eq!((state.chunks_decoded, state.frames_decoded), (1, 9));
    let second = decode(&decoder, &z, &mut state, 3, 3);
    assert_eq!(second.shape()[2], 12);
    assert_eq!((state.chunks_decoded, state.frames_decoded), (2, 21));
}

#[test]
fn state_bytes_are_declared_by_the_config_and_constant_from_the_second_chunk() {
    let dev = Device::cpu().unwrap();
    for config in [tiny(), tiny_x4()] {
        let vae = vae(config, &dev);
        let decoder = StreamingDecoder::new(&vae, None);
        let mut state = StreamingDecodeState::new("s").unwrap();
        assert_eq!(state.nbytes(), 0);
        let z = latents(10, 6, &dev);
        let s = vae.config().spatial_factor();
        let declared = decoder.declared_state_bytes(4 * s, 6 * s, DType::F32);
        for i in 0..10 {
            decoder
                .decode_chunk(
                    &z.narrow(2, i, 1).unwrap(),
                    &mut state,
                    OutputFormat::Video,
                    false,
                )
                .unwrap();
            // A stream's first chunk leaves slots short of frames (they stand for
            // zeros); from the second on every slot is full.
            assert!(state.nbytes() > 0);
            if i == 0 {
                assert!(state.nbytes() < declared, "after chunk 0");
            } else {
                assert_eq!(state.nbytes(), declared, "after chunk {i}");
            }
        }
        // bf16 state halves it (two latent frames fill every slot).
        let half = StreamingDecoder::new(&vae, Some(DType::BF16));
        let mut state = StreamingDecodeState::new("h").unwrap();
        half.decode_chunk(
            &z.narrow(2, 0, 2).unwrap(),
            &mut state,
            OutputFormat::Video,
            false,
        )
        .unwrap();
        assert_eq!(state.nbytes() * 2, declared);
    }
}

#[test]
fn release_returns_the_session_to_its_pre_stream_state() {
    let dev = Device::cpu().unwrap();
    let vae = vae(tiny_x4(), &dev);
    let decoder = StreamingDecoder::new(&vae, None);
    let mut state = StreamingDecodeState::new("s").unwrap();
    let z = latents(3, 7, &dev);
    let first = decoder
        .decode_chunk(&z, &mut state, OutputFormat::Video, true)
        .unwrap()
        .unwrap();
    decoder
        .decode_chunk(&z, &mut state, OutputFormat::Video, true)
        .unwrap();
    state.release();
    assert_eq!(
        (state.nbytes(), state.chunks_decoded, state.frames_decoded),
        (0, 0, 0)
    );
    let again = decoder
        .decode_chunk(&z, &mut state, OutputFormat::Video, true)
        .unwrap()
        .unwrap();
    assert_eq!(again.shape()[2], 9, "the next chunk is short again");
    assert_eq!(bits(&again), bits(&first));
}

#[test]
fn a_rank_that_produces_no_output_still_advances() {
    let dev = Device::cpu().unwrap();
    let vae = vae(tiny_x4(), &dev);
    let decoder = StreamingDecoder::new(&vae, None);
    let z = latents(6, 8, &dev);
    let mut silent = StreamingDecodeState::new("s").unwrap();
    assert!(decoder
        .decode_chunk(
            &z.narrow(2, 0, 3).unwrap(),
            &mut silent,
            OutputFormat::Video,
            false
        )
        .unwrap()
        .is_none());
    assert_eq!((silent.chunks_decoded, silent.frames_decoded), (1, 9));
    let after = decode(&decoder, &z, &mut silent, 3, 3);
    let whole = vae.decode(&z).unwrap();
    assert_eq!(
        bits(&after),
        bits(&whole.narrow(2, 9, 12).unwrap().contiguous().unwrap())
    );
}

#[test]
fn planar_uint8_quantises_the_clamped_video() {
    let dev = Device::cpu().unwrap();
    let vae = vae(tiny(), &dev);
    let decoder = StreamingDecoder::new(&vae, None);
    let z = latents(2, 9, &dev);
    let mut s1 = StreamingDecodeState::new("a").unwrap();
    let mut s2 = StreamingDecodeState::new("b").unwrap();
    let video = decoder
        .decode_chunk(&z, &mut s1, OutputFormat::Video, true)
        .unwrap()
        .unwrap();
    let pixels = decoder
        .decode_chunk(&z, &mut s2, OutputFormat::PlanarUint8, true)
        .unwrap()
        .unwrap();
    assert_eq!(pixels.dtype(), DType::U8);
    assert_eq!(pixels.shape(), &video.shape()[1..]);
    let v = video.to_vec::<f32>().unwrap();
    assert!(v.iter().all(|x| (-1.0..=1.0).contains(x)));
    let expected: Vec<u8> = v
        .iter()
        .map(|&x| headroom_tensor::ops::pixels::to_pixel(x))
        .collect();
    assert_eq!(pixels.to_vec::<u8>().unwrap(), expected);
}

#[test]
fn bad_inputs_are_rejected_with_clear_errors_and_counters_unchanged() {
    let dev = Device::cpu().unwrap();
    let vae = vae(tiny(), &dev);
    let other = WanVae::seeded(tiny(), 8, &dev, DType::F32).unwrap();
    let decoder = StreamingDecoder::new(&vae, None);
    let mut state = StreamingDecodeState::new("s").unwrap();
    decoder
        .decode_chunk(&latents(1, 1, &dev), &mut state, OutputFormat::Video, false)
        .unwrap();
    let cases: Vec<(Tensor, &str)> = vec![
        (
            Tensor::zeros(&[4, 1, 4, 6], DType::F32, &dev).unwrap(),
            "5-D",
        ),
        (
            Tensor::zeros(&[1, 4, 0, 4, 6], DType::F32, &dev).unwrap(),
            "T = 0",
        ),
        (
            Tensor::zeros(&[2, 4, 1, 4, 6], DType::F32, &dev).unwrap(),
            "batch must be 1",
        ),
        (
            Tensor::zeros(&[1, 5, 1, 4, 6], DType::F32, &dev).unwrap(),
            "z_dim",
        ),
    ];
    for (z, expected) in cases {
        let err = decoder
            .decode_chunk(&z, &mut state, OutputFormat::Video, true)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("decode_chunk:") && err.contains(expected),
            "{err}"
        );
        assert_eq!((state.chunks_decoded, state.frames_decoded), (1, 1));
    }
    let err = StreamingDecoder::new(&other, None)
        .decode_chunk(&latents(1, 1, &dev), &mut state, OutputFormat::Video, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("another decoder"), "{err}");
    assert!(StreamingDecodeState::new("  ")
        .unwrap_err()
        .to_string()
        .contains("blank"));
    assert!("mp4"
        .parse::<OutputFormat>()
        .unwrap_err()
        .to_string()
        .contains("unknown output format"));
    let wan22 = VaeConfig {
        is_residual: true,
        ..tiny()
    };
    let err = WanVae::seeded(wan22, 1, &dev, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Wan 2.2"), "{err}");
}

#[test]
fn the_shared_vae_is_not_mutated_by_a_session() {
    let dev = Device::cpu().unwrap();
    let vae = vae(tiny(), &dev);
    let z = latents(3, 10, &dev);
    let before = bits(&vae.decode(&z).unwrap());
    let decoder = StreamingDecoder::new(&vae, None);
    let mut state = StreamingDecodeState::new("s").unwrap();
    decoder
        .decode_chunk(&latents(5, 11, &dev), &mut state, OutputFormat::Video, true)
        .unwrap();
    assert_eq!(bits(&vae.decode(&z).unwrap()), before);
}

fn recording_device(policy: ReclaimPolicy, caches: bool) -> (Arc<RecordingPlatform>, Device) {
    let inner = CachingPlatform::cpu(None, AllocatorConfig::default(), policy).unwrap();
    inner.allocator().set_history(1 << 20);
    let recording = Arc::new(RecordingPlatform::with_caching(Arc::new(inner), caches));
    let device = Device::new(recording.clone());
    (recording, device)
}

/// The engine's `decode_start` (`headroom_engine::phases::DecodeStart`) as the control
/// a session's decode runs under.
struct DecodeStart<'a>(&'a dyn Platform);

impl DecodeControl for DecodeStart<'_> {
    fn started(&self) {
        self.0.phase(Phase::DecodeStart);
    }
}

#[test]
fn decode_chunk_reclaims_first_before_any_decode_allocation() {
    let (platform, dev) = recording_device(ReclaimPolicy::BeforeDecode, true);
    let vae = vae(tiny(), &dev);
    let z = latents(2, 12, &dev);
    // Leave cached memory behind, as a denoise loop would.
    drop(Tensor::zeros(&[1 << 20], DType::F32, &dev).unwrap());
    platform.clear();
    let decoder = StreamingDecoder::new(&vae, None);
    let mut state = StreamingDecodeState::new("s").unwrap();
    let control = DecodeStart(platform.as_ref());
    decoder
        .decode_chunk_with(&z, &mut state, OutputFormat::Video, true, &control)
        .unwrap();
    let calls = platform.calls();
    assert_eq!(
        calls.first(),
        Some(&PlatformCall::Phase(Phase::DecodeStart))
    );
    assert_eq!(platform.count(PlatformCall::EmptyCache), 1);
    let trace = platform.allocator().trace();
    let phase = trace
        .iter()
        .rposition(|e| e.action == TraceAction::Phase)
        .unwrap();
    assert_eq!(trace[phase].name.as_deref(), Some("decode_start"));
    assert_eq!(trace[phase + 1].action, TraceAction::EmptyCache);
    let first_alloc = trace
        .iter()
        .skip(phase)
        .position(|e| e.action == TraceAction::Alloc)
        .unwrap();
    assert!(trace[phase..phase + first_alloc]
        .iter()
        .all(|e| e.action != TraceAction::Alloc));
    assert_eq!(platform.memory_stats().num_reclaims, 1);
}

#[test]
fn a_platform_that_does_not_cache_device_memory_is_never_asked_to_reclaim() {
    let (platform, dev) = recording_device(ReclaimPolicy::BeforeDecode, false);
    let vae = vae(tiny(), &dev);
    let decoder = StreamingDecoder::new(&vae, None);
    let mut state = StreamingDecodeState::new("s").unwrap();
    let control = DecodeStart(platform.as_ref());
    let z = latents(2, 13, &dev);
    decoder
        .decode_chunk_with(&z, &mut state, OutputFormat::Video, true, &control)
        .unwrap();
    assert_eq!(platform.count(PlatformCall::Phase(Phase::DecodeStart)), 1);
    assert_eq!(platform.count(PlatformCall::EmptyCache), 0);
    // A decode on its own (no control) names no phase: the schedule is its driver's.
    decoder
        .decode_chunk(&z, &mut state, OutputFormat::Video, true)
        .unwrap();
    assert_eq!(platform.count(PlatformCall::Phase(Phase::DecodeStart)), 1);
}

#[test]
fn decode_peak_per_frame_does_not_grow_with_frames_decoded() {
    let dev = Device::cpu().unwrap();
    let vae = vae(tiny_x4(), &dev);
    let decoder = StreamingDecoder::new(&vae, None);
    let mut state = StreamingDecodeState::new("s").unwrap();
    let z = latents(12, 14, &dev);
    let platform = dev.platform().clone();
    let mut peaks = Vec::new();
    for i in 0..12 {
        let base = platform.memory_stats().requested_bytes.all().current;
        platform.reset_peak_stats();
        decoder
            .decode_chunk(
                &z.narrow(2, i, 1).unwrap(),
                &mut state,
                OutputFormat::Video,
                false,
            )
            .unwrap();
        peaks.push(platform.memory_stats().requested_bytes.all().peak - base);
    }
    // From the second frame on (the first is short), every frame peaks the same.
    assert!(peaks[2..].iter().all(|&p| p == peaks[2]), "{peaks:?}");
}
