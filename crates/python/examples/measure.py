"""Measures what docs/python.md reports: the Python layer's time per chunk against
`headroom generate`'s on the same session (interleaved runs, medians), and WorldEnv's
steps per second, one environment and a vector of 4.

    python crates/python/examples/measure.py --cli target/release/headroom
"""

import argparse
import json
import statistics
import subprocess
import tempfile
import time

import numpy as np

import headroom
import headroom.gym as hg


GAPS = {"cli": [], "python": []}


def cli_chunk_times(cli: str, frames: int, seed: int) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [cli, "generate", "--frames", str(frames), "--seed", str(seed), "--json",
             "--out", f"{tmp}/x.y4m"],
            capture_output=True, text=True, check=True,
        )
    chunks = json.loads(out.stdout)["chunks"]
    # What a chunk's call takes beyond its phases' own time.
    GAPS["cli"] += [c["total_s"] - c["denoise_s"] - c["commit_s"] - c["decode_s"] for c in chunks[1:]]
    return [c["total_s"] for c in chunks]


def python_chunk_times(engine: headroom.Engine, frames: int, seed: int) -> list:
    times = []
    with engine.session(frames=frames, seed=seed) as session:
        while True:
            start = time.perf_counter()
            try:
                chunk = next(session)
            except StopIteration:
                break
            times.append(time.perf_counter() - start)
            t = chunk.timings
            GAPS["python"].append(times[-1] - t["denoise"] - t["commit"] - t["decode"])
    return times


def steps_per_second(env, actions, steps: int) -> float:
    env.reset(seed=0)
    env.step(actions)  # the first chunk (9 frames) and its plan
    start = time.perf_counter()
    for _ in range(steps):
        env.step(actions)
    return steps / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cli", default="target/release/headroom")
    p.add_argument("--frames", type=int, default=93)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    engine = headroom.Engine("world")
    python_chunk_times(engine, 21, 0)  # plans the shape once, as the CLI's run does
    GAPS["python"].clear()
    cli_runs, py_runs = [], []
    for rep in range(a.reps):
        # Later chunks only: the first carries the session's planning in both.
        cli_runs.append(statistics.mean(cli_chunk_times(a.cli, a.frames, rep)[1:]))
        py_runs.append(statistics.mean(python_chunk_times(engine, a.frames, rep)[1:]))
    cli_s, py_s = statistics.median(cli_runs), statistics.median(py_runs)
    single = hg.WorldEnv(engine=engine)
    one = steps_per_second(single, np.array([1, 0, 0, 0, 0, 0, 0, 1]), a.steps)
    single.close()
    vec = hg.WorldVectorEnv(4)
    four = steps_per_second(vec, np.tile([1, 0, 0, 0, 0, 0, 0, 1], (4, 1)), a.steps)
    vec.close()
    print(json.dumps({
        "threads": headroom.threads(),
        "cli_chunk_s": cli_s,
        "python_chunk_s": py_s,
        "overhead": py_s / cli_s - 1,
        "cli_runs": cli_runs,
        "python_runs": py_runs,
        "cli_gap_s": statistics.mean(GAPS["cli"]),
        "python_gap_s": statistics.mean(GAPS["python"]),
        "gap_overhead": (statistics.mean(GAPS["python"]) - statistics.mean(GAPS["cli"])) / cli_s,
        "env_steps_per_s": one,
        "vector4_rounds_per_s": four,
        "vector4_env_steps_per_s": 4 * four,
    }, indent=2))


if __name__ == "__main__":
    main()
