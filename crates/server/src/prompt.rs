//! Text prompts: the one place a prompt becomes (or fails to become) text embeddings.
//!
//! The engine has no text encoder yet, so a non-empty prompt is refused with a clear
//! error rather than silently ignored; an empty or absent prompt means "no text". Both
//! `session.start` prompts and `session.interaction` prompts come through here, on the
//! session's worker thread (a text encoder is heavy work that must not run on the async
//! runtime).

use headroom_tensor::Tensor;

use crate::error::{Result, ServerError};

/// Text embeddings `[L, text_dim]` for `prompt`: `None` when it is absent or blank; an
/// `invalid_request` error naming `field` for any other prompt, because the served model
/// has no text encoder.
pub fn text_for_prompt(prompt: Option<&str>, field: &str) -> Result<Option<Tensor>> {
    match prompt.map(str::trim) {
        None | Some("") => Ok(None),
        Some(_) => Err(ServerError::request(
            field,
            "must be empty: the served model has no text encoder, so a text prompt cannot be applied (omit it or send \"\")",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_prompts_mean_no_text_and_others_are_refused_naming_the_field() {
        assert!(text_for_prompt(None, "prompt").unwrap().is_none());
        assert!(text_for_prompt(Some("  "), "prompt").unwrap().is_none());
        let err = text_for_prompt(Some("a lake at dawn"), "prompt").unwrap_err();
        assert_eq!(err.code(), "invalid_request");
        let message = err.to_string();
        assert!(message.starts_with("prompt:") && message.contains("no text encoder"));
    }
}
