//! Text prompts: the one place a client's prompt becomes the engine's.
//!
//! The engine's text encoder (a model folder's `text_encoder/` + `tokenizer/`, or the
//! built-in presets' seeded one) turns prompts into embeddings on the session's worker
//! thread, never on the async runtime. An empty or absent prompt means "no text" at
//! `session.start` and "no change" in a `session.interaction`; an engine without a text
//! encoder refuses a non-empty prompt with an error naming the field.

/// The prompt to apply: `None` when it is absent or blank.
pub fn prompt_of(prompt: Option<&str>) -> Option<String> {
    prompt
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_prompts_mean_no_text() {
        assert_eq!(prompt_of(None), None);
        assert_eq!(prompt_of(Some("  ")), None);
        assert_eq!(prompt_of(Some(" a lake ")), Some("a lake".to_string()));
    }
}
