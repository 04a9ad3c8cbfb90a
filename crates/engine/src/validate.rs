//! The rules a deployment and a request must meet that can be checked before any
//! weights load: the mesh divides the model's heads, the shape meets the architecture.
//! The per-request shape and camera rules themselves are in [`crate::model_source`].

use headroom_model::DitConfig;

use crate::config::EngineConfig;
use crate::error::{EngineError, Result};
use crate::mesh::Mesh;
use crate::model_source::{check_shape, ModelSource};

/// Refuses a mesh whose degrees do not divide the model's heads (`tp · sp`) and FFN
/// width (`tp`), read from the preset or the folder's `config.json` before any weights
/// load (a `--transformer` checkpoint is checked as it loads).
pub fn check_mesh(config: &EngineConfig, mesh: Mesh) -> Result<()> {
    mesh.validate()?;
    if mesh == Mesh::SINGLE || config.transformer.is_some() {
        return Ok(());
    }
    check_heads(&ModelSource::resolve(&config.model)?.dit_config()?, mesh)
}

/// Refuses a mesh whose degrees do not divide `dit`'s heads (`tp · sp`) or FFN width
/// (`tp`).
pub fn check_heads(dit: &DitConfig, mesh: Mesh) -> Result<()> {
    let (tp, sp) = (mesh.tp, mesh.sp);
    if !dit.num_attention_heads.is_multiple_of(tp * sp) || !dit.ffn_dim.is_multiple_of(tp) {
        return Err(EngineError::request(
            "tp/sp",
            format!(
                "the model's {} attention heads must divide by tp·sp = {tp}·{sp} = {} and its FFN width {} by tp = {tp}",
                dit.num_attention_heads,
                tp * sp,
                dit.ffn_dim
            ),
        ));
    }
    Ok(())
}

/// Checks what `config` and a session of `width × height × num_frames` on `mesh` can
/// be told before any weights load, reading the model's configs once: the model
/// resolves, the mesh divides its heads (as [`check_mesh`]), and the
/// shape meets the declared architecture's rules.
pub fn check_request(
    config: &EngineConfig,
    mesh: Mesh,
    width: usize,
    height: usize,
    num_frames: usize,
) -> Result<()> {
    mesh.validate()?;
    let source = ModelSource::resolve(&config.model)?;
    let dit = source.dit_config()?;
    // A `--transformer` checkpoint's heads are checked as it loads.
    if mesh != Mesh::SINGLE && config.transformer.is_none() {
        check_heads(&dit, mesh)?;
    }
    check_shape(
        &dit,
        &source.vae_config()?,
        mesh.sp,
        width,
        height,
        num_frames,
    )
    .map(|_| ())
}
