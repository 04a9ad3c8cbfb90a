//! Replays the `image_url` and `protocol` fuzz corpora (fuzz/corpus/, grown by
//! fuzz/run.sh) through the readers their targets call: every input must come back as a
//! value or an error, never a panic. No fuzzing here; see fuzz/README.md.

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use headroom_model::camera::InteractionHandler;
use headroom_model::DecoderKind;
use headroom_server::protocol::{ClientMessage, Interaction, StartRequest};
use headroom_server::{decode_image_url, Defaults, Limits};
use headroom_tensor::Device;

/// Feeds every file of `fuzz/corpus/<target>/` to `parse`, which may return anything but
/// must not panic; a panic names the file.
fn replay(target: &str, parse: impl Fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no inputs", dir.display());
    let panicked: Vec<String> = files
        .iter()
        .filter(|path| {
            let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            panic::catch_unwind(AssertUnwindSafe(|| parse(&bytes))).is_err()
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(
        panicked.is_empty(),
        "{} of {} inputs of fuzz/corpus/{target} panicked: {panicked:?}",
        panicked.len(),
        files.len()
    );
}

#[test]
fn image_url_corpus_replays_without_panics() {
    let cpu = Device::cpu().unwrap();
    // The input split of fuzz/fuzz_targets/image_url.rs: two size bytes, then the URL.
    replay("image_url", |data| {
        let [w, h, url @ ..] = data else {
            return;
        };
        let side = |b: u8| (16 + 15 * usize::from(b)).min(3840);
        if let Ok(url) = std::str::from_utf8(url) {
            let _ = decode_image_url(url, side(*w), side(*h), &cpu);
        }
    });
}

#[test]
fn protocol_corpus_replays_without_panics() {
    replay("protocol", |data| {
        let Ok(text) = std::str::from_utf8(data) else {
            return;
        };
        match ClientMessage::parse(text) {
            Ok(ClientMessage::Start(map)) => {
                if let Ok(start) = StartRequest::parse(&map, &Defaults::default()) {
                    let _ = start.config("small", DecoderKind::Full);
                }
            }
            Ok(ClientMessage::Interaction(map)) => {
                if let Ok(event) = Interaction::parse(&map, &Limits::default(), || "e".into()) {
                    if let Some(camera) = event.camera {
                        let mut handler = InteractionHandler::default();
                        if handler.queue(camera).is_ok() {
                            let _ = handler.step_chunk(3);
                        }
                    }
                }
            }
            _ => {}
        }
    });
}
