//! The model half of the `config` target, shared by the fuzz target and the model's
//! corpus replay: the transformer and VAE `config.json` readers, then the sizes a loader
//! derives from a config that passed.

use headroom_model::{DitConfig, VaeConfig};

/// Reads `json` as a transformer and as a VAE config.
pub fn model_configs(json: &serde_json::Value) {
    if let Ok(c) = DitConfig::from_json(json) {
        let _ = (c.dim(), c.out_channels(), c.takes_image_condition());
    }
    if let Ok(c) = VaeConfig::from_json(json) {
        let _ = c.validate_latent_stats();
        let _ = (c.enc_dims(), c.dec_dims(), c.temperal_upsample());
        let _ = (c.spatial_factor(), c.temporal_factor());
    }
}
