"""``where=`` metadata filters: a filtered store search against an exact numpy search over
just the matching vectors (the target: a filter matching 1% of 100k memories costs no more than a flat search over
that 1%; BENCHMARKS.md, Search).

One store of ``N`` memories (default 100,000; ``CLAG_BENCH_FILTER_N``) in 1,000 Gaussian
blobs (dim 384), organised, each with metadata ``{"tenant": i % 100, "score": float,
"tag": str}``, so ``{"tenant": t}`` matches 1% of it and ``{"tenant": {"$lt": 10}}`` 10%.
Side by side in one run (pytest-benchmark, same queries cycled):

- ``store_where_1pct``: ``MemoryStore.search(q, k=10, where={"tenant": 7})`` (vector query);
- ``numpy_exact_1pct``: ``V[match] @ q`` (BLAS) + argpartition top-10 over the 1% rows, the
  rows already gathered (the cheapest flat search over that 1% there is, returning row ids
  only: no texts, no metadata);
- ``store_flat_1pct_store``: ``search(q, k=10, mode="flat")`` on a store that holds only
  those 1% memories, with the same metadata (a flat store search over the 1%, hits with
  texts and metadata included: the like-for-like comparison);
- ``store_where_compound_1pct``: ``{"$and": [{"tenant": {"$in": [7]}}, {"score": {"$gte": 0}}]}``;
- ``store_where_10pct`` / ``numpy_exact_10pct``: the same at 10%;
- ``mask_compile_1pct``: compiling the 1% filter to a row mask (what the first search after
  a write pays; later ones hit the per-write-version cache).

The last test also times the three 1% searches interleaved call by call (each query through
all three back to back, 6 passes, each starting with another of them: a noisy spell on the
shared machine hits all alike, and none always runs right after another), then
prints the pytest-benchmark medians, the interleaved medians, the ratios, and recall@10 of
the filtered searches against the exact top-10 over the matching rows, and writes them to
``$CLAG_BENCH_CACHE/bench_filters.json``.
Run: ``pytest benches/bench_filters.py --benchmark-enable -s``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from vector_sets import cache_dir  # noqa: E402

from clag_fast import MemoryStore, StoreConfig  # noqa: E402
from clag_fast.store import filters  # noqa: E402

N = int(os.environ.get("CLAG_BENCH_FILTER_N", "100000"))
DIM = 384
K = 10
N_QUERIES = 200
TENANTS = 100
WHERE_1 = {"tenant": 7}
WHERE_C = {"$and": [{"tenant": {"$in": [7]}}, {"score": {"$gte": 0}}]}
WHERE_10 = {"tenant": {"$lt": 10}}
RESULTS: dict[str, float] = {}


def _blobs(n: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((1000, DIM)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    def draw(m):
        v = centres[rng.integers(0, 1000, m)] + rng.standard_normal((m, DIM)).astype(np.float32) / np.sqrt(DIM)
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
    return draw(n), draw(N_QUERIES)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    vecs, queries = _blobs(N)
    rng = np.random.default_rng(5)
    score = rng.standard_normal(N)
    metas = [{"tenant": i % TENANTS, "score": float(score[i]), "tag": f"t{i % 7}"} for i in range(N)]
    cfg = StoreConfig(slm="off", organize_every=0)
    root = tmp_path_factory.mktemp("filters")
    store = MemoryStore.open(root / "all", config=cfg, embedder=False, slm=False)
    for lo in range(0, N, 10_000):
        store.add_many([f"m{i}" for i in range(lo, min(N, lo + 10_000))], embeddings=vecs[lo:lo + 10_000],
                       metadata=metas[lo:lo + 10_000])
    store.organize()
    tenant = np.arange(N) % TENANTS
    one = np.flatnonzero(tenant == 7)
    ten = np.flatnonzero(tenant < 10)
    small = MemoryStore.open(root / "one", config=cfg, embedder=False, slm=False)
    small.add_many([f"m{i}" for i in one], embeddings=vecs[one], metadata=[metas[i] for i in one])
    yield {"store": store, "small": small, "vecs": vecs, "queries": queries, "one": one, "ten": ten,
           "sub1": np.ascontiguousarray(vecs[one]), "sub10": np.ascontiguousarray(vecs[ten])}
    store.close()
    small.close()


def _cycle(queries: np.ndarray):
    state = {"i": 0}

    def next_query() -> np.ndarray:
        q = queries[state["i"] % len(queries)]
        state["i"] += 1
        return q
    return next_query


def _exact(sub: np.ndarray, q: np.ndarray, k: int = K) -> np.ndarray:
    scores = sub @ q
    top = np.argpartition(-scores, k)[:k]
    return top[np.argsort(-scores[top])]


def _record(name: str, benchmark) -> None:
    RESULTS[name] = float(benchmark.stats.stats.median)


def test_store_where_1pct(benchmark, data):
    s, nq = data["store"], _cycle(data["queries"])
    hits = s.search(data["queries"][0], k=K, where=WHERE_1)
    assert len(hits) == K and all(h.metadata["tenant"] == 7 for h in hits)
    benchmark(lambda: s.search(nq(), k=K, where=WHERE_1))
    _record("store_where_1pct", benchmark)


def test_numpy_exact_1pct(benchmark, data):
    sub, nq = data["sub1"], _cycle(data["queries"])
    benchmark(lambda: _exact(sub, nq()))
    _record("numpy_exact_1pct", benchmark)


def test_store_flat_1pct_store(benchmark, data):
    s, nq = data["small"], _cycle(data["queries"])
    benchmark(lambda: s.search(nq(), k=K, mode="flat"))
    _record("store_flat_1pct_store", benchmark)


def test_store_where_compound_1pct(benchmark, data):
    s, nq = data["store"], _cycle(data["queries"])
    benchmark(lambda: s.search(nq(), k=K, where=WHERE_C))
    _record("store_where_compound_1pct", benchmark)


def test_store_where_10pct(benchmark, data):
    s, nq = data["store"], _cycle(data["queries"])
    benchmark(lambda: s.search(nq(), k=K, where=WHERE_10))
    _record("store_where_10pct", benchmark)


def test_numpy_exact_10pct(benchmark, data):
    sub, nq = data["sub10"], _cycle(data["queries"])
    benchmark(lambda: _exact(sub, nq()))
    _record("numpy_exact_10pct", benchmark)


def test_mask_compile_1pct(benchmark, data):
    s = data["store"]
    s.memories(where=WHERE_1, limit=1)  # the metadata columns are built by the first filter
    node = filters.parse(WHERE_1)
    fields = s._state.field_table(filters.fields_of(node))
    n = s._state.rows.n
    benchmark(lambda: filters.mask(node, fields, n))
    _record("mask_compile_1pct", benchmark)


def test_report(data):
    s, queries = data["store"], data["queries"]
    recall = {}
    for name, where, rows in (("1pct", WHERE_1, data["one"]), ("10pct", WHERE_10, data["ten"])):
        found = 0
        for q in queries:
            truth = set(rows[_exact(data["vecs"][rows], q)].tolist())
            got = {h.memory_id - 1 for h in s.search(q, k=K, where=where)}  # ids are rows + 1 here
            found += len(truth & got)
        recall[name] = found / (K * len(queries))
    calls = {
        "store_where_1pct": lambda q: s.search(q, k=K, where=WHERE_1),
        "store_flat_1pct_store": lambda q: data["small"].search(q, k=K, mode="flat"),
        "numpy_exact_1pct": lambda q: _exact(data["sub1"], q),
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls.items())
    for p in range(6):
        # Each pass starts with another of the three, so none always runs right after another
        # (in a fixed order the filtered search always followed the numpy product).
        for q in queries:
            for name, call in order[p % 3:] + order[:p % 3]:
                t0 = time.perf_counter()
                call(q)
                times[name].append(time.perf_counter() - t0)
    inter = {name: float(np.median(v)) for name, v in times.items()}
    out = dict(RESULTS, n=N, recall_at_10=recall, interleaved_median_s=inter,
               interleaved_ratio_vs_numpy=inter["store_where_1pct"] / inter["numpy_exact_1pct"],
               interleaved_ratio_vs_flat_store=inter["store_where_1pct"] / inter["store_flat_1pct_store"])
    if "store_where_1pct" in RESULTS and "numpy_exact_1pct" in RESULTS:
        out["ratio_1pct_vs_numpy"] = RESULTS["store_where_1pct"] / RESULTS["numpy_exact_1pct"]
    if "store_flat_1pct_store" in RESULTS and "store_where_1pct" in RESULTS:
        out["ratio_1pct_vs_flat_store_of_the_1pct"] = RESULTS["store_where_1pct"] / RESULTS["store_flat_1pct_store"]
    if "store_where_10pct" in RESULTS and "numpy_exact_10pct" in RESULTS:
        out["ratio_10pct_vs_numpy"] = RESULTS["store_where_10pct"] / RESULTS["numpy_exact_10pct"]
    print("\nbench_filters (medians in ms):")
    for k, v in out.items():
        if isinstance(v, float) and not k.startswith(("ratio", "interleaved")):
            print(f"  {k:32s} {v * 1e3:8.3f}")
    for k, v in out.items():
        if k.startswith("ratio"):
            print(f"  {k:40s} {v:6.2f}x")
    print("  interleaved medians (ms): " + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in inter.items()))
    print(f"  interleaved: where 1% / numpy {out['interleaved_ratio_vs_numpy']:.2f}x, "
          f"where 1% / flat store of the 1% {out['interleaved_ratio_vs_flat_store']:.2f}x")
    print(f"  recall@10 vs exact over the matching rows: {recall}")
    (cache_dir() / "bench_filters.json").write_text(json.dumps(out, indent=2))
    assert recall["1pct"] == 1.0  # the 1% filter is searched exactly
