//! Ranks as processes: `mpirun -n T·S headroom generate --tp T --sp S` (a build with
//! `--features mpi`). Every test skips, saying why, where `mpirun` is absent, and fails
//! instead where it is required (`CI=true`, `HEADROOM_REQUIRE_MPIRUN=1`), in any build.

#[path = "../common/mod.rs"]
mod common;
#[cfg(feature = "mpi")]
mod ranks;

use std::process::{Command, Stdio};

/// `mpirun` with root allowed and more ranks than cores, or `None` (with the reason
/// printed) where it is absent.
fn mpirun() -> Option<Command> {
    let found = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        headroom_mem::required::missing(
            "mpirun",
            "mpirun is not on PATH",
            "Debian: apt-get install openmpi-bin libopenmpi-dev",
        );
        return None;
    }
    let mut cmd = Command::new("mpirun");
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "--bind-to", "none"]);
    Some(cmd)
}

#[test]
fn mpirun_is_on_path_where_it_is_required() {
    // Skips with a note on a developer's machine; fails under CI=true, naming mpirun.
    let _ = mpirun();
}
