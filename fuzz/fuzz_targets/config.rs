//! `config.json` readers: the transformer (`headroom_model::DitConfig::from_json`), the
//! VAE (`headroom_model::VaeConfig::from_json`) and the text encoder
//! (`headroom_text::Umt5Config::from_json`), each followed by the derived sizes a
//! loader computes from a config that passed.
#![no_main]

use headroom_model::{DitConfig, VaeConfig};
use headroom_text::Umt5Config;
use libfuzzer_sys::fuzz_target;
// The 256 MiB heap bound (src/lib.rs) holds only where the library is linked.
use headroom_fuzz as _;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(c) = DitConfig::from_json(&json) {
        let _ = (c.dim(), c.out_channels(), c.takes_image_condition());
    }
    if let Ok(c) = VaeConfig::from_json(&json) {
        let _ = c.validate_latent_stats();
        let _ = (c.enc_dims(), c.dec_dims(), c.temperal_upsample());
        let _ = (c.spatial_factor(), c.temporal_factor());
    }
    if let Ok(c) = Umt5Config::from_json(&json) {
        let _ = c.inner_dim();
    }
});
