//! Self-Forcing checkpoints (`checkpoints/self_forcing_dmd.pt`): a torch pickle of a dict
//! with `generator_ema` (and possibly `generator`, `critic`), each a flat dict whose
//! keys are `model.` + original Wan names. The EMA weights are the ones to run; the
//! plain generator is the fallback; the critic is never loaded.

/// The wrapper prefixes, in order of preference.
pub const PREFIXES: [&str; 2] = ["generator_ema.", "generator."];

/// The prefix to read if `names` hold a Self-Forcing checkpoint.
pub fn prefix<'a>(names: impl Iterator<Item = &'a String> + Clone) -> Option<&'static str> {
    PREFIXES
        .into_iter()
        .find(|p| names.clone().any(|k| k.starts_with(p)))
}

/// The name under the wrapper: `generator_ema.model.blocks.0…` → `blocks.0…`.
pub fn unwrap(key: &str, prefix: &str) -> Option<String> {
    let inner = key.strip_prefix(prefix)?;
    Some(inner.strip_prefix("model.").unwrap_or(inner).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ema_generator_wins_over_the_plain_one_and_the_critic_is_dropped() {
        let names: Vec<String> = [
            "critic.model.x",
            "generator.model.a",
            "generator_ema.model.a",
        ]
        .map(String::from)
        .to_vec();
        let p = prefix(names.iter()).unwrap();
        assert_eq!(p, "generator_ema.");
        assert_eq!(
            unwrap("generator_ema.model.blocks.0.w", p).as_deref(),
            Some("blocks.0.w")
        );
        assert_eq!(unwrap("critic.model.a", p), None);
        assert_eq!(unwrap("generator.model.a", p), None);
    }
}
