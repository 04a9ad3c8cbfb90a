//! Replays the `pickle` fuzz corpus (fuzz/corpus/pickle, grown by `fuzz/run.sh pickle`)
//! through the pickle readers: every input must come back as a value or an error, never
//! a panic. No fuzzing here; see fuzz/README.md.

#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::replay;

/// The allow-list `.pth` checkpoints read with (headroom_tensor::io::pth::index::
/// allowed_globals, which this crate cannot depend on), so the restricted reader's
/// object opcodes run too.
const TORCH_GLOBALS: [(&str, &str); 5] = [
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    ("collections", "OrderedDict"),
    ("torch", "FloatStorage"),
    ("torch", "HalfStorage"),
];

#[test]
fn pickle_corpus_replays_without_panics() {
    replay("pickle", |bytes| {
        let _ = headroom_mem::pickle::from_pickle(bytes);
        let _ = headroom_mem::pickle::from_pickle_restricted(bytes, &TORCH_GLOBALS);
    });
}
