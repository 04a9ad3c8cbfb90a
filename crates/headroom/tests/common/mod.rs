//! Helpers shared by the CLI tests: run the real binary, check that it succeeded.
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs `headroom` with `args`.
pub fn headroom(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .output()
        .expect("the headroom binary runs")
}

/// Panics with the command's stderr unless it exited successfully.
pub fn assert_ok(res: &Output) {
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
}
