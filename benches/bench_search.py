"""Native-core benchmarks: two-stage search vs numpy, faiss and usearch; assignment; k-means; open.

pytest-benchmark mode (all comparisons side by side, one group per dataset)::

    .venv/bin/pytest benches/bench_search.py --benchmark-enable
    CLAG_BENCH_SIZES=100k CLAG_BENCH_SETS=easy,real .venv/bin/pytest benches/bench_search.py --benchmark-enable

Script mode (same engines and datasets, prints the markdown tables for BENCHMARKS.md)::

    .venv/bin/python benches/bench_search.py

Knobs (environment): CLAG_BENCH_SIZES (``100k,1M``), CLAG_BENCH_SETS (``easy,hard,real`` or
names such as ``hard-100k``; ``uneven``: blob count and sizes unlike the cluster count), CLAG_BENCH_THREADS (all cores), CLAG_BENCH_HNSW_1M=1 (build
usearch HNSW at 1M too: ~7 minutes on 2 cores), CLAG_BENCH_QUERIES (queries timed per engine,
the same for every engine; default all 1,000), CLAG_BENCH_ASSIGN_ROWS (rows every assignment
implementation processes, the same prefix for numpy, faiss and clag; default 200k),
CLAG_BENCH_CACHE (``/tmp/clag_bench``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":  # script mode: pin thread pools before numpy loads (conftest does it for pytest)
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ.setdefault(_var, os.environ.get("CLAG_BENCH_THREADS", str(os.cpu_count() or 1)))
    sys.path.insert(0, str(Path(__file__).parent))

import gc  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import engines  # noqa: E402
import measure  # noqa: E402
import vector_sets  # noqa: E402
from engines import Registry, Unavailable  # noqa: E402

# (family, parameter) pairs timed per dataset, in table order.
SEARCHES = [
    ("numpy-brute", None),
    ("faiss-flat", None),
    ("faiss-ivf", 1),
    ("faiss-ivf", 4),
    ("faiss-ivf", 16),
    ("usearch-hnsw", None),
    ("clag", 1),
    ("clag", 4),
    ("clag", 16),
    ("clag-flat", None),
]
ASSIGNERS = ("numpy", "faiss", "clag")


def _assign_run(reg: Registry, impl: str):
    """Time one soft-assignment implementation over every base row; record and return it."""
    try:
        rows, centres, cids = engines.assignment_inputs(reg)
    except Unavailable:
        if impl == "clag":
            raise
        ivf = reg.get("faiss-ivf").index  # no clag centres: assign to faiss's trained lists
        centres, cids = ivf.quantizer.reconstruct_n(0, ivf.nlist), None
        rows = reg.ds.base
    # Every implementation assigns the same rows: a prefix, because the baselines run at a
    # steady rows/s and numpy needs ~2 minutes for 1M rows on the shared 2 cores.
    rows = rows[: int(os.environ.get("CLAG_BENCH_ASSIGN_ROWS", "200000"))]
    if impl in ("numpy", "faiss"):
        impl_fn = engines.assign_numpy if impl == "numpy" else engines.assign_faiss
        fn = lambda: impl_fn(rows, centres)  # noqa: E731
    else:
        index = reg.get("clag").index

        def fn():
            ids, scores = engines.assign_clag(index, rows)
            # cluster ids -> positions in centres(), to compare with the baselines
            lookup = np.full(int(cids.max()) + 2, -1, dtype=np.int64)
            lookup[cids] = np.arange(len(cids))
            return np.where(ids >= 0, lookup[ids], -1), scores

    return fn, rows, centres


def _record_assign(reg: Registry, impl: str, seconds: float, ids: np.ndarray, rows, centres) -> dict:
    ref = reg.__dict__.setdefault("_assign_ref", {})
    if impl == "numpy":  # the reference the others are compared with (runs first)
        ref["ids"] = ids
    agree = engines.primary_agreement(ids, ref["ids"]) if ref.get("ids") is not None else None  # on the common prefix
    rec = {"kind": "assign", "dataset": reg.ds.name, "engine": impl, "rows": len(rows), "centres": len(centres),
           "seconds": seconds, "rows_per_s": len(rows) / seconds, "agree": agree, "load": measure.load_avg()}
    measure.RESULTS.append(rec)
    return rec


# --- pytest-benchmark mode -----------------------------------------------------------------


@pytest.fixture(scope="session", params=vector_sets.selected())
def ds(request):
    """One dataset at a time (pytest groups the tests by it, so only one is in memory)."""
    data = vector_sets.load(request.param)
    yield data
    del data
    gc.collect()


@pytest.fixture(scope="session")
def registry(ds):
    """The indexes built on ``ds``; freed before the next dataset loads."""
    reg = Registry(ds)
    yield reg
    reg.close()


@pytest.mark.parametrize("family", engines.FAMILIES)
def test_build(benchmark, ds, registry, family):
    """Build / train / cluster time and resident memory of each index (one round: builds are slow)."""
    benchmark.group = f"{ds.name}: build"
    try:
        stats = benchmark.pedantic(registry.build, args=(family,), rounds=1, iterations=1)
    except Unavailable as exc:
        pytest.skip(str(exc))
    benchmark.extra_info.update({"rss_delta_mb": round(stats["rss_mb"], 1), **stats["detail"]})


@pytest.mark.parametrize(("family", "param"), SEARCHES, ids=[f"{f}-{p}" if p else f for f, p in SEARCHES])
def test_search(benchmark, ds, registry, family, param):
    """Single-query latency and recall@10 against exact, one round per query."""
    benchmark.group = f"{ds.name}: single-query search k=10"
    try:
        search = registry.get(family).searcher(param)
    except Unavailable as exc:
        pytest.skip(str(exc))
    n = engines.n_queries_for(family, ds)
    queries = ds.queries[:n]
    if benchmark.disabled:  # plain pytest run: still check the engine end to end, untimed
        run = measure.time_queries(search, queries, vector_sets.K)
    else:
        for q in queries[:10]:  # warm-up: first-touch page faults, lazy allocations
            search(q)
        ids = np.full((n, vector_sets.K), -1, dtype=np.int64)
        order = iter(range(n))

        def setup():
            i = next(order)
            return (i,), {}

        def one(i):
            found = search(queries[i])
            ids[i, : len(found)] = found[: vector_sets.K]

        benchmark.pedantic(one, setup=setup, rounds=n, iterations=1)
        run = measure.QueryRun(np.asarray(benchmark.stats.stats.data, dtype=np.float64), ids)
    rec = engines.search_record(ds, family, param, run)
    benchmark.extra_info.update({k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items()
                                 if k in ("recall", "p50_ms", "p99_ms", "queries", "load")})
    # Sanity, not a target: every engine here must find real neighbours.
    assert rec["recall"] > 0.05, f"{family} recall {rec['recall']:.3f}: broken search"


@pytest.mark.parametrize("impl", ASSIGNERS)
def test_soft_assign(benchmark, ds, registry, impl):
    """Batched soft assignment (K=3) of the same base rows (CLAG_BENCH_ASSIGN_ROWS) to the
    k-means centres by every implementation, rows/s."""
    benchmark.group = f"{ds.name}: soft assignment K=3"
    try:
        fn, rows, centres = _assign_run(registry, impl)
    except Unavailable as exc:
        pytest.skip(str(exc))
    t = measure.timed(lambda: benchmark.pedantic(fn, rounds=1, iterations=1))
    ids, _ = t.value
    rec = _record_assign(registry, impl, t.seconds, np.asarray(ids), rows, centres)
    benchmark.extra_info.update({"rows_per_s": round(rec["rows_per_s"]), "agree": rec["agree"]})
    if rec["agree"] is not None:  # ties between near-equal centres may differ; the rest must not
        assert rec["agree"] > 0.99, f"{impl} disagrees with numpy on {1 - rec['agree']:.2%} of rows"


def test_open_store(benchmark, ds, registry):
    """Open the clag store in fresh processes: median seconds and RSS before any query."""
    benchmark.group = f"{ds.name}: open store"
    try:
        rec = benchmark.pedantic(engines.open_in_fresh_process, args=(registry,), rounds=1, iterations=1)
    except Unavailable as exc:
        pytest.skip(str(exc))
    benchmark.extra_info.update({k: rec[k] for k in ("rows", "open_s", "rss_delta_mb", "rss_mb", "first_query_ms")})
    assert rec["rows"] == ds.n


# --- script mode ---------------------------------------------------------------------------


def main() -> None:
    """Run every selected dataset once and print the tables (no pytest-benchmark overhead)."""
    info = measure.machine()
    print("# " + ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    for name in vector_sets.selected():
        ds = vector_sets.load(name)
        print(f"## {name}: {ds.n} rows, {len(ds.queries)} queries, {ds.n_clusters} lists; {ds.meta}", flush=True)
        reg = Registry(ds)
        for family in engines.FAMILIES:
            try:
                st = reg.build(family)
                print(f"  build {family}: {st['build_s']:.2f} s, RSS +{st['rss_mb']:.0f} MiB {st['detail']}", flush=True)
            except Unavailable as exc:
                print(f"  skip {family}: {exc}", flush=True)
        for family, param in SEARCHES:
            try:
                search = reg.get(family).searcher(param)
            except Unavailable:
                continue
            n = engines.n_queries_for(family, ds)
            rec = engines.search_record(ds, family, param, measure.time_queries(search, ds.queries[:n], vector_sets.K))
            print(f"  {family:13s} {rec['params']:10s} recall {rec['recall']:.3f}  p50 {rec['p50_ms']:.3f} ms"
                  f"  p99 {rec['p99_ms']:.3f} ms  ({n} q, load {rec['load']})", flush=True)
        for impl in ASSIGNERS:
            try:
                fn, rows, centres = _assign_run(reg, impl)
            except Unavailable:
                continue
            t = measure.timed(fn)
            rec = _record_assign(reg, impl, t.seconds, np.asarray(t.value[0]), rows, centres)
            print(f"  assign {impl}: {rec['rows_per_s']:,.0f} rows/s (agree {rec['agree']})", flush=True)
        try:
            rec = engines.open_in_fresh_process(reg)
            print(f"  open: {rec['open_s']:.4f} s, RSS +{rec['rss_delta_mb']:.1f} MiB", flush=True)
        except Unavailable as exc:
            print(f"  skip open: {exc}", flush=True)
        reg.close()
        del ds, reg
        gc.collect()
    print()
    print(measure.tables())


if __name__ == "__main__":
    main()
