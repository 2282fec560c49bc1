"""The indexes compared in benches/bench_search.py, behind one small interface.

Each family is built once per dataset (``build() -> detail dict``) and then hands out
single-query searchers (``searcher(param) -> f(q) -> ids``), so faiss IVF and clag_fast are
trained once and probed at n_probe 1, 4 and 16.  The Registry owns the built indexes of one
dataset and frees them when the dataset changes, keeping peak memory to one dataset's worth.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import measure
from vector_sets import K, VectorSet, cache_dir


class Unavailable(RuntimeError):
    """The engine cannot run here (library missing, or skipped by configuration)."""


class NumpyBrute:
    """Exact search: one matrix-vector product and an argpartition (the 1x reference)."""

    family = "numpy-brute"

    def __init__(self, ds: VectorSet) -> None:
        self.ds = ds

    def build(self) -> dict:
        self.base = self.ds.base  # no index: scans the rows as they are
        return {}

    def searcher(self, param=None):
        base = self.base

        def search(q: np.ndarray) -> np.ndarray:
            s = base @ q
            top = np.argpartition(-s, K - 1)[:K]
            return top[np.argsort(-s[top])]

        return search

    def close(self) -> None:
        self.base = None


class FaissFlat:
    """faiss IndexFlatIP: exact, SIMD brute force."""

    family = "faiss-flat"

    def __init__(self, ds: VectorSet) -> None:
        import faiss  # noqa: PLC0415 -- bench-only dependency

        faiss.omp_set_num_threads(measure.threads())
        self.faiss, self.ds = faiss, ds

    def build(self) -> dict:
        self.index = self.faiss.IndexFlatIP(self.ds.base.shape[1])
        self.index.add(self.ds.base)
        return {}

    def searcher(self, param=None):
        index = self.index
        return lambda q: index.search(q[None, :], K)[1][0]

    def close(self) -> None:
        self.index = None


class FaissIVF:
    """faiss IndexIVFFlat over inner product with the dataset's number of lists."""

    family = "faiss-ivf"

    def __init__(self, ds: VectorSet) -> None:
        import faiss  # noqa: PLC0415

        faiss.omp_set_num_threads(measure.threads())
        self.faiss, self.ds = faiss, ds

    def build(self) -> dict:
        faiss, base = self.faiss, self.ds.base
        self.quantizer = faiss.IndexFlatIP(base.shape[1])
        self.index = faiss.IndexIVFFlat(self.quantizer, base.shape[1], self.ds.n_clusters, faiss.METRIC_INNER_PRODUCT)
        t0 = time.perf_counter()
        self.index.train(base)
        t1 = time.perf_counter()
        self.index.add(base)
        t2 = time.perf_counter()
        return {"lists": self.ds.n_clusters, "train_s": round(t1 - t0, 2), "add_s": round(t2 - t1, 2)}

    def searcher(self, param=1):
        index = self.index
        params = self.faiss.SearchParametersIVF(nprobe=int(param))
        return lambda q: index.search(q[None, :], K, params=params)[1][0]

    def close(self) -> None:
        self.index = self.quantizer = None


class USearchHNSW:
    """usearch HNSW, metric cos, library defaults (dtype chosen by usearch)."""

    family = "usearch-hnsw"

    def __init__(self, ds: VectorSet) -> None:
        from usearch.index import Index  # noqa: PLC0415

        # usearch at 1M took 428 s to build on the 2-core machine: opt in explicitly.
        if ds.n > 200_000 and os.environ.get("CLAG_BENCH_HNSW_1M") != "1":
            raise Unavailable("usearch HNSW above 200k rows is skipped unless CLAG_BENCH_HNSW_1M=1 (428 s build)")
        self.Index, self.ds = Index, ds

    def build(self) -> dict:
        base = self.ds.base
        self.index = self.Index(ndim=base.shape[1], metric="cos")
        self.index.add(np.arange(len(base), dtype=np.uint64), base, threads=measure.threads())
        return {"dtype": str(self.index.dtype), "connectivity": self.index.connectivity,
                "expansion_search": self.index.expansion_search}

    def searcher(self, param=None):
        index = self.index
        return lambda q: index.search(q, K).keys.astype(np.int64)

    def close(self) -> None:
        self.index = None


def _vector_index():
    try:
        from clag_fast.index import VectorIndex  # noqa: PLC0415
    except ImportError as exc:  # the core is built in parallel; say why instead of failing
        raise Unavailable(f"clag_fast.index.VectorIndex not importable: {exc}") from exc
    return VectorIndex


class Clag:
    """clag_fast VectorIndex: append into a fresh store, cold-start k-means, two-stage search."""

    family = "clag"
    APPEND_CHUNK = 100_000

    def __init__(self, ds: VectorSet) -> None:
        self.VectorIndex, self.ds = _vector_index(), ds
        self.path = store_path(ds)

    def build(self) -> dict:
        shutil.rmtree(self.path, ignore_errors=True)
        base = self.ds.base
        t0 = time.perf_counter()
        self.index = self.VectorIndex.open(self.path, dim=base.shape[1])
        for start in range(0, len(base), self.APPEND_CHUNK):
            self.index.append(base[start : start + self.APPEND_CHUNK])
        t1 = time.perf_counter()
        self.index.kmeans(self.ds.n_clusters, seed=0)
        t2 = time.perf_counter()
        self.index.flush()
        t3 = time.perf_counter()
        # Stage 2 builds a contiguous int8 copy of a cluster's member rows the first time
        # that cluster is probed by a scan big enough to use it.  Touch every cluster --
        # each centre as a query, 8 probes -- so that search latencies are steady-state like
        # faiss's, and report the one-off cost (and its memory, in this build's RSS delta)
        # as warm_s.
        self.index.search(self.index.centres(), k=1, n_probe=min(8, self.ds.n_clusters))
        t4 = time.perf_counter()
        (self.path / "bench.json").write_text(json.dumps({"rows": len(base), "clusters": self.ds.n_clusters}))
        return {"clusters": self.ds.n_clusters, "append_s": round(t1 - t0, 2), "kmeans_s": round(t2 - t1, 2),
                "flush_s": round(t3 - t2, 2), "warm_s": round(t4 - t3, 2)}

    def searcher(self, param=4):
        index, n_probe = self.index, int(param)
        return lambda q: index.search(q, k=K, n_probe=n_probe, mode="two_stage").ids[0]

    def close(self) -> None:
        if getattr(self, "index", None) is not None:
            self.index.close()
        self.index = None


class ClagFlat:
    """clag_fast exact flat search over the same store (its own brute-force baseline)."""

    family = "clag-flat"

    def __init__(self, ds: VectorSet, clag: Clag) -> None:
        self.clag, self.ds = clag, ds

    def build(self) -> dict:
        return {"shares": "clag store"}

    def searcher(self, param=None):
        index = self.clag.index
        return lambda q: index.search(q, k=K, mode="flat").ids[0]

    def close(self) -> None:
        pass


def store_path(ds: VectorSet) -> Path:
    """Directory of the clag_fast store built for ``ds`` (kept for the open benchmark)."""
    return cache_dir() / "stores" / ds.name


FAMILIES = ("numpy-brute", "faiss-flat", "faiss-ivf", "usearch-hnsw", "clag")
_CLASSES = {c.family: c for c in (NumpyBrute, FaissFlat, FaissIVF, USearchHNSW, Clag)}


class Registry:
    """Built indexes of one dataset, built on first use and freed by ``close()``."""

    def __init__(self, ds: VectorSet) -> None:
        self.ds = ds
        self.built: dict[str, object] = {}
        self.build_stats: dict[str, dict] = {}

    def build(self, family: str) -> dict:
        """(Re)build ``family``; returns {build_s, rss_mb, detail}; raises Unavailable."""
        old = self.built.pop(family, None)
        if old is not None:
            old.close()
            gc.collect()
        if family == "clag-flat":
            engine = ClagFlat(self.ds, self.get("clag"))
        else:
            engine = _CLASSES[family](self.ds)
        t = measure.timed(engine.build)
        self.built[family] = engine
        stats = {"build_s": t.seconds, "rss_mb": t.rss_delta_mb, "detail": t.value}
        self.build_stats[family] = stats
        measure.RESULTS.append({"kind": "build", "dataset": self.ds.name, "engine": family,
                                "load": measure.load_avg(), **stats})
        return stats

    def drop(self, family: str) -> None:
        """Close and forget ``family`` (and what shares it), e.g. to release the writer lock."""
        for name in (family, "clag-flat") if family == "clag" else (family,):
            engine = self.built.pop(name, None)
            if engine is not None:
                engine.close()
        gc.collect()

    def get(self, family: str):
        """The built engine for ``family``, building it now if needed."""
        if family not in self.built:
            self.build(family)
        return self.built[family]

    def close(self) -> None:
        for engine in self.built.values():
            engine.close()
        self.built.clear()
        gc.collect()


def search_record(ds: VectorSet, family: str, param, run: measure.QueryRun) -> dict:
    """One row of the search table (also appended to measure.RESULTS)."""
    rec = {"kind": "search", "dataset": ds.name, "engine": family,
           "params": "-" if param is None else f"n_probe={param}",
           "recall": measure.recall_at_k(run.ids, ds.truth[: run.n_queries]),
           "p50_ms": run.p(50), "p99_ms": run.p(99), "queries": run.n_queries, "load": measure.load_avg()}
    measure.RESULTS.append(rec)
    return rec


def n_queries_for(family: str, ds: VectorSet) -> int:
    """Queries to time: the same number for every engine on a dataset (equal work, so
    latency percentiles compare like with like): ``CLAG_BENCH_QUERIES`` (default all 1,000;
    exact scans then take ~92 s per engine at 1M on 2 cores). ``family`` is accepted so a
    caller never has to special-case an engine."""
    del family  # deliberately unused: no engine gets a shorter (cheaper or noisier) run
    limit = int(os.environ.get("CLAG_BENCH_QUERIES", str(len(ds.queries))))
    return max(1, min(len(ds.queries), limit))


# --- soft assignment -------------------------------------------------------------------

ASSIGN_K = 3


def assign_numpy(rows: np.ndarray, centres: np.ndarray, chunk: int = 20_000):
    """Reference soft assignment: chunked matmul + argpartition (top-3 centres per row)."""
    ids = np.empty((len(rows), ASSIGN_K), dtype=np.int64)
    scores = np.empty((len(rows), ASSIGN_K), dtype=np.float32)
    ct = np.ascontiguousarray(centres.T)
    for start in range(0, len(rows), chunk):
        s = rows[start : start + chunk] @ ct
        top = np.argpartition(-s, ASSIGN_K - 1, axis=1)[:, :ASSIGN_K]
        ts = np.take_along_axis(s, top, axis=1)
        order = np.argsort(-ts, axis=1)
        ids[start : start + chunk] = np.take_along_axis(top, order, axis=1)
        scores[start : start + chunk] = np.take_along_axis(ts, order, axis=1)
    return ids, scores


def assign_faiss(rows: np.ndarray, centres: np.ndarray):
    """faiss IndexFlatIP over the centres, batch search with k=3 (BLAS + heaps)."""
    import faiss  # noqa: PLC0415

    faiss.omp_set_num_threads(measure.threads())
    index = faiss.IndexFlatIP(centres.shape[1])
    index.add(np.ascontiguousarray(centres, dtype=np.float32))
    scores, ids = index.search(rows, ASSIGN_K)
    return ids, scores


def assign_clag(index, rows: np.ndarray):
    """clag_fast batched soft assignment against the index's current centres."""
    ids, scores = index.soft_assign(rows, k=ASSIGN_K)
    return np.asarray(ids), np.asarray(scores)


def assignment_inputs(reg: Registry):
    """Rows and centres for the assignment benchmark: the dataset and clag's k-means centres.

    Every implementation returns centre *positions* (0..C-1); clag returns cluster ids,
    mapped to positions through cluster_ids() so the results compare one to one.
    """
    clag = reg.get("clag").index
    return reg.ds.base, np.asarray(clag.centres(), dtype=np.float32), np.asarray(clag.cluster_ids())


def primary_agreement(ids: np.ndarray, ref: np.ndarray) -> float:
    """Fraction of rows (over the prefix both cover) whose best centre equals the reference's."""
    m = min(len(ids), len(ref))
    return float(np.mean(ids[:m, 0] == ref[:m, 0]))


# --- opening a store in a fresh process -------------------------------------------------

_OPEN_SCRIPT = r"""
import json, sys, time
import numpy as np
from clag_fast.index import VectorIndex
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024.0
path, dim = sys.argv[1], int(sys.argv[2])
q = np.load(sys.argv[3])[0]
before = rss()
t0 = time.perf_counter()
idx = VectorIndex.open(path, dim=dim)
open_s = time.perf_counter() - t0
after = rss()
n = len(idx)
t1 = time.perf_counter()
idx.search(q, k=10, n_probe=4)
first_ms = (time.perf_counter() - t1) * 1e3
print(json.dumps({"open_s": open_s, "rss_delta_mb": after - before, "rss_mb": after, "rows": n, "first_query_ms": first_ms}))
"""


def open_in_fresh_process(reg: Registry, runs: int = 5) -> dict:
    """Open the store built for ``reg.ds`` in ``runs`` fresh interpreters (warm page cache).

    Builds the store if needed, then closes this process's handle: a store has one writer,
    and the child opens it as a writer, the way an application would.  Resident memory is measured right after
    open(), before any query (BENCHMARKS.md, Search: the core's targets); the first query is timed separately.
    """
    ds = reg.ds
    reg.get("clag")
    reg.drop("clag")
    path = store_path(ds)
    qfile = cache_dir() / f"{ds.name}_open_query.npy"
    np.save(qfile, ds.queries[:1])
    env = dict(os.environ)
    res = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", _OPEN_SCRIPT, str(path), str(ds.base.shape[1]), str(qfile)],
                             capture_output=True, text=True, env=env, check=False, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"opening {path} failed: {out.stderr.strip()[-2000:]}")
        res.append(json.loads(out.stdout.strip().splitlines()[-1]))
    opens = [r["open_s"] for r in res]
    rec = {"kind": "open", "dataset": ds.name, "rows": res[0]["rows"], "open_s": float(np.median(opens)),
           "open_s_max": max(opens), "rss_delta_mb": float(np.median([r["rss_delta_mb"] for r in res])),
           "rss_mb": float(np.median([r["rss_mb"] for r in res])),
           "first_query_ms": float(np.median([r["first_query_ms"] for r in res])), "runs": runs,
           "load": measure.load_avg()}
    measure.RESULTS.append(rec)
    return rec
