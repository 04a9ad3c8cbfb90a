//! `generate --tp T --sp S --comm threads`: every rank a thread of one process, driven
//! by the same session schedule as ranks in MPI processes (see `ranks_mpi.rs`).

mod common;
use common::{assert_ok, generate_ranks, headroom, npy_values, plan_ranks, relative_error};

/// The session every test here runs: tiny at 64×32, 21 frames, one thread.
const SESSION: [&str; 8] = [
    "--model", "tiny", "--width", "64", "--height", "32", "--frames", "21",
];

fn generate(
    dir: &std::path::Path,
    name: &str,
    extra: &[&str],
) -> (serde_json::Value, Vec<u8>, Vec<f32>) {
    let out = dir.join(format!("{name}.mp4"));
    let latents = dir.join(format!("{name}.npy"));
    let mut args = vec!["--threads", "1", "generate"];
    args.extend_from_slice(&SESSION);
    args.extend_from_slice(&[
        "--json",
        "--out",
        out.to_str().unwrap(),
        "--dump-latents",
        latents.to_str().unwrap(),
    ]);
    args.extend_from_slice(extra);
    let res = headroom(&args);
    assert_ok(&res);
    let report = serde_json::from_slice(&res.stdout).unwrap();
    (report, std::fs::read(out).unwrap(), npy_values(&latents))
}

#[test]
fn thread_meshes_match_the_single_rank_latents_and_their_plan_per_rank() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, single) = generate(dir.path(), "single", &[]);
    for (tp, sp, allocator) in [
        ("2", "1", "planned"),
        ("1", "2", "pytorch"),
        ("2", "2", "planned"),
    ] {
        let name = format!("tp{tp}sp{sp}");
        let flags = [
            "--tp",
            tp,
            "--sp",
            sp,
            "--comm",
            "threads",
            "--allocator",
            allocator,
        ];
        let (report, _, latents) = generate(dir.path(), &name, &flags);
        let err = relative_error(&single, &latents);
        println!("tp {tp} × sp {sp}: latents {err:.2e} from one rank");
        assert!(err <= 1e-5, "tp {tp} sp {sp}: {err}");
        assert_eq!(report["comm"], "threads");
        let mut plan = vec!["--tp", tp, "--sp", sp, "--allocator", allocator];
        plan.extend_from_slice(&SESSION);
        plan.extend_from_slice(&["--policies", "before-decode"]);
        assert_eq!(
            generate_ranks(&report),
            plan_ranks(&plan),
            "tp {tp} sp {sp} {allocator}: measured per rank = planned per rank"
        );
    }
}

#[test]
fn a_mesh_that_does_not_divide_the_heads_is_refused_naming_the_rule() {
    let mut args = vec!["generate"];
    args.extend_from_slice(&SESSION);
    args.extend_from_slice(&[
        "--tp",
        "3",
        "--comm",
        "threads",
        "--out",
        "/nonexistent/x.mp4",
    ]);
    let res = headroom(&args);
    assert_eq!(res.status.code(), Some(2));
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(
        err.contains("4 attention heads must divide by tp·sp = 3·1"),
        "{err}"
    );
    let res = headroom(&["generate", "--tp", "0", "--model", "tiny"]);
    assert_eq!(res.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&res.stderr).contains("at least 1"));
}

#[test]
fn mpi_without_an_mpi_build_or_launcher_says_what_is_missing() {
    let mut args = vec!["generate"];
    args.extend_from_slice(&SESSION);
    args.extend_from_slice(&["--tp", "2", "--comm", "mpi", "--out", "/tmp/never.mp4"]);
    let res = headroom(&args);
    assert_eq!(res.status.code(), Some(2));
    let err = String::from_utf8_lossy(&res.stderr);
    if cfg!(feature = "mpi") {
        // A lone process is a job of one: not the two ranks asked for.
        assert!(err.contains("mpirun -n 2"), "{err}");
    } else {
        assert!(err.contains("--features mpi"), "{err}");
    }
}

#[test]
fn bench_session_on_a_thread_mesh_reports_every_rank_beside_its_plan() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_headroom"));
    let ranks = common::bench_session_ranks(&mut cmd, dir.path());
    assert_eq!(ranks[3]["tp_rank"], 1);
    assert_eq!(ranks[3]["sp_rank"], 1);
}
