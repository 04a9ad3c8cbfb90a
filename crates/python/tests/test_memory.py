"""Memory in PyTorch's words: memory_stats() under torch.cuda.memory_stats()'s keys,
memory_snapshot() in torch.cuda.memory._snapshot()'s shape, and the planner and
replay returning what `plan --json` and `mem replay --json` print."""

import json
import pickle

import pytest

import headroom

# Keys torch.cuda.memory_stats() returns (PyTorch 2.x), each of which headroom keeps.
TORCH_KEYS = [
    f"{stat}.{pool}.{field}"
    for stat in (
        "allocation",
        "segment",
        "active",
        "inactive_split",
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "inactive_split_bytes",
        "requested_bytes",
    )
    for pool in ("all", "small_pool", "large_pool")
    for field in ("current", "peak", "allocated", "freed")
] + [
    "num_alloc_retries",
    "num_ooms",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
    "max_split_size",
    "oversize_allocations.current",
    "oversize_segments.peak",
]

# What `mem replay --json` prints beside the allocator's statistics.
REPLAY_FIELDS = {
    "trace",
    "ops",
    "failed_allocs",
    "ignored_frees",
    "allocator",
    "policy",
    "reserved_over_allocated_peak",
    "capacity",
}

# Keys that hold wall-clock time, which no two runs share.
TIMES = {"reclaim_ns", "seconds"}


def timeless(value):
    """`value` without the keys that hold wall-clock time."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


TRACE = "\n".join(
    [
        '{"op":"alloc","id":1,"size":1048576}',
        '{"op":"alloc","id":2,"size":3000000}',
        '{"op":"free","id":1}',
        '{"op":"phase","name":"decode_start"}',
        '{"op":"alloc","id":3,"size":512}',
        '{"op":"free","id":2}',
        '{"op":"phase","name":"session_end"}',
    ]
)


def test_memory_stats_keys_are_the_cli_json_keys_in_torch_names(world, cli_json, tmp_path):
    with world.session(frames=9) as s:
        list(s)
    stats = world.memory_stats()
    (tmp_path / "t.jsonl").write_text(TRACE)
    replayed = cli_json("mem", "replay", str(tmp_path / "t.jsonl"))
    assert set(stats) == set(replayed) - REPLAY_FIELDS
    missing = [k for k in TORCH_KEYS if k not in stats]
    assert not missing, missing
    assert all(isinstance(v, int) for v in stats.values())
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"] > 0


def test_reset_peak_memory_stats_brings_peaks_to_current(world):
    with world.session(frames=9) as s:
        list(s)
    world.reset_peak_memory_stats()
    stats = world.memory_stats()
    assert stats["allocated_bytes.all.peak"] == stats["allocated_bytes.all.current"]
    assert stats["reserved_bytes.all.peak"] == stats["reserved_bytes.all.current"]


def test_memory_snapshot_has_the_shape_of_torch_snapshot(tmp_path):
    engine = headroom.Engine("tiny", allocator="pytorch")
    engine.record_memory_history()
    with engine.session(width=48, height=32, frames=9) as s:
        list(s)
    snap = engine.memory_snapshot()
    assert set(snap) == {"segments", "device_traces", "allocator_settings"}
    for segment in snap["segments"]:
        assert {"address", "total_size", "allocated_size", "blocks", "stream"} <= set(segment)
        assert sum(b["size"] for b in segment["blocks"]) == segment["total_size"]
    actions = {e["action"] for e in snap["device_traces"][0]}
    assert {"alloc", "free_requested", "free_completed", "segment_alloc"} <= actions
    # pickled, it is a PyTorch snapshot: mem replay reads it back.
    (tmp_path / "snap.pickle").write_bytes(pickle.dumps(snap))
    replayed = headroom.replay(tmp_path / "snap.pickle", allocator="pytorch", policy="never")
    assert replayed["ops"] > 0 and replayed["failed_allocs"] == 0


@pytest.mark.parametrize("allocator,policy", [("planned", "before-decode"), ("pytorch", "never")])
def test_replay_equals_mem_replay_json(allocator, policy, cli_json, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(TRACE)
    expected = timeless(
        cli_json("mem", "replay", str(path), "--allocator", allocator, "--policy", policy)
    )
    assert timeless(headroom.replay(path, allocator=allocator, policy=policy)) == expected
    assert timeless(headroom.replay(str(path), allocator, policy)) == expected


def test_replay_defaults_are_planned_before_decode(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(TRACE)
    out = headroom.replay(path)
    assert (out["allocator"], out["policy"]) == ("planned", "before-decode")


@pytest.mark.parametrize(
    "kwargs,flags",
    [
        (
            dict(model="tiny", width=48, height=32, frames=21, capacity="1GiB"),
            ["--model", "tiny", "--width", "48", "--height", "32", "--frames", "21", "--capacity", "1GiB"],
        ),
        (
            dict(model="world", frames=9, tp=2, policies=["never", "always"]),
            ["--model", "world", "--frames", "9", "--tp", "2", "--policies", "never,always"],
        ),
    ],
)
def test_plan_equals_plan_json(kwargs, flags, cli_json):
    assert timeless(headroom.plan(**kwargs)) == timeless(cli_json("plan", *flags))


def test_plan_of_a_session_that_does_not_fit_says_what_it_needs(cli_json):
    flags = ["--model", "tiny", "--width", "48", "--height", "32", "--frames", "9", "--capacity", "1MiB"]
    out = headroom.plan(model="tiny", width=48, height=32, frames=9, capacity=1 << 20)
    assert timeless(out) == timeless(cli_json("plan", *flags))
    assert out["fits"] is False and all(r["headroom_bytes"] < 0 for r in out["ranks"])
    json.dumps(out)
