//! Several sessions' VAE chunks as one batch (their caches stacked along the batch
//! axis) give each session the bytes it gets alone: the streaming decode and the
//! streamed condition encode, chunk after chunk, on every CPU path this machine runs.

use headroom_model::vae::StreamingEncodeState;
use headroom_model::{OutputFormat, StreamingDecodeState, StreamingDecoder, VaeConfig, WanVae};
use headroom_tensor::kernels::cpu::{set_path, CpuPath};
use headroom_tensor::{DType, Device, Tensor};

fn config() -> VaeConfig {
    VaeConfig {
        base_dim: 8,
        z_dim: 4,
        num_res_blocks: 1,
        latents_mean: vec![0.1, -0.2, 0.3, 0.0],
        latents_std: vec![1.5, 0.5, 2.0, 1.0],
        ..VaeConfig::default()
    }
}

fn bytes(t: &Tensor) -> Vec<u8> {
    t.host_bytes().unwrap().to_vec()
}

#[test]
fn batched_decodes_and_encodes_give_each_stream_its_bytes_alone_on_every_path() {
    let dev = Device::cpu().unwrap();
    let mut ran = Vec::new();
    for path in CpuPath::ALL.into_iter().filter(|p| p.supported()) {
        set_path(Some(path)).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let vae = WanVae::seeded(config(), 3, &dev, dtype).unwrap();
            let decoder = StreamingDecoder::new(&vae, None);
            let chunk = |s: u64, c: u64| {
                Tensor::randn(&[1, 4, 2, 2, 4], 10 * s + c, 0, DType::F32, &dev).unwrap()
            };
            let pixels = |s: u64, c: u64, t: usize| {
                Tensor::randn(&[1, 3, t, 16, 32], 100 * s + c, 0, DType::F32, &dev)
                    .unwrap()
                    .clamp(-1.0, 1.0)
                    .unwrap()
            };
            for n in [1u64, 3] {
                let mut alone: Vec<StreamingDecodeState> = (0..n)
                    .map(|k| StreamingDecodeState::new(&format!("a{k}")).unwrap())
                    .collect();
                let mut batched: Vec<StreamingDecodeState> = (0..n)
                    .map(|k| StreamingDecodeState::new(&format!("b{k}")).unwrap())
                    .collect();
                let mut enc_alone: Vec<StreamingEncodeState> =
                    (0..n).map(|_| StreamingEncodeState::default()).collect();
                let mut enc_batched: Vec<StreamingEncodeState> =
                    (0..n).map(|_| StreamingEncodeState::default()).collect();
                for c in 0..3u64 {
                    let latents: Vec<Tensor> = (0..n).map(|s| chunk(s, c)).collect();
                    let expected: Vec<Vec<u8>> = latents
                        .iter()
                        .zip(&mut alone)
                        .map(|(z, st)| {
                            let out = decoder
                                .decode_chunk(z, st, OutputFormat::PlanarUint8, true)
                                .unwrap()
                                .unwrap();
                            bytes(&out)
                        })
                        .collect();
                    let refs: Vec<&Tensor> = latents.iter().collect();
                    let mut states: Vec<&mut StreamingDecodeState> = batched.iter_mut().collect();
                    let got = decoder
                        .decode_batch(&refs, &mut states, OutputFormat::PlanarUint8)
                        .unwrap();
                    for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
                        assert!(
                            bytes(g) == *e,
                            "{path} {dtype:?} batch of {n}: stream {k} chunk {c} decode differs"
                        );
                    }
                    // The streamed encode: the first frame and one chunk of 4, then 4.
                    let t = if c == 0 { 5 } else { 4 };
                    let videos: Vec<Tensor> = (0..n).map(|s| pixels(s, c, t)).collect();
                    let expected: Vec<Vec<u8>> = videos
                        .iter()
                        .zip(&mut enc_alone)
                        .map(|(v, st)| bytes(&vae.encode_frames(v, st).unwrap()))
                        .collect();
                    let refs: Vec<&Tensor> = videos.iter().collect();
                    let mut states: Vec<&mut StreamingEncodeState> =
                        enc_batched.iter_mut().collect();
                    let got = vae.encode_frames_batch(&refs, &mut states).unwrap();
                    for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
                        assert!(
                            bytes(g) == *e,
                            "{path} {dtype:?} batch of {n}: stream {k} chunk {c} encode differs"
                        );
                    }
                }
                for (a, b) in alone.iter().zip(&batched) {
                    assert_eq!(a.nbytes(), b.nbytes());
                    assert_eq!(a.frames_decoded, b.frames_decoded);
                }
            }
        }
        ran.push(path.name());
    }
    set_path(None).unwrap();
    println!("paths checked: {ran:?}");
}

#[test]
fn a_batch_of_streams_at_different_points_is_refused_naming_the_rule() {
    let dev = Device::cpu().unwrap();
    let vae = WanVae::seeded(config(), 3, &dev, DType::F32).unwrap();
    let decoder = StreamingDecoder::new(&vae, None);
    let z = Tensor::randn(&[1, 4, 3, 4, 6], 1, 0, DType::F32, &dev).unwrap();
    let mut ahead = StreamingDecodeState::new("ahead").unwrap();
    decoder
        .decode_chunk(&z, &mut ahead, OutputFormat::Video, false)
        .unwrap();
    let mut fresh = StreamingDecodeState::new("fresh").unwrap();
    let err = decoder
        .decode_batch(
            &[&z, &z],
            &mut [&mut ahead, &mut fresh],
            OutputFormat::Video,
        )
        .unwrap_err();
    assert!(err.to_string().contains("same point"), "{err}");
    let small = Tensor::randn(&[1, 4, 3, 2, 6], 1, 0, DType::F32, &dev).unwrap();
    let mut a = StreamingDecodeState::new("a").unwrap();
    let mut b = StreamingDecodeState::new("b").unwrap();
    let err = decoder
        .decode_batch(&[&z, &small], &mut [&mut a, &mut b], OutputFormat::Video)
        .unwrap_err();
    assert!(err.to_string().contains("one shape"), "{err}");
}
