//! Replays the `config` fuzz corpus (fuzz/corpus/config, grown by fuzz/run.sh) through
//! the text encoder's `config.json` reader: every input must come back as a config or an
//! error, never a panic. No fuzzing here; see fuzz/README.md.

#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::replay;

#[test]
fn config_corpus_replays_through_the_umt5_reader() {
    replay("config", |data| {
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else {
            return;
        };
        if let Ok(c) = headroom_text::Umt5Config::from_json(&json) {
            let _ = c.inner_dim();
        }
    });
}
