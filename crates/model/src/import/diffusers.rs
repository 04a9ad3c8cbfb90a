//! The diffusers layout (`WanTransformer3DModel`, `AutoencoderKLWan`): our own names, so
//! the renaming is the identity; a pipeline folder holds `transformer/` and `vae/`.

/// Whether `names` use diffusers' DiT names.
pub fn has_dit_names<'a>(mut names: impl Iterator<Item = &'a String>) -> bool {
    names.any(|k| k.starts_with("condition_embedder.") || k.contains(".attn1.to_q."))
}

/// Whether a `config.json` value is a diffusers model config (`num_attention_heads`
/// for the transformer, `base_dim` for the VAE).
pub fn is_diffusers_config(value: &serde_json::Value) -> bool {
    value.get("num_attention_heads").is_some() || value.get("base_dim").is_some()
}
