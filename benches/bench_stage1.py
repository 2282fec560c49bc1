"""Stage 1 (picking the n_probe clusters) as the cluster count grows: brute force vs HNSW.

A usearch HNSW index could serve stage 1 where it measures faster at equal recall. This
bench measures that trade-off: for C centres (dim 384), one query at a time,
the top-16 centres by cosine from

- clag: `VectorIndex.search(q, k=1, n_probe=16)` on an index whose C clusters have those
  centres and a single member (so stage 2 is ~free and the time is stage 1 + call overhead);
- numpy: `centres @ q` + argpartition;
- usearch HNSW over the centres (metric cos, f32 and the library's bf16 default,
  connectivity 16, expansion_search 64 and 128).

Recall@16 is against the exact top-16 centres. Centres are rows of the cached hard-1M
bench set (its points are spread like k-means centres of clustered data); queries are its
queries.

    .venv/bin/pytest benches/bench_stage1.py --benchmark-enable
    .venv/bin/python benches/bench_stage1.py           # prints the markdown table

Knobs: CLAG_BENCH_STAGE1_SIZES (default ``1000,10000,50000``), CLAG_BENCH_THREADS.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # script mode: pin thread pools before numpy loads (conftest does it for pytest)
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ.setdefault(_var, os.environ.get("CLAG_BENCH_THREADS", str(os.cpu_count() or 1)))
    sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import measure  # noqa: E402
import vector_sets  # noqa: E402

N_PROBE = 16
N_QUERIES = 1000


def sizes() -> list[int]:
    return [int(s) for s in os.environ.get("CLAG_BENCH_STAGE1_SIZES", "1000,10000,50000").split(",")]


def centres_and_queries(c: int) -> tuple[np.ndarray, np.ndarray]:
    ds = vector_sets.load("hard-1M", in_memory=False)
    cen = np.ascontiguousarray(ds.base[:: len(ds.base) // c][:c], dtype=np.float32)
    cen /= np.linalg.norm(cen, axis=1, keepdims=True)
    return cen, np.ascontiguousarray(ds.queries[:N_QUERIES], dtype=np.float32)


def engines(cen: np.ndarray, tmp: str) -> dict:
    """name -> (build seconds, search(q) -> top-16 centre positions)."""
    out = {}
    t0 = time.perf_counter()
    from clag_fast.index import VectorIndex  # noqa: PLC0415

    ix = VectorIndex.open(Path(tmp) / "ix", dim=cen.shape[1])
    ix.append(cen[:1])
    cids = np.array([ix.new_cluster(v) for v in cen], dtype=np.int64)
    ix.assign(np.array([0]), cids[:1].reshape(1, 1))
    pos = np.full(int(cids.max()) + 1, -1, dtype=np.int64)
    pos[cids] = np.arange(len(cids))
    out["clag"] = (time.perf_counter() - t0, lambda q: pos[ix.search(q, k=1, n_probe=N_PROBE).probed[0]])

    def numpy_top(q):
        s = cen @ q
        top = np.argpartition(-s, N_PROBE)[:N_PROBE]
        return top[np.argsort(-s[top])]

    out["numpy"] = (0.0, numpy_top)
    try:
        from usearch.index import Index  # noqa: PLC0415
    except ImportError:
        return out
    for dtype in ("f32", "bf16"):
        t0 = time.perf_counter()
        h = Index(ndim=cen.shape[1], metric="cos", dtype=dtype, connectivity=16)
        h.add(np.arange(len(cen)), cen, threads=measure.threads())
        build = time.perf_counter() - t0
        for ef in (64, 128):
            def hnsw(q, h=h, ef=ef):
                h.expansion_search = ef
                return h.search(q, N_PROBE).keys.astype(np.int64)
            out[f"usearch-hnsw {dtype} ef{ef}"] = (build, hnsw)
    return out


def run(c: int) -> list[dict]:
    cen, queries = centres_and_queries(c)
    exact = np.argsort(-(queries @ cen.T), axis=1)[:, :N_PROBE]
    rows = []
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        for name, (build_s, fn) in engines(cen, tmp).items():
            r = measure.time_queries(fn, queries, N_PROBE)
            rows.append({"kind": "stage1", "centres": c, "engine": name, "build_s": build_s,
                         "recall": measure.recall_at_k(r.ids, exact), "p50_ms": r.p(50), "p99_ms": r.p(99),
                         "load": measure.load_avg()})
    return rows


def table(rows: list[dict]) -> str:
    out = ["| centres | engine | build s | recall@16 | p50 ms | p99 ms | vs numpy p50 | load |",
           "|---:|---|---:|---:|---:|---:|---:|---|"]
    base = {r["centres"]: r["p50_ms"] for r in rows if r["engine"] == "numpy"}
    for r in rows:
        ratio = base[r["centres"]] / r["p50_ms"]
        out.append(f"| {r['centres']} | {r['engine']} | {r['build_s']:.2f} | {r['recall']:.3f} | {r['p50_ms']:.3f} | "
                   f"{r['p99_ms']:.3f} | {ratio:.1f}x | {r['load']} |")
    return "\n".join(out)


@pytest.mark.parametrize("c", sizes())
def test_stage1(benchmark, c):
    """Stage-1 latency per engine at C centres (one round: the per-query timing is inside)."""
    benchmark.group = f"stage 1, {c} centres"
    rows = benchmark.pedantic(run, args=(c,), rounds=1, iterations=1)
    clag = next(r for r in rows if r["engine"] == "clag")
    assert clag["recall"] == 1.0  # clag's stage 1 is exact
    benchmark.extra_info["table"] = table(rows)
    print("\n" + table(rows))


if __name__ == "__main__":
    print(", ".join(f"{k} {v}" for k, v in measure.machine().items()))
    all_rows = []
    for c in sizes():
        all_rows += run(c)
        print(table(all_rows), flush=True)
