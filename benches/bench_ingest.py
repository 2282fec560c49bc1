"""Ingest and maintenance through the public API: ``MemoryStore.add_many(embeddings=...)``
into a store growing to N memories, then one ``organize()``.

What is timed: every ``add_many`` call (vector routing, SQLite, the periodic organisations
that fire inside it with ``llm=False``), reported as a rate per slice of the growth (N / 10
memories per slice), so a cost that grows with the store shows up as a falling rate; then an
explicit ``organize()`` of the full store (vector profiles) and the peak RSS. Vectors are
generated outside the timed region, one call's worth at a time:

* ``blobs``: unit vectors around 1,000 random Gaussian centres (dim 384, noise norm
  ``--spread``, default 1.0: cos(row, centre) ~ 0.7), the shape of sentence embeddings;
* ``iso``: isotropic unit vectors (no structure: every row opens or joins a weak cluster).

Script mode: ``python benches/bench_ingest.py [--n 1000000] [--batch 10000] [--data blobs]``
prints the table; ``--organize-every 0`` times the add path alone (no periodic passes; the
cold start still runs). pytest mode (a 20k store): ``pytest benches/bench_ingest.py --benchmark-enable``.
Native core: the release build that ``maturin develop --release`` installs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import measure  # noqa: E402

from clag_fast import MemoryStore, StoreConfig  # noqa: E402

DIM = 384
N_BLOBS = 1_000


class Vectors:
    """Deterministic unit vectors, generated per call (a 1M x 384 set would be 1.5 GB)."""

    def __init__(self, data: str, spread: float = 1.0, seed: int = 0) -> None:
        if data not in ("blobs", "iso"):
            raise ValueError(f"data must be 'blobs' or 'iso', got {data!r}")
        self.data, self.spread, self.seed = data, spread, seed
        rng = np.random.default_rng(seed)
        c = rng.standard_normal((N_BLOBS, DIM), dtype=np.float32)
        self.centres = c / np.linalg.norm(c, axis=1, keepdims=True)

    def chunk(self, start: int, n: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, start))
        x = rng.standard_normal((n, DIM), dtype=np.float32)
        if self.data == "blobs":
            x *= np.float32(self.spread / np.sqrt(DIM))
            x += self.centres[rng.integers(0, N_BLOBS, n)]
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x


def ingest(path: Path, n: int, batch: int, data: str, spread: float = 1.0,
           config: StoreConfig | None = None, slices: int = 10, verbose: bool = False) -> dict:
    """Grow a store at ``path`` to ``n`` memories; returns per-slice rates and organize()."""
    vecs = Vectors(data, spread)
    store = MemoryStore.open(path, config=config, llm=False, embedder=False)
    slice_n = max(batch, n // slices)
    out: dict = {"n": n, "batch": batch, "data": data, "slices": []}
    t_slice, done_slice, t_total = 0.0, 0, 0.0
    # The hypervisor's steal (this VM's cores given to others) is in no process's CPU: each
    # slice reports its share, so a slow slice on a stolen core is told from a slow store.
    m_slice = measure.cpu_times()
    try:
        for start in range(0, n, batch):
            m = min(batch, n - start)
            v = vecs.chunk(start, m)
            texts = [f"memory {i}" for i in range(start, start + m)]
            t0 = time.perf_counter()
            store.add_many(texts, embeddings=v)
            dt = time.perf_counter() - t0
            t_slice += dt
            t_total += dt
            done_slice += m
            if done_slice >= slice_n or start + m == n:
                row = {"upto": start + m, "rate": done_slice / t_slice, "seconds": t_slice,
                       "steal": measure.cores(m_slice),
                       "clusters": len(store._state.index.cluster_ids()),  # bench-only peek
                       "rss_mb": measure.rss_mb()}
                out["slices"].append(row)
                if verbose:
                    print(f"  {row['upto']:>9,}  {row['rate']:>9,.0f}/s  {row['seconds']:6.1f} s  "
                          f"{row['clusters']:>6} clusters  rss {row['rss_mb']:.0f} MB  steal {row['steal']:.2f} cores", flush=True)
                t_slice, done_slice = 0.0, 0
                m_slice = measure.cpu_times()
        out["ingest_s"] = t_total
        out["ingest_rate"] = n / t_total
        st = store.stats()  # the passes that ran inside add_many (the cold start included)
        out["passes"], out["passes_s"] = st["organizations"], st["timings_s"]["organize"]
        t0 = time.perf_counter()
        report = store.organize()
        out["organize_s"] = time.perf_counter() - t0
        out["organize"] = {k: (len(v) if isinstance(v, list) else v) for k, v in report.items()}
        t0 = time.perf_counter()
        store.close()
        out["close_s"] = time.perf_counter() - t0
    finally:
        store.close()
    out["peak_rss_mb"] = measure.peak_rss_mb()
    return out


def table(res: dict) -> str:
    lines = [f"add_many into a store growing to {res['n']:,} ({res['data']}, calls of {res['batch']:,})",
             "", "| memories | rate (memories/s) | slice s | clusters | RSS MB | steal (cores) |", "|---:|---:|---:|---:|---:|---:|"]
    for r in res["slices"]:
        lines.append(f"| {r['upto']:,} | {r['rate']:,.0f} | {r['seconds']:.1f} | {r['clusters']:,} | {r['rss_mb']:.0f} | {r['steal']:.2f} |")
    first, last = res["slices"][0]["rate"], res["slices"][-1]["rate"]
    lines += ["", f"overall {res['ingest_rate']:,.0f} memories/s ({res['ingest_s']:.1f} s); "
              f"last slice / first slice {last / first:.2f}",
              f"re-organisations inside add_many: {res['passes']} passes, {res['passes_s']:.1f} s "
              f"({res['passes_s'] / res['ingest_s']:.0%} of the adds' time)",
              f"organize() {res['organize_s']:.2f} s: {res['organize']}",
              f"close() {res['close_s']:.2f} s; peak RSS {res['peak_rss_mb']:.0f} MB"]
    return "\n".join(lines)


# -- pytest-benchmark ------------------------------------------------------------------------
N_PYTEST = int(os.environ.get("CLAG_BENCH_INGEST_N", "20000"))


@pytest.mark.parametrize("data", ["blobs", "iso"])
def test_ingest(benchmark, tmp_path, data):
    benchmark.group = f"ingest {N_PYTEST}"
    counter = iter(range(10_000))
    res = benchmark.pedantic(lambda: ingest(tmp_path / f"s{next(counter)}", N_PYTEST, 2_000, data),
                             rounds=1, iterations=1)
    assert res["slices"] and res["ingest_rate"] > 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--data", choices=["blobs", "iso"], default="blobs")
    ap.add_argument("--spread", type=float, default=1.0)
    ap.add_argument("--slices", type=int, default=10)
    ap.add_argument("--dir", default=None, help="store parent directory (default: a temp dir)")
    ap.add_argument("--organize-every", type=int, default=None,
                    help="StoreConfig.organize_every (0: no periodic passes, the add path alone)")
    a = ap.parse_args()
    config = None if a.organize_every is None else StoreConfig(organize_every=a.organize_every)
    info = measure.machine()
    print(", ".join(f"{k} {v}" for k, v in info.items()), f"| load before: {measure.load_avg()}", flush=True)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        res = ingest(Path(tmp) / "s", a.n, a.batch, a.data, a.spread, config=config, slices=a.slices, verbose=True)
    print(table(res))
    print(f"load after: {measure.load_avg()}")
