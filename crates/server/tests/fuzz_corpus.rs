//! Replays the `image_url` and `protocol` fuzz corpora (fuzz/corpus/, grown by
//! fuzz/run.sh) through the readers their targets call: every input must come back as a
//! value or an error, never a panic. No fuzzing here; see fuzz/README.md.

#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::replay;

#[path = "../../../fuzz/entries/protocol.rs"]
mod entry;
use entry::protocol;

use headroom_server::decode_image_url;
use headroom_tensor::Device;

#[test]
fn image_url_corpus_replays_without_panics() {
    let cpu = Device::cpu().unwrap();
    // The input split of fuzz/fuzz_targets/image_url.rs: two size bytes, then the URL.
    replay("image_url", |data| {
        let [w, h, url @ ..] = data else {
            return;
        };
        let side = |b: u8| (16 + 4 * usize::from(b)).min(1024);
        if let Ok(url) = std::str::from_utf8(url) {
            let _ = decode_image_url(url, side(*w), side(*h), &cpu);
        }
    });
}

#[test]
fn protocol_corpus_replays_without_panics() {
    replay("protocol", protocol);
}
