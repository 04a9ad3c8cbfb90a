//! The embedded `world` model, as the commands take it: the folder itself lives in
//! [`headroom_engine::builtin_world`] (the Python wheel carries it too).

use anyhow::Result;

pub use headroom_engine::builtin_world::WORLD;

/// `--model` as the engine takes it: `world` becomes the folder of the embedded model
/// (written on first use); anything else is passed through.
pub fn resolve(model: &str) -> Result<String> {
    Ok(headroom_engine::builtin_world::resolve(model)?)
}
