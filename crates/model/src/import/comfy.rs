//! ComfyUI-style single files: one `.safetensors` whose keys are
//! `model.diffusion_model.` + original Wan names (some tools write a bare `model.`).

/// The wrapper prefixes, longest first.
pub const PREFIXES: [&str; 2] = ["model.diffusion_model.", "model."];

/// The prefix to strip if every DiT tensor of `names` sits under one.
pub fn prefix<'a>(names: impl Iterator<Item = &'a String> + Clone) -> Option<&'static str> {
    PREFIXES.into_iter().find(|p| {
        names
            .clone()
            .any(|k| k.starts_with(p) && k.ends_with("patch_embedding.weight"))
    })
}

/// The name under the wrapper, or `None` for a tensor outside it (a bundled VAE or
/// text encoder in an all-in-one file).
pub fn unwrap(key: &str, prefix: &str) -> Option<String> {
    key.strip_prefix(prefix).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diffusion_model_prefix_is_stripped_and_other_parts_dropped() {
        let names: Vec<String> = [
            "model.diffusion_model.patch_embedding.weight",
            "vae.conv1.weight",
        ]
        .map(String::from)
        .to_vec();
        let p = prefix(names.iter()).unwrap();
        assert_eq!(p, "model.diffusion_model.");
        assert_eq!(
            unwrap(&names[0], p).as_deref(),
            Some("patch_embedding.weight")
        );
        assert_eq!(unwrap(&names[1], p), None);
    }
}
