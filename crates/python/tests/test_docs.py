"""Every Python example of docs/python.md and of the README's "From Python" runs as
written (in a scratch folder, each in a fresh namespace)."""

import pathlib
import re

import pytest

from conftest import ROOT


def blocks(path: pathlib.Path) -> list:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


EXAMPLES = [
    (f"{name}#{i}", code)
    for name in ("docs/python.md", "README.md")
    for i, code in enumerate(blocks(ROOT / name))
]


def test_the_docs_have_an_example_per_part():
    assert len([n for n, _ in EXAMPLES if n.startswith("docs/")]) >= 6
    assert any(n.startswith("README.md") for n, _ in EXAMPLES)


@pytest.mark.parametrize("name,code", EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_example_runs(name, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, name, "exec"), {"__name__": "__example__"})
