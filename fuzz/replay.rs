//! The corpus replay the crates' `tests/fuzz_corpus.rs` share: every input of a fuzz
//! target's minimised corpus goes through the reader it fuzzes, as an ordinary test (no
//! fuzzing in CI). Included by path from each crate's test.
#![allow(dead_code)]

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// Feeds every file of `fuzz/corpus/<target>/` to `parse` ([`replay_from`]).
pub fn replay(target: &str, parse: impl Fn(&[u8])) {
    replay_from("corpus", target, parse);
}

/// Feeds every file of `fuzz/<folder>/<target>/` to `parse`, which may return anything
/// but must not panic; a panic names the file.
pub fn replay_from(folder: &str, target: &str, parse: impl Fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(folder)
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
        "{} of {} inputs of fuzz/{folder}/{target} panicked: {panicked:?}",
        panicked.len(),
        files.len()
    );
}
