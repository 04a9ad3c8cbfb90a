"""Shared fixtures: the `headroom` command line the Python layer is held against, and
engines loaded once per module."""

import json
import os
import pathlib
import subprocess

import pytest

import headroom

ROOT = pathlib.Path(__file__).resolve().parents[3]


def cli_path() -> pathlib.Path:
    """The `headroom` binary: $HEADROOM_BIN, else the newest of target/{release,debug}."""
    if os.environ.get("HEADROOM_BIN"):
        return pathlib.Path(os.environ["HEADROOM_BIN"])
    found = [ROOT / "target" / p / "headroom" for p in ("release", "debug")]
    found = [p for p in found if p.exists()]
    if not found:
        pytest.fail("no headroom binary: build it (cargo build --release -p headroom) or set HEADROOM_BIN")
    return max(found, key=lambda p: p.stat().st_mtime)


@pytest.fixture(scope="session")
def cli():
    """Runs `headroom ARGS…` and returns its stdout (failing the test on a non-zero exit)."""
    binary = cli_path()

    def run(*args: str) -> str:
        out = subprocess.run(
            [str(binary), *args], capture_output=True, text=True, check=False
        )
        assert out.returncode == 0, f"headroom {' '.join(args)}: {out.stderr}"
        return out.stdout

    return run


@pytest.fixture(scope="session")
def cli_json(cli):
    """Runs `headroom ARGS… --json` and parses what it prints."""

    def run(*args: str):
        return json.loads(cli(*args, "--json"))

    return run


@pytest.fixture(scope="module")
def world():
    """The embedded `world` model, as `headroom generate` loads it by default."""
    return headroom.Engine("world")


@pytest.fixture(scope="module")
def tiny():
    """The built-in `tiny` model (seeded weights)."""
    return headroom.Engine("tiny")
