//! Replays the `image` fuzz corpus (fuzz/corpus/image, grown by fuzz/run.sh) through
//! `decode_image`: every input must come back as an image or an error, never a panic.
//! No fuzzing here; see fuzz/README.md.

#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::replay_from;

#[test]
fn image_corpus_replays_without_panics() {
    replay_from("corpus", "image", |bytes| {
        let _ = headroom_media::decode_image(bytes, 8192);
    });
}

/// Inputs on which the JPEG decoder itself panics (zune-jpeg 0.5.15's AVX2 IDCT), which
/// `decode_image` catches and refuses. They live outside the fuzz corpus because the fuzz
/// binary aborts on every panic, caught or not (libfuzzer-sys's panic hook).
#[test]
fn decoder_panics_are_refused_as_errors() {
    replay_from("regressions", "image", |bytes| {
        let err = headroom_media::decode_image(bytes, 8192).unwrap_err();
        assert!(err.to_string().contains("cannot decode the JPEG"), "{err}");
    });
}
