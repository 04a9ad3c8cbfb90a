//! `config.json` readers: the transformer (`headroom_model::DitConfig::from_json`), the
//! VAE (`headroom_model::VaeConfig::from_json`) and the text encoder
//! (`headroom_text::Umt5Config::from_json`), each followed by the derived sizes a
//! loader computes from a config that passed.
#![no_main]

#[path = "../entries/model_configs.rs"]
mod entry;
use entry::model_configs;
use headroom_text::Umt5Config;
use libfuzzer_sys::fuzz_target;
// The 256 MiB heap bound (src/lib.rs) holds only where the library is linked.
use headroom_fuzz as _;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    model_configs(&json);
    if let Ok(c) = Umt5Config::from_json(&json) {
        let _ = c.inner_dim();
    }
});
