//! The multi-process runs themselves (a build with `--features mpi`).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::common::{
    self, collective_counts, generate_ranks, npy_values, plan_ranks, plan_report, relative_error,
};
use super::mpirun;

const SESSION: [&str; 4] = ["--width", "64", "--height", "32"];

/// The tiny model's session: 21 frames.
const TINY: (&str, &str) = ("tiny", "21");

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_headroom")
}

/// Runs `generate` with `extra` on `n` ranks (or in one process with `--comm threads`
/// when `n` is 0) and returns the report, the video's bytes and the latents.
fn generate(
    n: usize,
    dir: &Path,
    name: &str,
    (model, frames): (&str, &str),
    extra: &[&str],
) -> Option<(serde_json::Value, Vec<u8>, Vec<f32>)> {
    let out = dir.join(format!("{name}.mp4"));
    let latents = dir.join(format!("{name}.npy"));
    let mut cmd = if n == 0 {
        Command::new(bin())
    } else {
        let mut c = mpirun()?;
        c.args(["-n", &n.to_string(), bin()]);
        c
    };
    cmd.args(["--threads", "1", "generate"])
        .args(SESSION)
        .args(["--model", model, "--frames", frames])
        .args(["--json", "--out", out.to_str().unwrap()])
        .args(["--dump-latents", latents.to_str().unwrap()])
        .args(extra);
    let res = cmd.output().unwrap();
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let report = serde_json::from_slice(&res.stdout).unwrap();
    Some((report, std::fs::read(out).unwrap(), npy_values(&latents)))
}

#[test]
fn mpi_ranks_produce_the_thread_mesh_video_and_their_plan_per_rank() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_, _, single)) = generate(0, dir.path(), "single", TINY, &[]) else {
        return;
    };
    for (tp, sp) in [(2, 1), (1, 2), (2, 2)] {
        let (t, s) = (tp.to_string(), sp.to_string());
        let mesh = ["--tp", t.as_str(), "--sp", s.as_str()];
        let name = format!("tp{tp}sp{sp}");
        let mut threads = mesh.to_vec();
        threads.extend_from_slice(&["--comm", "threads"]);
        let (_, want, _) =
            generate(0, dir.path(), &format!("{name}-threads"), TINY, &threads).unwrap();
        let (report, video, latents) = generate(tp * sp, dir.path(), &name, TINY, &mesh).unwrap();
        assert_eq!(report["comm"], "mpi");
        assert!(
            video == want,
            "tp {tp} sp {sp}: the video differs from the thread mesh's"
        );
        let err = relative_error(&single, &latents);
        println!("mpi tp {tp} × sp {sp}: latents {err:.2e} from one rank");
        assert!(err <= 1e-5, "tp {tp} sp {sp}: {err}");
        let mut plan = mesh.to_vec();
        plan.extend_from_slice(&SESSION);
        plan.extend_from_slice(&["--model", "tiny", "--frames", "21"]);
        plan.extend_from_slice(&["--allocator", "planned", "--policies", "before-decode"]);
        assert_eq!(
            generate_ranks(&report),
            plan_ranks(&plan),
            "tp {tp} sp {sp}"
        );
        // The bytes every collective moved are the ones the plan predicts.
        let moved = collective_counts(report["ranks"].as_array().unwrap());
        assert_eq!(
            moved,
            collective_counts(&plan_report(&plan)),
            "tp {tp} sp {sp}"
        );
        assert!(moved.iter().all(|r| !r.is_empty()), "{moved:?}");
    }
}

#[test]
fn the_small_model_measures_its_plan_per_rank_under_mpi() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = ["--tp", "2", "--sp", "1"];
    let Some((report, _, _)) = generate(2, dir.path(), "small", ("small", "9"), &mesh) else {
        return;
    };
    let plan = [
        "--model",
        "small",
        "--tp",
        "2",
        "--sp",
        "1",
        "--width",
        "64",
        "--height",
        "32",
        "--frames",
        "9",
        "--allocator",
        "planned",
        "--policies",
        "before-decode",
    ];
    assert_eq!(generate_ranks(&report), plan_ranks(&plan));
}

/// `cmd` (an `mpirun`) starting `n` ranks of the binary, each carrying `tag` in
/// `HEADROOM_TEST_TAG` so the test can find its processes.
fn tagged_job<'a>(cmd: &'a mut Command, tag: &str, n: &str) -> &'a mut Command {
    cmd.env("HEADROOM_TEST_TAG", tag)
        .args(["-x", "HEADROOM_TEST_TAG", "-n", n, bin()])
}

/// Process ids of the ranks of the job tagged `tag` (the variable `mpirun -x` passed).
fn tagged_ranks(tag: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let vars: Vec<String> = env
            .split(|&b| b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        if vars
            .iter()
            .any(|v| v == &format!("HEADROOM_TEST_TAG={tag}"))
        {
            let rank = vars
                .iter()
                .find_map(|v| v.strip_prefix("OMPI_COMM_WORLD_RANK="))
                .unwrap_or("?")
                .to_string();
            found.push((pid, rank));
        }
    }
    found
}

fn wait_for_exit(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn killing_a_rank_mid_session_ends_the_whole_job_naming_it() {
    let Some(mut cmd) = mpirun() else { return };
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("kill-{}", std::process::id());
    let out = dir.path().join("v.mp4");
    let mut child = tagged_job(&mut cmd, &tag, "2")
        .args(["--threads", "1", "generate"])
        .args([
            "--model", "tiny", "--width", "64", "--height", "32", "--frames", "2397",
        ])
        .args(["--tp", "1", "--sp", "2", "--out", out.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until both ranks run, then for the first chunk to go by.
    let start = Instant::now();
    let victim = loop {
        let ranks = tagged_ranks(&tag);
        if let Some((pid, _)) = ranks.iter().find(|(_, r)| r == "1") {
            if ranks.len() >= 2 && start.elapsed() > Duration::from_secs(3) {
                break *pid;
            }
        }
        // 200 chunks outlast the 3 s wait on any machine (10 chunks took 2.6 s in all on
        // an Intel Xeon with AMX, so the job ended before the kill).
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the job ended ({status}) before a rank could be killed");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the ranks never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let killed = Instant::now();
    // SAFETY: kill(2) on a pid this test found; at worst the process is already gone.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let status = wait_for_exit(&mut child, Duration::from_secs(60));
    let took = killed.elapsed();
    let Some(status) = status else {
        let _ = child.kill();
        panic!("the job outlived its killed rank by a minute");
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    println!(
        "job ended {:.2} s after rank 1 was killed: {status}",
        took.as_secs_f64()
    );
    assert!(!status.success());
    assert!(err.contains("rank 1"), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(tagged_ranks(&tag).is_empty(), "a rank outlived the job");
    assert!(!out.exists(), "no partial video is left behind");
}

#[test]
fn a_rank_that_fails_alone_ends_the_job_naming_it() {
    let Some(mut cmd) = mpirun() else { return };
    // Only rank 1 is given a device too small for a session (MPMD launch): it is refused
    // at admission, before any collective, and the job ends naming it.
    let common = [
        "--threads",
        "1",
        "generate",
        "--model",
        "tiny",
        "--width",
        "64",
        "--height",
        "32",
        "--frames",
        "21",
        "--tp",
        "2",
        "--out",
        "/tmp/headroom-never.mp4",
    ];
    let start = Instant::now();
    let res: Output = cmd
        .args(["-n", "1", bin()])
        .args(common)
        .args([":", "-n", "1", bin()])
        .args(common)
        .args(["--capacity", "1MiB"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&res.stderr);
    println!("job ended after {:.2} s", start.elapsed().as_secs_f64());
    assert!(!res.status.success());
    assert!(err.contains("rank 1 failed"), "{err}");
    assert!(err.contains("do not fit"), "{err}");
    assert!(!Path::new("/tmp/headroom-never.mp4").exists());
}

/// The `headroom_rank_post_session_reserved_bytes` of each rank, from `/metrics`.
fn post_session_floors(addr: &str) -> Vec<String> {
    common::http_get(addr, "/metrics")
        .1
        .lines()
        .filter(|l| l.starts_with("headroom_rank_post_session_reserved_bytes{"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_sharded_server_streams_sessions_in_a_row_and_every_rank_returns_to_its_floor() {
    let Some(mut cmd) = mpirun() else { return };
    let tag = format!("serve-{}", std::process::id());
    let mut child = tagged_job(&mut cmd, &tag, "4")
        .args(["--threads", "1", "serve"])
        .args(["--model", "tiny", "--tp", "2", "--sp", "2", "--port", "0"])
        .args(["--width", "48", "--height", "32"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() > 0 {
        if let Some(rest) = line.split("listening on http://").nth(1) {
            addr = rest.split_whitespace().next().map(str::to_string);
            break;
        }
        line.clear();
    }
    let addr = addr.expect("rank 0 prints the address it listens on");
    let url = format!("ws://{addr}/v1/realtime/video");
    let mut floors = Vec::new();
    for hang_up in [Some("0.3"), None] {
        let dir = tempfile::tempdir().unwrap();
        let mut bench = Command::new(bin());
        bench
            .args([
                "bench",
                "serve",
                "--url",
                &url,
                "--sessions",
                "2",
                "--concurrency",
                "1",
            ])
            .args(["--frames", "21", "--width", "48", "--height", "32"])
            .args(["--out", dir.path().to_str().unwrap()]);
        if let Some(after) = hang_up {
            // One client hangs up mid-chunk first; the two after it are served.
            bench.args(["--hang-up-after", after]);
        }
        let res = bench.output().unwrap();
        assert!(
            res.status.success(),
            "{}",
            String::from_utf8_lossy(&res.stderr)
        );
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(summary["all_served"], true, "{summary}");
        floors.push(post_session_floors(&addr));
    }
    assert_eq!(floors[0].len(), 4, "one series per rank: {:?}", floors[0]);
    assert_eq!(
        floors[0], floors[1],
        "every rank's post-session reserved is its floor"
    );
    assert!(common::http_get(&addr, "/health").1.contains("\"ok\""));
    // SIGTERM to rank 0 (mpirun itself exits non-zero when signalled): it stops serving
    // and releases the followers, and the whole job exits 0.
    let rank0 = tagged_ranks(&tag)
        .into_iter()
        .find(|(_, r)| r == "0")
        .map(|(pid, _)| pid)
        .unwrap();
    // SAFETY: kill(2) on a pid this test found.
    unsafe { libc::kill(rank0 as i32, libc::SIGTERM) };
    let status = wait_for_exit(&mut child, Duration::from_secs(60)).expect("the job ends");
    assert!(status.success(), "{status}");
    assert!(tagged_ranks(&tag).is_empty());
}

#[test]
fn bench_session_under_mpi_reports_every_rank_beside_its_plan() {
    let Some(mut cmd) = mpirun() else { return };
    let dir = tempfile::tempdir().unwrap();
    cmd.args(["-n", "4", bin()]);
    let ranks = common::bench_session_ranks(&mut cmd, dir.path());
    let secs: Vec<f64> = ranks
        .iter()
        .map(|r| r["collective_s_per_chunk"].as_f64().unwrap())
        .collect();
    println!("seconds in collectives per chunk, by rank: {secs:?}");
}

#[test]
fn mpi_ranks_snapshot_a_shard_each_and_resume_the_session_from_them() {
    let dir = tempfile::tempdir().unwrap();
    let snaps = dir.path().join("snaps");
    let whole = dir.path().join("whole.y4m");
    let Some(mut first) = mpirun() else {
        return;
    };
    let mesh = ["--tp", "2", "--sp", "2"];
    let res = first
        .args(["-n", "4", bin(), "--threads", "1", "generate"])
        .args(SESSION)
        .args(["--model", "tiny", "--frames", "33"])
        .args(mesh)
        .args(["--out", whole.to_str().unwrap()])
        .args([
            "--snapshot-every",
            "1",
            "--snapshot-dir",
            snaps.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    for rank in 0..4 {
        let name = match rank {
            0 => "chunk-0.hrsnap".to_string(),
            r => format!("chunk-0.rank-{r}.hrsnap"),
        };
        assert!(snaps.join(&name).is_file(), "rank {rank}: {name}");
    }
    let tail = dir.path().join("tail.y4m");
    let res = mpirun()
        .unwrap()
        .args(["-n", "4", bin(), "--threads", "1", "generate"])
        .args(["--model", "tiny"])
        .args(mesh)
        .args(["--resume", snaps.join("chunk-0.hrsnap").to_str().unwrap()])
        .args(["--out", tail.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let (whole, tail) = (std::fs::read(whole).unwrap(), std::fs::read(tail).unwrap());
    // Y4M: a header line, then FRAME + 4:4:4 planes of 64×32.
    let frames = |b: &[u8]| -> Vec<Vec<u8>> {
        let h = b.iter().position(|&c| c == b'\n').unwrap() + 1;
        b[h..].chunks(6 + 64 * 32 * 3).map(<[u8]>::to_vec).collect()
    };
    assert_eq!(
        frames(&tail),
        frames(&whole)[9..],
        "chunks 1 and 2, byte for byte"
    );
}
