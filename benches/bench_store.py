"""MemoryStore end to end on a 100k-memory store: add latency (embedding included) and
search latency, two-stage against the flat baseline, in one run.

The 100k memories are synthetic: unit vectors around 2,000 topic centres (spread like
sentence embeddings of one conversation topic), added with ``add_many(embeddings=...)`` in
batches, then organised once. Timed on top of that store:
  - ``add`` of a real sentence (LoCoMo turns), ONNX MiniLM embedding included, vector-only
    organisation (the SLM's cost is measured by bench_slm.py);
  - ``search`` by vector with held-out queries (drawn from the same topics, never stored),
    two_stage at the default n_probe and flat, each with recall@10 against the exact numpy
    top-10 over the stored vectors (not against the store's own flat search);
  - ``search`` by text (embedding included), two_stage and flat.

Script mode: ``python benches/bench_store.py [--n 100000]`` prints the table for
BENCHMARKS.md. pytest mode: ``pytest benches/bench_store.py --benchmark-enable``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import measure  # noqa: E402
import vector_sets  # noqa: E402

from clag_fast import MemoryStore, StoreConfig  # noqa: E402

# LoCoMo's locomo10.json (github.com/snap-research/locomo, data/): $CLAG_LOCOMO, else beside the checkout.
LOCOMO = Path(os.environ.get("CLAG_LOCOMO") or Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10.json")
DIM = 384


def synthetic(n: int, n_topics: int = 2000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_topics, DIM)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    out = np.empty((n, DIM), np.float32)
    for start in range(0, n, 50_000):  # chunks keep the temporaries small
        m = min(50_000, n - start)
        v = centres[rng.integers(0, n_topics, m)] + rng.standard_normal((m, DIM)).astype(np.float32) * 0.06
        out[start:start + m] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def locomo_texts(n: int) -> tuple[list[str], list[str]]:
    data = json.loads(LOCOMO.read_text())
    turns, questions = [], []
    for sample in data:
        conv = sample["conversation"]
        for key, value in conv.items():
            if key.startswith("session_") and isinstance(value, list):
                turns += [f"{t['speaker']}: {t['text']}" for t in value]
        questions += [q["question"] for q in sample["qa"]]
    return turns[:n], questions[:n]


def build(path: Path, n: int, n_queries: int, batch: int = 5000):
    """The store of ``n`` synthetic memories, its vectors and memory ids, ``n_queries``
    held-out query vectors from the same topics (generated with the store's rows, never
    stored), and the build time."""
    cfg = StoreConfig(organize_every=0, slm="off")
    everything = synthetic(n + n_queries)
    vecs, queries = everything[:n], np.ascontiguousarray(everything[n:])
    store = MemoryStore.open(path, config=cfg, slm=False)
    ids: list[int] = []
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        chunk = vecs[start:start + batch]
        ids += store.add_many([f"synthetic memory {start + i}" for i in range(len(chunk))], embeddings=chunk)
    store.organize()
    store.flush()
    return store, vecs, np.asarray(ids, np.int64), queries, time.perf_counter() - t0


def exact_ids(vecs: np.ndarray, ids: np.ndarray, queries: np.ndarray, k: int = 10) -> np.ndarray:
    """Memory ids of the exact top-``k`` by cosine, computed with numpy (the ground truth)."""
    return ids[vector_sets.exact_topk(vecs, queries, k=k)]


def run(n: int, n_adds: int = 200, n_queries: int = 300) -> list[dict]:
    rows: list[dict] = []
    turns, questions = locomo_texts(max(n_adds, n_queries))
    with tempfile.TemporaryDirectory() as tmp:
        store, vecs, ids, qv, build_s = build(Path(tmp) / "s", n, n_queries)
        st = store.stats()
        rows.append({"what": f"build {n} memories (add_many 5k batches + organize)", "value": f"{build_s:.1f} s",
                     "detail": f"{st['clusters']} clusters, sizes {st['cluster_size']}"})
        # Vector searches first, while the store holds exactly ``vecs`` (the ground truth's rows).
        truth = exact_ids(vecs, ids, qv)
        runs = {}
        for mode in ("flat", "two_stage"):
            runs[mode] = measure.time_queries(
                lambda q, m=mode: np.asarray([h.memory_id for h in store.search(q, k=10, mode=m)]), qv, 10)
        for mode, r in runs.items():
            rows.append({"what": f"search(vector) {mode}, held-out queries", "value": f"p50 {r.p(50):.3f} ms",
                         "detail": f"p99 {r.p(99):.3f} ms, recall@10 vs exact numpy "
                                   f"{measure.recall_at_k(r.ids, truth):.3f}"})
        speed = runs["flat"].p(50) / runs["two_stage"].p(50)
        rows.append({"what": "two_stage vs flat (vector, p50)", "value": f"{speed:.1f}x faster", "detail": ""})
        h = store.search(qv[0], k=10)
        rows.append({"what": "two_stage search space", "value": f"{h.scanned} of {h.candidates} scanned",
                     "detail": f"n_probe {store.config.n_probe}"})
        store.search(questions[0])  # load the embedder before timing
        lat = []
        for t in turns[:n_adds]:
            t0 = time.perf_counter()
            store.add(t, kind="dialogue")
            lat.append(time.perf_counter() - t0)
        lat = np.asarray(lat) * 1e3
        rows.append({"what": "add(text), embedding included", "value": f"p50 {np.median(lat):.2f} ms",
                     "detail": f"p99 {np.percentile(lat, 99):.2f} ms over {n_adds} adds"})
        for mode in ("flat", "two_stage"):
            lat = []
            for q in questions[:n_queries]:
                t0 = time.perf_counter()
                store.search(q + " ", k=10, mode=mode)  # trailing space: defeat the cache honestly
                lat.append(time.perf_counter() - t0)
            lat = np.asarray(lat) * 1e3
            rows.append({"what": f"search(text) {mode}, embedding included", "value": f"p50 {np.median(lat):.2f} ms",
                         "detail": f"p99 {np.percentile(lat, 99):.2f} ms"})
        store.close()
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| measurement | result | detail |", "|---|---|---|"]
    lines += [f"| {r['what']} | {r['value']} | {r['detail']} |" for r in rows]
    return "\n".join(lines)


# -- pytest-benchmark ------------------------------------------------------------------------
N_PYTEST = int(os.environ.get("CLAG_BENCH_STORE_N", "20000"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    store, vecs, ids, queries, _ = build(tmp_path_factory.mktemp("store") / "s", N_PYTEST, 50)
    yield store, vecs, ids, queries
    store.close()


@pytest.mark.parametrize("mode", ["flat", "two_stage"])
def test_search_vector(benchmark, built, mode):
    store, vecs, ids, queries = built
    q = queries[7]  # held out: not a stored vector
    benchmark.group = f"store search {N_PYTEST}"
    hits = benchmark(store.search, q, 10, mode=mode)
    truth = exact_ids(vecs, ids, queries[7:8])[0]
    got = [h.memory_id for h in hits]
    if mode == "flat":
        assert got == truth.tolist()
    assert hits[0].memory_id == truth[0]


def test_add_text(benchmark, built):
    store = built[0]
    turns, _ = locomo_texts(50)
    it = iter(turns * 1000)
    benchmark.group = f"store add {N_PYTEST}"
    benchmark(lambda: store.add(next(it)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--adds", type=int, default=200)
    ap.add_argument("--queries", type=int, default=300)
    a = ap.parse_args()
    info = measure.machine()
    print(", ".join(f"{k} {v}" for k, v in info.items()), f"| load before: {measure.load_avg()}")
    out = run(a.n, a.adds, a.queries)
    print(table(out))
    print(f"load after: {measure.load_avg()}")
