//! The real Wan 2.1 VAE built on a modelled device (no bytes): sizes only.

use headroom_model::{StreamingDecoder, VaeConfig, WanVae};
use headroom_tensor::{DType, Device};

#[test]
fn the_full_wan_vae_streaming_state_at_480x832_is_about_1801_mib_in_bf16() {
    let dev = Device::sim(64 << 30).unwrap();
    let vae = WanVae::seeded(VaeConfig::default(), 1, &dev, DType::BF16).unwrap();
    let decoder = StreamingDecoder::new(&vae, Some(DType::BF16));
    let bytes = decoder.declared_state_bytes(480, 832, DType::BF16);
    let mib = bytes as f64 / (1 << 20) as f64;
    println!("declared state: {mib:.1} MiB");
    assert!((mib - 1801.0).abs() < 2.0, "{mib} MiB");
}
