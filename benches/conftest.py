"""pytest setup for benches/: collect ``bench_*.py``, pin thread pools, print result tables.

pyproject's ``python_files`` is pytest's default (``test_*.py``), so the bench modules are
collected here instead; when the ini option already matches them we leave collection to it.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from pathlib import Path

import pytest

# Pin BLAS / OpenMP / rayon pools before numpy, faiss or clag_fast load them (OpenBLAS reads
# its variable at library load): every engine gets the same CLAG_BENCH_THREADS cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ.setdefault(_var, os.environ.get("CLAG_BENCH_THREADS", str(os.cpu_count() or 1)))

sys.path.insert(0, str(Path(__file__).parent))

import measure  # noqa: E402 -- after the thread pins above


def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix != ".py" or not file_path.name.startswith("bench_"):
        return None
    # pytest's own collector already takes files named on the command line and files that
    # match python_files; collecting them here too would run every benchmark twice.
    if parent.session.isinitpath(file_path):
        return None
    if any(fnmatch.fnmatch(file_path.name, pat) for pat in parent.config.getini("python_files")):
        return None
    return pytest.Module.from_parent(parent, path=file_path)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not measure.RESULTS:
        return
    info = measure.machine()
    terminalreporter.section("clag_fast native-core benchmark tables")
    terminalreporter.write_line(", ".join(f"{k} {v}" for k, v in info.items()))
    text = measure.tables()
    terminalreporter.write_line(text)
    # Also on disk, ready to paste into BENCHMARKS.md.
    from vector_sets import cache_dir  # noqa: PLC0415

    out = cache_dir() / "bench_search_tables.md"
    out.write_text("; ".join(f"{k} {v}" for k, v in info.items()) + "\n\n" + text + "\n")
    terminalreporter.write_line(f"tables written to {out}")
