#!/usr/bin/env python3
"""Write crates/mem/tests/fixtures/torch_snapshot_small.pickle.

The fixture is a small memory snapshot laid out exactly like the dict that
PyTorch's ``torch.cuda.memory._snapshot()`` returns, pickled the way
``torch.cuda.memory._dump_snapshot`` pickles it (``pickle.dump`` with the
default protocol, 4 on Python 3.8+). headroom-mem's pickle reader is tested
against it, so the reader sees the opcodes real snapshots contain (FRAME,
MEMOIZE, BINGET for shared frame lists, SHORT_BINUNICODE, TUPLE2, LONG1 for
47-bit addresses, BINFLOAT, ...) without needing PyTorch or a GPU here.

The trace is the allocator history of PyTorch's "expandable segments" example
under the default (non-expandable) allocator: eight 16 MiB tensors, each in
its own freshly allocated segment, all freed, then four 32 MiB tensors that
cannot reuse the 16 MiB segments and so each need a new segment.

Python 3 standard library only; run it from anywhere:

    python3 tools/make_snapshot_fixture.py
"""

import pathlib
import pickle

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURE = REPO_ROOT / "crates" / "mem" / "tests" / "fixtures" / "torch_snapshot_small.pickle"

MIB = 1024 * 1024
SMALL = 16 * MIB
LARGE = 32 * MIB
SMALL_COUNT = 8
LARGE_COUNT = 4


def small_address(i):
    """Address of the i-th 16 MiB segment (and of the tensor inside it)."""
    return 0x7F0000000000 + i * 0x1000000


def large_address(j):
    """Address of the j-th 32 MiB segment (and of the tensor inside it)."""
    return 0x7F0010000000 + j * 0x2000000


def segments():
    """One 20 MiB segment holding a 1 MiB active block and the inactive rest."""
    address = 139637976727552
    return [
        {
            "device": 0,
            "address": address,
            "total_size": 20971520,
            "allocated_size": 1048576,
            "active_size": 1048576,
            "requested_size": 1000000,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": [
                {
                    "address": address,
                    "size": 1048576,
                    "requested_size": 1000000,
                    "state": "active_allocated",
                    "frames": [{"filename": "train.py", "line": 12, "name": "forward"}],
                },
                {
                    "address": address + 1048576,
                    "size": 19922944,
                    "requested_size": 0,
                    "state": "inactive",
                    "frames": [],
                },
            ],
        }
    ]


def device_trace():
    """Trace entries for device 0, in the order the allocator records them."""
    # One list object shared by every entry, as PyTorch shares interned
    # frames: pickle writes it once and refers back to it with BINGET.
    frames = [{"filename": "train.py", "line": 12, "name": "forward"}]
    trace = []

    def record(action, addr, size):
        trace.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": 1000 + 10 * len(trace),
                "frames": frames,
            }
        )

    for i in range(SMALL_COUNT):
        record("segment_alloc", small_address(i), SMALL)
        record("alloc", small_address(i), SMALL)
    for i in range(SMALL_COUNT):
        record("free_requested", small_address(i), SMALL)
        record("free_completed", small_address(i), SMALL)
    for j in range(LARGE_COUNT):
        record("segment_alloc", large_address(j), LARGE)
        record("alloc", large_address(j), LARGE)
    return trace


def allocator_settings():
    """Default allocator settings as PyTorch reports them."""
    return {
        "PYTORCH_CUDA_ALLOC_CONF": "",
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": False,
        "pinned_num_register_threads": 1,
        "release_lock_on_malloc": False,
        "pinned_use_host_register": False,
        "roundup_power2_divisions": {},
    }


def main():
    snapshot = {
        "segments": segments(),
        "device_traces": [device_trace()],
        "allocator_settings": allocator_settings(),
    }
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    with open(FIXTURE, "wb") as f:
        pickle.dump(snapshot, f)
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
