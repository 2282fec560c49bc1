"""The README runs as written and stays a page a newcomer reads.

Every ``python`` block runs here, each in a fresh directory, and a block that raises fails
the test. The service example runs against a ``clag-fast serve`` started for it on a free port
(its address replaces the README's default one), so no block is left out. The set-up commands
the README gives are the Makefile's and CI's. The benchmark table's figures are checked
against BENCHMARKS.md in tests/test_benchmarks_doc.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEXT = README.read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, re.S)
SERVICE_URL = "http://127.0.0.1:8420"


def test_readme_has_the_examples():
    text = "\n".join(BLOCKS)
    for name in ("MemoryStore.open(", "where=", "defer_organize=True", "label_quality()", "ClagVectorStore",
                 "ClagStore", "compat.mem0", "clag_fast.connect"):
        assert name in text, name
    assert SERVICE_URL in text


def test_readme_is_short():
    lines = TEXT.splitlines()
    assert len(lines) <= 210, f"README.md has {len(lines)} lines"
    longest = max(lines, key=len)
    assert len(longest) <= 400, f"a README line has {len(longest)} characters: {longest[:80]}..."
    assert "../shared" not in TEXT


def test_readme_set_up_commands_are_the_makefiles():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"^make {target}\s+#", TEXT, re.M), f"`make {target}` missing from the README"
        assert re.search(rf"^{target}:", makefile, re.M), f"the Makefile has no `{target}` target"
    assert re.search(r"^\s*make test\s*$", (ROOT / ".ci" / "run").read_text(), re.M)


def _run(block: str) -> None:
    exec(compile(block, "README.md", "exec"), {"__name__": "readme"})


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.strip().splitlines()[-1][:40])
def test_readme_block_runs(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if SERVICE_URL not in block:
        _run(block)
        return
    from service_helpers import ServiceProcess

    with ServiceProcess(tmp_path / "served", embedder=True) as service:
        _run(block.replace(SERVICE_URL, service.url))
        assert service.proc.poll() is None, service.output()
