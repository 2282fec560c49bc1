"""Ingest and maintenance through the public API: ``MemoryStore.add_many(embeddings=...)``
into a store growing to N memories, then one ``organize()``.

What is timed: every ``add_many`` call (vector routing, SQLite, the periodic organisations
that fire inside it with ``slm=False``), reported as a rate per slice of the growth (N / 10
memories per slice), so a cost that grows with the store shows up as a falling rate; then an
explicit ``organize()`` of the full store (vector profiles) and the peak RSS. Vectors are
generated outside the timed region, one call's worth at a time:

* ``blobs``: unit vectors around 1,000 random Gaussian centres (dim 384, noise norm
  ``--spread``, default 1.0: cos(row, centre) ~ 0.7), the shape of sentence embeddings;
* ``iso``: isotropic unit vectors (no structure: every row opens or joins a weak cluster).

Modes (``--modes``, several run in turns in one process, side by side):

* ``default``: ``add_many(texts, embeddings=X)``, the periodic passes running inside it;
* ``defer``: the bulk-load mode, ``add_many(..., defer_organize=True)``: the passes that fall
  due are put off, and the one owed at the end (``organize_deferred()``) is timed on its own;
  the end-to-end rate counts it.

After the load (the owed pass included) each store answers ``--queries`` held-out queries
drawn like the rows: ``search(q, k=10)`` with the defaults, recall@10 against the exact top-10
(streamed over the same generated rows) and the p50 of a second pass, so a faster load that
left worse clusters shows up.

Script mode: ``python benches/bench_ingest.py [--n 1000000] [--batch 10000] [--data blobs]
[--modes default,defer] [--turns 1]`` prints a table per run and a comparison (every other
turn runs the modes in the other order);
``--organize-every 0`` times the add path alone (no periodic passes; the cold start still
runs); ``--record`` puts each mode's runs in ``benches/results/ingest.json`` (BENCHMARKS.md,
Ingest; then ``python benches/render.py``). pytest mode (a 20k store):
``pytest benches/bench_ingest.py --benchmark-enable``.
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
           config: StoreConfig | None = None, slices: int = 10, verbose: bool = False,
           defer: bool = False, queries: int = 0) -> dict:
    """Grow a store at ``path`` to ``n`` memories; returns per-slice rates and organize().
    ``defer``: bulk-load mode (``defer_organize=True``, then ``organize_deferred()``).
    ``queries``: recall@10 and p50 of that many default searches after the load."""
    vecs = Vectors(data, spread)
    store = MemoryStore.open(path, config=config, slm=False, embedder=False)
    slice_n = max(batch, n // slices)
    out: dict = {"n": n, "batch": batch, "data": data, "mode": "defer" if defer else "default", "slices": []}
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
            store.add_many(texts, embeddings=v, defer_organize=defer)
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
        # The pass a deferred load owes (None in the default mode: nothing is owed).
        t0 = time.perf_counter()
        owed = store.organize_deferred()
        out["owed_s"] = time.perf_counter() - t0 if owed is not None else 0.0
        out["owed"] = None if owed is None else _summary(owed)
        out["end_to_end_rate"] = n / (t_total + out["owed_s"])
        out["clusters_after_load"] = store.stats()["clusters"]
        if queries:
            out.update(search_quality(store, vecs, n, batch, queries))
        t0 = time.perf_counter()
        report = store.organize()
        out["organize_s"] = time.perf_counter() - t0
        out["organize"] = _summary(report)
        t0 = time.perf_counter()
        store.close()
        out["close_s"] = time.perf_counter() - t0
    finally:
        store.close()
    out["peak_rss_mb"] = measure.peak_rss_mb()
    return out


def _summary(report: dict) -> dict:
    """An organisation report with its lists (clusters split, merged, ...) as their lengths."""
    return {k: (len(v) if isinstance(v, list) else v) for k, v in report.items()}


def exact_top10(vecs: Vectors, n: int, batch: int, q: np.ndarray) -> np.ndarray:
    """Indices of the exact top-10 rows (cosine) for each query, streamed over the rows in
    the chunks ``ingest`` generated (a 1M x 384 copy would be 1.5 GB)."""
    best_s = np.full((len(q), 10), -np.inf, np.float32)
    best_i = np.full((len(q), 10), -1, np.int64)  # -1: fewer than 10 rows (never a hit)
    for start in range(0, n, batch):
        m = min(batch, n - start)
        s = q @ vecs.chunk(start, m).T
        cand_s = np.concatenate([best_s, s], axis=1)
        cand_i = np.concatenate([best_i, np.broadcast_to(np.arange(start, start + m), s.shape)], axis=1)
        top = np.argsort(-cand_s, axis=1, kind="stable")[:, :10]
        best_s, best_i = np.take_along_axis(cand_s, top, 1), np.take_along_axis(cand_i, top, 1)
    return best_i


def search_quality(store: MemoryStore, vecs: Vectors, n: int, batch: int, queries: int) -> dict:
    """Recall@10 of the default ``search`` against the exact top-10, and its p50 (a second
    pass over the same queries), on held-out queries drawn like the rows. A hit's row is read
    from its text ("memory {i}"), so this goes through the public API only."""
    q = vecs.chunk(10 * max(n, 1), queries)  # a start no ingest reaches: fresh rows
    truth = exact_top10(vecs, n, batch, q)
    found = np.full((queries, 10), -1, np.int64)
    scanned = []
    for i, qv in enumerate(q):
        hits = store.search(qv, k=10)
        found[i, : len(hits)] = [int(h.text.split()[1]) for h in hits]
        scanned.append(hits.scanned)
    lat = []
    for qv in q:
        t0 = time.perf_counter()
        store.search(qv, k=10)
        lat.append(time.perf_counter() - t0)
    return {"recall10": measure.recall_at_k(found, truth), "search_p50_ms": float(np.median(lat) * 1000),
            "scanned": float(np.median(scanned))}


def table(res: dict) -> str:
    lines = [f"add_many into a store growing to {res['n']:,} ({res['data']}, calls of {res['batch']:,}, "
             f"mode {res['mode']})",
             "", "| memories | rate (memories/s) | slice s | clusters | RSS MB | steal (cores) |", "|---:|---:|---:|---:|---:|---:|"]
    for r in res["slices"]:
        lines.append(f"| {r['upto']:,} | {r['rate']:,.0f} | {r['seconds']:.1f} | {r['clusters']:,} | {r['rss_mb']:.0f} | {r['steal']:.2f} |")
    first, last = res["slices"][0]["rate"], res["slices"][-1]["rate"]
    lines += ["", f"overall {res['ingest_rate']:,.0f} memories/s ({res['ingest_s']:.1f} s); "
              f"last slice / first slice {last / first:.2f}",
              f"re-organisations inside add_many: {res['passes']} passes, {res['passes_s']:.1f} s "
              f"({res['passes_s'] / res['ingest_s']:.0%} of the adds' time)"]
    if res["owed"] is not None:
        lines.append(f"the pass the load owed (organize_deferred): {res['owed_s']:.2f} s, "
                     f"{res['owed']['split']} splits, {res['owed']['clusters']} clusters")
    lines.append(f"end to end (adds + owed pass) {res['end_to_end_rate']:,.0f} memories/s; "
                 f"{res['clusters_after_load']:,} clusters after the load")
    if "recall10" in res:
        lines.append(f"default search after the load: recall@10 {res['recall10']:.3f}, p50 {res['search_p50_ms']:.3f} ms, "
                     f"{res['scanned']:,.0f} memories scanned (median)")
    lines += [
              f"organize() {res['organize_s']:.2f} s: {res['organize']}",
              f"close() {res['close_s']:.2f} s; peak RSS {res['peak_rss_mb']:.0f} MB"]
    return "\n".join(lines)


def recorded_cells(runs: list[dict], mode: str) -> dict[str, str]:
    """The ``ingest/load-1m`` row of BENCHMARKS.md for one mode's runs (values of several runs
    joined with " / ", a value every run shares written once)."""
    rs = [r for r in runs if r["mode"] == mode]
    if not rs:
        raise ValueError(f"no {mode} run to record")

    def each(fmt) -> str:
        values = [fmt(r) for r in rs]
        return values[0] if len(set(values)) == 1 else " / ".join(values)

    return {"mode": "defaults" if mode == "default" else "`add_many(defer_organize=True)`",
            "adds (memories/s)": each(lambda r: f"{r['ingest_rate']:,.0f}"),
            "owed pass s": "-" if mode == "default" else each(lambda r: f"{r['owed_s']:.2f}"),
            "end to end (memories/s)": each(lambda r: f"{r['end_to_end_rate']:,.0f}"),
            "clusters": each(lambda r: f"{r['clusters_after_load']:,}"),
            "recall@10": each(lambda r: f"{r['recall10']:.3f}" if "recall10" in r else "-"),
            "search p50 ms": each(lambda r: f"{r['search_p50_ms']:.3f}" if "search_p50_ms" in r else "-"),
            "scanned (median)": each(lambda r: f"{r['scanned']:,.0f}" if "scanned" in r else "-"),
            "organize() s": each(lambda r: f"{r['organize_s']:.2f}")}


# -- pytest-benchmark ------------------------------------------------------------------------
N_PYTEST = int(os.environ.get("CLAG_BENCH_INGEST_N", "20000"))


@pytest.mark.parametrize("mode", ["default", "defer"])
@pytest.mark.parametrize("data", ["blobs", "iso"])
def test_ingest(benchmark, tmp_path, data, mode):
    benchmark.group = f"ingest {N_PYTEST}"
    counter = iter(range(10_000))
    res = benchmark.pedantic(lambda: ingest(tmp_path / f"s{next(counter)}", N_PYTEST, 2_000, data, defer=mode == "defer"),
                             rounds=1, iterations=1)
    assert res["slices"] and res["ingest_rate"] > 0 and res["end_to_end_rate"] > 0


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
    ap.add_argument("--modes", default="default",
                    help="comma-separated: default (passes inside add_many), defer (defer_organize=True)")
    ap.add_argument("--turns", type=int, default=1, help="runs of every mode, in turns (every other turn in the other order)")
    ap.add_argument("--queries", type=int, default=300, help="held-out searches after each load (0: none)")
    ap.add_argument("--record", action="store_true",
                    help="put each mode's runs in benches/results/ingest.json (the 1M blob load with the defaults "
                         "only); then python benches/render.py")
    a = ap.parse_args()
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or any(m not in ("default", "defer") for m in modes):
        ap.error(f"--modes takes default and/or defer, got {a.modes!r}")
    if a.record and (a.n, a.batch, a.data, a.spread, a.organize_every) != (1_000_000, 10_000, "blobs", 1.0, None):
        ap.error("--record keeps the 1M blob load of BENCHMARKS.md: --n, --batch, --data, --spread and "
                 "--organize-every at their defaults")
    config = None if a.organize_every is None else StoreConfig(organize_every=a.organize_every)
    info = measure.machine()
    print(", ".join(f"{k} {v}" for k, v in info.items()), f"| load before: {measure.load_avg()}", flush=True)
    runs = []
    for turn in range(a.turns):
        # Every other turn in the other order: a mode that always ran first (a fresh process,
        # a smaller heap) would carry that as its own.
        for mode in (modes if turn % 2 == 0 else modes[::-1]):
            with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
                res = ingest(Path(tmp) / "s", a.n, a.batch, a.data, a.spread, config=config, slices=a.slices,
                             verbose=True, defer=mode == "defer", queries=a.queries)
            print(table(res), flush=True)
            runs.append(res)
    if len(runs) > 1:
        print(f"\nside by side, in turns ({a.n:,} memories, {a.data}, calls of {a.batch:,}):\n")
        print("| run | mode | adds (memories/s) | owed pass s | end to end (memories/s) | clusters | recall@10 | search p50 ms | scanned | organize() s | steal (cores, max slice) |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for i, r in enumerate(runs, 1):
            print(f"| {i} | {r['mode']} | {r['ingest_rate']:,.0f} | {r['owed_s']:.2f} | {r['end_to_end_rate']:,.0f} | "
                  f"{r['clusters_after_load']:,} | {r.get('recall10', float('nan')):.3f} | {r.get('search_p50_ms', float('nan')):.3f} | {r.get('scanned', float('nan')):,.0f} | "
                  f"{r['organize_s']:.2f} | {max(s['steal'] for s in r['slices']):.2f} |")
    print(f"load after: {measure.load_avg()}")
    if a.record:
        import record  # noqa: PLC0415 -- only when recording

        for mode in modes:
            n_runs = sum(r["mode"] == mode for r in runs)
            key = record.record("ingest", "load-1m", mode, recorded_cells(runs, mode),
                                note=f"{n_runs} runs, in turns" if n_runs > 1 else None)
            print(f"recorded ingest/load-1m {key}")
