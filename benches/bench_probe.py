"""Adaptive probing: fixed n_probe vs a count proportional to the clusters vs adaptive probing,
through VectorIndex and through MemoryStore, side by side with faiss IVFFlat.

Data: 1,000 Gaussian blobs, dim 384, spread 1.0 (cos to the blob centre ~0.71), unit rows
(the generator of ``vector_sets``), 300 single queries from the same blobs, k = 10, recall@10
against the exact top-10. The store is built with ``add_many(texts, embeddings=X)`` and
``organize()``; the VectorIndex runs k-means with the store's cluster count and faiss
IVFFlat trains the same number of lists (inner product, one thread).

Every configuration answers query i, in a shuffled order, before any answers query i + 1,
so a noisy machine slows them all alike; the table reports p50 / p99 latency, recall@10 and the
median number of rows scored in stage 2. It also reports, for the radius bound
cos(max(0, acos(q.c) - acos(r))) (r = least member cosine to its centre), how many clusters
per query it could never rule out: the measurement behind choosing the centre-score gap.

    PYTHONPATH=python .venv/bin/python benches/bench_probe.py [--n 200000] [--queries 300]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

import measure  # noqa: E402
import vector_sets  # noqa: E402
from clag_fast import MemoryStore, StoreConfig  # noqa: E402
from clag_fast.index import VectorIndex  # noqa: E402

K = 10
SPREAD = 1.0


def blob_vectors(n: int, n_queries: int) -> tuple[np.ndarray, np.ndarray]:
    centres = vector_sets._centres("easy")  # 1,000 random unit centres
    base = np.concatenate([vector_sets._clustered_chunk(centres, min(vector_sets.CHUNK, n - s), SPREAD, seed=s)
                           for s in range(0, n, vector_sets.CHUNK)])
    return base, vector_sets._clustered_chunk(centres, n_queries, SPREAD, seed=10_000)


def bound_unprunable(ix: VectorIndex, base: np.ndarray, queries: np.ndarray, truth: np.ndarray) -> float:
    """Median clusters per query whose radius bound reaches the exact k-th score."""
    cids, cen = ix.cluster_ids(), ix.centres()
    pos = np.searchsorted(cids, ix.cluster_of(np.arange(len(base))))
    cos = np.einsum("ij,ij->i", base, cen[pos])
    radius = np.ones(len(cids), np.float32)
    np.minimum.at(radius, pos, cos)
    kth = np.einsum("ij,ij->i", queries, base[truth[:, -1]])
    angle = np.arccos(np.clip(queries @ cen.T, -1, 1))
    bound = np.cos(np.maximum(0, angle - np.arccos(np.clip(radius, -1, 1))[None, :]))
    return float(np.median((bound >= kth[:, None]).sum(1)))


def run(n: int, n_queries: int, gap: float | None, min_probe: int) -> tuple[list[dict], dict]:
    import faiss  # noqa: PLC0415

    faiss.omp_set_num_threads(1)
    base, queries = blob_vectors(n, n_queries)
    truth = vector_sets.exact_topk(base, queries, K)
    info: dict = {"rows": n, "queries": n_queries}
    cfg = StoreConfig(slm="off", organize_every=0)
    if gap is not None:
        cfg = cfg.replace(probe_gap=gap)
    cfg = cfg.replace(min_probe=min_probe)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        store = MemoryStore.open(Path(tmp) / "store", config=cfg, slm=False, embedder=False)
        ids = []
        for s in range(0, n, 20_000):
            ids += store.add_many([f"blob memory {s + i}" for i in range(min(20_000, n - s))], embeddings=base[s:s + 20_000])
        store.organize()
        info["store_build_s"] = round(time.perf_counter() - t0, 1)
        row_of = {m: r for r, m in enumerate(ids)}
        n_lists = int(store.stats()["clusters"])
        old_auto = int(min(max(4, math.ceil(cfg.probe_fraction * n_lists)), cfg.max_probe))
        info.update(lists=n_lists, old_auto_n_probe=old_auto, probe_gap=cfg.probe_gap, min_probe=cfg.min_probe)

        t0 = time.perf_counter()
        ix = VectorIndex.open(Path(tmp) / "ix", dim=base.shape[1])
        ix.append(base)
        ix.kmeans(n_lists, seed=0)
        ix.search(ix.centres(), k=1, n_probe=8)  # build every cluster's int8 copy, like the store's warm state
        info["index_build_s"] = round(time.perf_counter() - t0, 1)
        info["bound_unprunable_clusters_median"] = bound_unprunable(ix, base, queries, truth)

        t0 = time.perf_counter()
        faiss.omp_set_num_threads(os.cpu_count() or 1)  # train on every core, search on one
        quantizer = faiss.IndexFlatIP(base.shape[1])
        ivf = faiss.IndexIVFFlat(quantizer, base.shape[1], n_lists, faiss.METRIC_INNER_PRODUCT)
        ivf.train(base)
        ivf.add(base)
        info["faiss_build_s"] = round(time.perf_counter() - t0, 1)
        faiss.omp_set_num_threads(1)

        def ix_search(**kw):
            def f(q):
                r = ix.search(q, k=K, **kw)
                return r.ids[0], int(r.scanned[0])
            return f

        def store_search(**kw):
            def f(q):
                h = store.search(q, k=K, **kw)
                return np.asarray([row_of[x.memory_id] for x in h]), int(h.scanned)
            return f

        def faiss_search(nprobe):
            params = faiss.SearchParametersIVF(nprobe=nprobe)
            return lambda q: (ivf.search(q[None, :], K, params=params)[1][0], -1)

        adaptive = {"n_probe": old_auto, "probe_gap": cfg.probe_gap, "min_probe": cfg.min_probe}
        configs = {
            "faiss IVFFlat nprobe 1": faiss_search(1),
            "faiss IVFFlat nprobe 4": faiss_search(4),
            "faiss IVFFlat nprobe 8": faiss_search(8),
            "VectorIndex n_probe 1": ix_search(n_probe=1),
            "VectorIndex n_probe 4": ix_search(n_probe=4),
            "VectorIndex n_probe 8": ix_search(n_probe=8),
            f"VectorIndex old auto ({old_auto})": ix_search(n_probe=old_auto),
            "VectorIndex adaptive": ix_search(**adaptive),
            "store n_probe 1": store_search(n_probe=1),
            "store n_probe 4": store_search(n_probe=4),
            "store n_probe 8": store_search(n_probe=8),
            f"store old auto ({old_auto})": store_search(n_probe=old_auto),
            "store default (adaptive)": store_search(),
        }
        lat = {name: np.empty(n_queries) for name in configs}
        found = {name: np.full((n_queries, K), -1, np.int64) for name in configs}
        scanned = {name: np.empty(n_queries) for name in configs}
        for q in queries[:10]:  # warm-up
            for f in configs.values():
                f(q)
        clock = time.perf_counter_ns
        order = np.random.default_rng(0)
        names = list(configs)
        for i, q in enumerate(queries):
            for name in order.permutation(names):  # no configuration always follows the same one
                f = configs[name]
                t0 = clock()
                got, sc = f(q)
                lat[name][i] = (clock() - t0) * 1e-6
                found[name][i, : len(got)] = got[:K]
                scanned[name][i] = sc
        store.close()
        ix.close()
    rows = [{"config": name, "p50_ms": float(np.median(lat[name])), "p99_ms": float(np.percentile(lat[name], 99)),
             "recall": measure.recall_at_k(found[name], truth),
             "scanned": float(np.median(scanned[name])) if scanned[name][0] >= 0 else None} for name in configs]
    return rows, info


def table(rows: list[dict], info: dict) -> str:
    ref = {r["config"]: r["p50_ms"] for r in rows}
    lines = [f"{info}", "", "| configuration | p50 ms | p99 ms | recall@10 | median scanned | p50 / faiss nprobe 1 |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        sc = "-" if r["scanned"] is None else f"{r['scanned']:.0f}"
        lines.append(f"| {r['config']} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['recall']:.3f} | {sc} | "
                     f"{r['p50_ms'] / ref['faiss IVFFlat nprobe 1']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--probe-gap", type=float, default=None, help="override StoreConfig.probe_gap")
    ap.add_argument("--min-probe", type=int, default=StoreConfig().min_probe)
    args = ap.parse_args()
    rows, info = run(args.n, args.queries, args.probe_gap, args.min_probe)
    info["machine"] = measure.machine()
    print(table(rows, info))


if __name__ == "__main__":
    main()
