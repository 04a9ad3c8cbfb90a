//! Replays the `pth`, `safetensors`, `npy` and `pickle` fuzz corpora (fuzz/corpus/, grown
//! by fuzz/run.sh) through the readers their targets call: every input must come back
//! as a value or an error, never a panic. No fuzzing here; see fuzz/README.md.

#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::replay;

use headroom_tensor::io::npy::parse_npy;
use headroom_tensor::io::pth::index::{allowed_globals, read_pth};
use headroom_tensor::io::pth::zip::stored_entries;
use headroom_tensor::io::safetensors::SafetensorsFile;
use headroom_tensor::Device;

#[test]
fn pth_corpus_replays_without_panics() {
    replay("pth", |bytes| {
        let _ = stored_entries(bytes);
        let _ = read_pth(bytes);
    });
}

#[test]
fn pickle_corpus_replays_through_the_checkpoint_allow_list() {
    replay("pickle", |bytes| {
        let _ = headroom_mem::pickle::from_pickle_restricted(bytes, &allowed_globals());
    });
}

#[test]
fn npy_corpus_replays_without_panics() {
    let cpu = Device::cpu().unwrap();
    replay("npy", |bytes| {
        let _ = parse_npy(bytes, &cpu);
    });
}

#[test]
fn safetensors_corpus_replays_without_panics() {
    // The file API maps a path, as the fuzz target does: one scratch file per input.
    let cpu = Device::cpu().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.safetensors");
    replay("safetensors", |bytes| {
        std::fs::write(&path, bytes).unwrap();
        if let Ok(file) = SafetensorsFile::open(&path) {
            for name in file.names().unwrap_or_default() {
                let _ = file.info(&name);
                let _ = file.load(&name, &cpu, None);
            }
        }
    });
}
