"""The README's Python examples run as written (in a fresh directory each).

The service example needs a running server and the quick-start one the managed SLM, so they
are covered elsewhere (tests/test_service_*.py, tests/test_slm_defaults.py); every other
``python`` block of the README runs here, and a block that raises fails the test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
# needs a server / only builds a config / the quick start (default store with the managed SLM)
# / continues the quick start's store (label measures: tests/test_labels.py)
SKIP = ("clag_fast.connect(", "StoreConfig(\n", 'add("The user is allergic to seafood", namespace="user-42", metadata',
        "store.label_quality()")


def _runnable() -> list[str]:
    return [b for b in BLOCKS if not any(s in b for s in SKIP)]


def test_readme_has_the_examples():
    text = "\n".join(BLOCKS)
    for name in ("where=", "ClagVectorStore", "ClagStore", "compat.mem0", "clag_fast.connect"):
        assert name in text


@pytest.mark.slow
@pytest.mark.parametrize("block", _runnable(), ids=lambda b: b.strip().splitlines()[0][:40])
def test_readme_block_runs(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
