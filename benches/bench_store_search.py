"""``MemoryStore.search`` through the public API, side by side with what users pick instead.

The search comparison of BENCHMARKS.md (Search): on unit vectors in 1,000 Gaussian blobs (dim 384, spread 1.0; 300
held-out queries drawn the same way), one run measures

- clag_fast: ``MemoryStore.open(d, slm=False, embedder=False)``, ``add_many`` in calls of
  10,000 (ingest rate), ``organize()`` (build s), then single ``search(q, k=10)`` with the
  defaults, with ``n_probe=1/4/8``, with ``mode="flat"``, and ``search_many(Q, k=10)``; the
  same queries through ``store._state.index.search`` (the ``VectorIndex`` underneath, at the
  probe count the default search used and at 1/4/8) so the facade overhead at each probe
  count is a difference of medians;
- faiss ``IndexIVFFlat`` (inner product, as many lists as the store has clusters, trained
  on the data, one OpenMP thread for single queries), nprobe 1/2/4/8/16/32;
- Chroma (``PersistentClient`` in a temp dir, cosine HNSW, defaults) and LanceDB (local
  dir, IVF_HNSW_SQ cosine index, default query settings) with their ingest rates.

How it is timed (a 2-core shared VM, so everything runs in one process, side by side):
- ``cold`` = the first pass over the 300 queries of each config, with no warm-up; the p99
  column is this pass's, so first touches of clusters (or of anything lazily loaded) show
  up as a tail. The store is closed and reopened after ``organize()`` first, so its cold
  pass is a freshly opened store (the OS page cache is warm: we cannot drop it unprivileged).
- ``warm`` = ``--rounds`` further passes, interleaved call by call across every config of
  every engine in a shuffled order per step (so a noisy spell, and the cache another engine
  flushed, hit all configs alike), with back-to-back calls on
  different queries (so no config reads clusters its neighbour just cached); warm p50/p99
  over all of them.
- facade overhead = warm p50 of ``MemoryStore.search`` minus warm p50 of
  ``VectorIndex.search`` doing the same native work (both in the interleaved warm passes):
  for the defaults, the index under the store's own probe rule (adaptive: each query probes
  what the default search probes); for ``n_probe=1/4/8``, the index at that count. The
  defaults are also compared with the index at one fixed count (the last first-pass query's),
  which differs in work per query. The interleaved
  figures include the bench's own conversion of hits to row ids and the caches every other
  configuration evicted between two calls; a third figure times the two calls alone, call
  against call (``paired_facade``: same query back to back, order alternating).
- recall@10 against the exact numpy top-10 (inner product = cosine on unit rows).

Script: ``python benches/bench_store_search.py [--n 200000|1000000] [--out table.json]``
(``--engines clag_fast,faiss,chroma,lancedb`` to choose; ``--record`` puts the store-against-faiss
row in ``benches/results/search.json``, then ``python benches/render.py``). pytest: ``pytest benches`` runs a
tiny version of the whole pipeline (and a pytest-benchmark of ``search``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import measure  # noqa: E402
from vector_sets import DIM, _clustered_chunk, cache_dir, exact_topk  # noqa: E402

from clag_fast import MemoryStore  # noqa: E402

K = 10
SPREAD = 1.0
N_BLOBS = 1_000
N_QUERIES = 300
ADD_BATCH = 10_000
ENGINES = ("clag_fast", "faiss", "chroma", "lancedb")
STORE_PROBES = (1, 4, 8)
FAISS_PROBES = (1, 2, 4, 8, 16, 32)  # 1/4/8/16 asked for; 2 and 32 bracket equal recall
PACKAGES = {"faiss": "faiss-cpu", "chroma": "chromadb"}  # engine -> pip distribution


# -- data ----------------------------------------------------------------------------------
def blobs(n: int, n_queries: int = N_QUERIES, n_blobs: int = N_BLOBS, seed: int = 7,
          cache: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` unit rows around ``n_blobs`` random unit centres (noise norm ~``SPREAD``), the
    held-out queries drawn the same way, and the exact top-``K`` ids of each query.

    Uses vector_sets' chunk generator (seed per 100k chunk, so 200k is a prefix of 1M) and
    caches the arrays under ``cache_dir()`` for reruns.
    """
    tag = f"blobs{n_blobs}_s{SPREAD:g}_seed{seed}"
    root = cache_dir()
    paths = [root / f"{tag}_{n}_base.npy", root / f"{tag}_q{n_queries}.npy", root / f"{tag}_{n}_q{n_queries}_truth.npy"]
    if cache and all(p.exists() for p in paths):
        return tuple(np.load(p) for p in paths)  # type: ignore[return-value]
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_blobs, DIM), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    base = np.empty((n, DIM), np.float32)
    chunk = 100_000
    for i, start in enumerate(range(0, n, chunk)):
        stop = min(n, start + chunk)
        base[start:stop] = _clustered_chunk(centres, stop - start, SPREAD, seed=seed * 1_000 + i)
    queries = _clustered_chunk(centres, n_queries, SPREAD, seed=seed * 1_000 + 999)
    truth = exact_topk(base, queries, K)
    if cache:
        for p, arr in zip(paths, (base, queries, truth)):
            tmp = p.with_suffix(".tmp.npy")
            np.save(tmp, arr)
            tmp.rename(p)
    return base, queries, truth


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean recall@K over queries (found: (q, K) row ids, -1 padded)."""
    return measure.recall_at_k(found, truth)


# -- one row of the table ------------------------------------------------------------------
@dataclass
class Config:
    """One engine configuration: a single-query search function and what it measured."""

    engine: str
    config: str
    search: Callable[[np.ndarray], tuple[np.ndarray, int | None]]  # q -> (row ids, scanned)
    ingest_per_s: float | None = None
    build_s: float | None = None
    cold: list[float] = field(default_factory=list)  # seconds per query, first pass
    warm: list[float] = field(default_factory=list)
    ids: np.ndarray | None = None
    scanned: list[int] = field(default_factory=list)
    note: str = ""

    def run_one(self, i: int, q: np.ndarray, cold: bool) -> None:
        t0 = time.perf_counter_ns()
        ids, scanned = self.search(q)
        t = (time.perf_counter_ns() - t0) * 1e-9
        if cold:
            self.cold.append(t)
            self.ids[i, : min(K, len(ids))] = ids[:K]
            if scanned is not None:
                self.scanned.append(scanned)
        else:
            self.warm.append(t)


def _ms(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q) * 1e3) if xs else None


def row(c: Config, truth: np.ndarray) -> dict:
    """The table row of one config."""
    return {
        "engine": c.engine, "config": c.config,
        "ingest_per_s": None if c.ingest_per_s is None else round(c.ingest_per_s),
        "build_s": None if c.build_s is None else round(c.build_s, 2),
        "p50_ms": _ms(c.cold, 50), "p99_ms": _ms(c.cold, 99),
        "warm_p50_ms": _ms(c.warm, 50), "warm_p99_ms": _ms(c.warm, 99),
        "recall": None if c.ids is None or not c.cold else round(recall(c.ids[: len(c.cold)], truth[: len(c.cold)]), 4),
        "scanned": int(np.median(c.scanned)) if c.scanned else None,
        "note": c.note,
    }


# -- engines -------------------------------------------------------------------------------
class ClagFast:
    """A MemoryStore built with add_many + organize, then closed and reopened."""

    def __init__(self, base: np.ndarray, root: Path) -> None:
        self.path = root / "store"
        n = len(base)
        store = MemoryStore.open(self.path, slm=False, embedder=False)
        t0 = time.perf_counter()
        ids: list[int] = []
        for start in range(0, n, ADD_BATCH):
            stop = min(n, start + ADD_BATCH)
            ids += store.add_many([f"m{i}" for i in range(start, stop)], embeddings=base[start:stop])
        self.ingest_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        store.organize()
        store.flush()  # background re-organisation (if any) finishes before timing starts
        self.build_s = time.perf_counter() - t0
        store.close()
        t0 = time.perf_counter()
        self.store = MemoryStore.open(self.path, slm=False, embedder=False)
        self.open_s = time.perf_counter() - t0
        self.clusters = int(self.store.stats()["clusters"])
        id_arr = np.asarray(ids, np.int64)
        self.row_of_id = np.full(int(id_arr.max()) + 1, -1, np.int64)
        self.row_of_id[id_arr] = np.arange(n)
        self.default_probe: int | None = None

    def search_fn(self, **kw: Any) -> Callable[[np.ndarray], tuple[np.ndarray, int]]:
        store, row_of_id = self.store, self.row_of_id

        def fn(q: np.ndarray) -> tuple[np.ndarray, int]:
            hits = store.search(q, k=K, **kw)
            if kw.get("mode") != "flat" and "n_probe" not in kw:
                self.default_probe = len(hits.clusters_probed)
            return row_of_id[[h.memory_id for h in hits]], hits.scanned

        return fn

    def index_fn(self, n_probe: Callable[[], int]) -> Callable[[np.ndarray], tuple[np.ndarray, int]]:
        index = self.store._state.index  # the VectorIndex under the facade: the facade's cost is the difference

        def fn(q: np.ndarray) -> tuple[np.ndarray, int]:
            res = index.search(q, k=K, n_probe=n_probe())
            # Rows are the vector file's row numbers, in add order (no deletions here).
            return res.ids[0, : int(res.counts[0])], int(res.scanned[0])

        return fn

    def _index_under_rule(self) -> tuple[Any, int, dict[str, Any]]:
        """The store's ``VectorIndex`` and its default probe rule: the cap and the adaptive
        stop's keyword arguments, as ``search()`` with no ``n_probe`` passes them."""
        cap, rule = self.store._searcher.probe_plan(None)
        return self.store._state.index, cap, rule

    def index_rule_fn(self) -> Callable[[np.ndarray], tuple[np.ndarray, int]]:
        """``VectorIndex.search`` under the store's default probe rule (its cap and adaptive
        stop), so each query probes the clusters the default ``search`` probes: the fixed
        count of ``index_fn`` is one query's count, and adaptive probing varies it per query."""
        index, cap, rule = self._index_under_rule()

        def fn(q: np.ndarray) -> tuple[np.ndarray, int]:
            res = index.search(q, k=K, n_probe=cap, **rule)
            return res.ids[0, : int(res.counts[0])], int(res.scanned[0])

        return fn

    def paired_facade(self, queries: np.ndarray, rounds: int) -> dict[str, float]:
        """The facade measured call against call: for every query ``store.search`` and
        ``VectorIndex.search`` under the store's probe rule back to back, their order
        alternating, and only those two calls timed (no conversion of hits to row ids, no
        other configuration in between to evict what they read). Returns both medians and
        their difference."""
        store = self.store
        index, cap, rule = self._index_under_rule()
        t_store: list[int] = []
        t_index: list[int] = []
        clock = time.perf_counter_ns
        for r in range(max(1, rounds)):
            for i, q in enumerate(queries):
                if (i + r) % 2:
                    t0 = clock(); store.search(q, k=K); t1 = clock()
                    index.search(q, k=K, n_probe=cap, **rule); t2 = clock()
                    t_store.append(t1 - t0); t_index.append(t2 - t1)
                else:
                    t0 = clock(); index.search(q, k=K, n_probe=cap, **rule); t1 = clock()
                    store.search(q, k=K); t2 = clock()
                    t_index.append(t1 - t0); t_store.append(t2 - t1)
        s, x = float(np.median(t_store)) * 1e-6, float(np.median(t_index)) * 1e-6
        return {"store_p50_ms": s, "index_p50_ms": x, "overhead_ms": s - x, "calls": len(t_store)}

    def close(self) -> None:
        self.store.close()


def faiss_configs(base: np.ndarray, nlist: int) -> list[Config]:
    import faiss  # noqa: PLC0415 -- bench-only baseline

    t0 = time.perf_counter()
    quantizer = faiss.IndexFlatIP(DIM)
    index = faiss.IndexIVFFlat(quantizer, DIM, nlist, faiss.METRIC_INNER_PRODUCT)
    index.train(base)
    index.add(base)
    build_s = time.perf_counter() - t0
    faiss.omp_set_num_threads(1)  # single queries: one thread, as a user would serve them

    def make(p: int) -> Callable[[np.ndarray], tuple[np.ndarray, None]]:
        def fn(q: np.ndarray) -> tuple[np.ndarray, None]:
            index.nprobe = p
            _, ids = index.search(q[None, :], K)
            return ids[0], None

        return fn

    return [Config("faiss IVFFlat", f"nlist {nlist}, nprobe {p}", make(p), build_s=build_s if p == 1 else None)
            for p in FAISS_PROBES]


def chroma_configs(base: np.ndarray, root: Path) -> list[Config]:
    import chromadb  # noqa: PLC0415 -- bench-only baseline

    client = chromadb.PersistentClient(path=str(root / "chroma"))
    col = client.create_collection("bench", metadata={"hnsw:space": "cosine"})
    batch = min(ADD_BATCH, int(client.get_max_batch_size()))
    n = len(base)
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        stop = min(n, start + batch)
        col.add(ids=[str(i) for i in range(start, stop)], embeddings=base[start:stop])
    ingest = n / (time.perf_counter() - t0)

    def fn(q: np.ndarray) -> tuple[np.ndarray, None]:
        res = col.query(query_embeddings=q[None, :], n_results=K, include=[])
        return np.asarray([int(i) for i in res["ids"][0]], np.int64), None

    return [Config("Chroma", f"HNSW cosine, defaults (add batch {batch})", fn, ingest_per_s=ingest,
                   note="build is part of ingest")]


def lancedb_configs(base: np.ndarray, root: Path) -> list[Config]:
    import lancedb  # noqa: PLC0415 -- bench-only baseline
    import pyarrow as pa  # noqa: PLC0415

    db = lancedb.connect(str(root / "lance"))
    n = len(base)

    def batch(start: int, stop: int) -> pa.Table:
        vec = pa.FixedSizeListArray.from_arrays(pa.array(base[start:stop].ravel(), pa.float32()), DIM)
        return pa.table({"id": pa.array(np.arange(start, stop), pa.int64()), "vector": vec})

    t0 = time.perf_counter()
    tbl = None
    for start in range(0, n, ADD_BATCH):
        data = batch(start, min(n, start + ADD_BATCH))
        if tbl is None:
            tbl = db.create_table("bench", data=data)
        else:
            tbl.add(data)
    ingest = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    index_type = "IVF_HNSW_SQ"
    try:
        from lancedb.index import IvfHnswSq  # noqa: PLC0415 -- the config API (lancedb >= 0.2x)

        tbl.create_index("vector", config=IvfHnswSq(distance_type="cosine"))
    except (ImportError, TypeError):
        tbl.create_index(metric="cosine", vector_column_name="vector", index_type=index_type)
    build_s = time.perf_counter() - t0

    def fn(q: np.ndarray) -> tuple[np.ndarray, None]:
        res = tbl.search(q, vector_column_name="vector").distance_type("cosine").limit(K).select(["id", "_distance"]).to_arrow()
        return res.column("id").to_numpy(), None

    return [Config("LanceDB", f"{index_type} cosine, default query", fn, ingest_per_s=ingest, build_s=build_s)]


# -- the run -------------------------------------------------------------------------------
def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def run(n: int, engines: tuple[str, ...] = ENGINES, rounds: int = 3, n_queries: int = N_QUERIES,
        n_blobs: int = N_BLOBS, cache: bool = True, log: Callable[[str], None] = print) -> dict:
    """Build every engine on the same ``n`` rows and time them side by side; the result dict
    holds the table rows, the machine, library versions and the date."""
    t0 = time.perf_counter()
    base, queries, truth = blobs(n, n_queries, n_blobs, cache=cache)
    log(f"data: {n:,} rows x {DIM}, {n_blobs} blobs, spread {SPREAD}, {len(queries)} queries "
        f"({time.perf_counter() - t0:.1f} s incl. ground truth)")
    configs: list[Config] = []
    failures: dict[str, str] = {}
    extra: dict[str, Any] = {}
    root = Path(tempfile.mkdtemp(prefix="clag_store_search_", dir=os.environ.get("CLAG_BENCH_TMP")))
    cf = None
    try:
        # clag_fast first: the faiss list count follows the store's cluster count.
        if "clag_fast" in engines:
            log("clag_fast: add_many + organize ...")
            cf = ClagFast(base, root)
            extra["clag_fast"] = {"clusters": cf.clusters, "open_s": round(cf.open_s, 3)}
            log(f"clag_fast: ingest {n / cf.ingest_s:,.0f}/s, organize {cf.build_s:.1f} s, "
                f"{cf.clusters} clusters, reopen {cf.open_s:.3f} s")
            default = Config("clag_fast", "search() defaults", cf.search_fn(), ingest_per_s=n / cf.ingest_s,
                             build_s=cf.build_s)
            configs.append(default)
            configs += [Config("clag_fast", f"search(n_probe={p})", cf.search_fn(n_probe=p)) for p in STORE_PROBES]
            configs.append(Config("clag_fast", 'search(mode="flat")', cf.search_fn(mode="flat")))
        nlist = cf.clusters if cf is not None and cf.clusters > 0 else N_BLOBS
        builders: list[tuple[str, Callable[[], list[Config]]]] = [
            ("faiss", lambda: faiss_configs(base, nlist)),
            ("chroma", lambda: chroma_configs(base, root)),
            ("lancedb", lambda: lancedb_configs(base, root)),
        ]
        for name, build in builders:
            if name not in engines:
                continue
            log(f"{name}: building ...")
            try:
                made = build()
            except Exception as exc:  # noqa: BLE001 -- a missing/broken baseline is reported, not faked
                failures[name] = f"{type(exc).__name__}: {exc}"
                log(f"{name}: FAILED to build: {failures[name]}")
                traceback.print_exc()
                continue
            configs += made
            c = made[0]
            log(f"{name}: ingest {_f(c.ingest_per_s, ',.0f')}/s, build {_f(c.build_s, '.1f')} s")
        for c in configs:
            c.ids = np.full((len(queries), K), -1, np.int64)

        # Cold pass: each config's first 300 queries, no warm-up. The store's default config
        # goes first, on the freshly reopened store, before any other config touches it.
        for c in configs:
            try:
                for i, q in enumerate(queries):
                    c.run_one(i, q, cold=True)
            except Exception as exc:  # noqa: BLE001
                c.note = f"FAILED: {type(exc).__name__}: {exc}"
                failures[f"{c.engine} {c.config}"] = c.note
                log(f"{c.engine} {c.config}: {c.note}")
        live = [c for c in configs if not c.note.startswith("FAILED")]

        facade: dict[str, Any] = {}
        unders: dict[int | str, Config] = {}
        if cf is not None and cf.default_probe:
            # The VectorIndex underneath at the default's probe count and at each explicit one:
            # facade overhead = store p50 - index p50 at the same probe count.
            for probe in dict.fromkeys((cf.default_probe, *STORE_PROBES)):
                under = Config("clag_fast", f"VectorIndex.search(n_probe={probe})", cf.index_fn(lambda p=probe: p))
                under.ids = np.full((len(queries), K), -1, np.int64)
                for i, q in enumerate(queries):
                    under.run_one(i, q, cold=True)
                unders[probe] = under
            rule = Config("clag_fast", "VectorIndex.search(store's probe rule)", cf.index_rule_fn())
            rule.ids = np.full((len(queries), K), -1, np.int64)
            for i, q in enumerate(queries):
                rule.run_one(i, q, cold=True)
            unders["rule"] = rule
            at = len([c for c in configs if c.engine == "clag_fast"])
            configs[at:at] = list(unders.values())
            live = [c for c in configs if not c.note.startswith("FAILED")]

        # Warm passes, interleaved call by call over every config. Config j takes query
        # (i + j * stride) at step i, so back-to-back calls never share a query: otherwise a
        # config would find the clusters its neighbour just read still in cache (n_probe=4 right
        # after n_probe=1 on the same query measured faster than n_probe=1 itself). The order
        # of configs is shuffled at every step (seeded), so each config follows every other one
        # alike: a rotation kept the neighbours fixed, and the store's defaults, listed first,
        # always ran right after Chroma's cache-flushing HNSW walk (0.38 ms against 0.18 ms for
        # n_probe=1, which scans the same rows).
        nq, nc = len(queries), len(live)
        stride = max(1, nq // nc)
        order_rng = np.random.default_rng(5)
        log(f"warm: {rounds} rounds x {nq} queries x {nc} configs, interleaved ...")
        for r in range(rounds):
            for i in range(nq):
                for j in order_rng.permutation(nc).tolist():
                    qi = (i + j * stride) % nq
                    live[j].run_one(qi, queries[qi], cold=False)

        if cf is not None and cf.default_probe:
            store_at = {cf.default_probe: configs[0]}
            store_at.update({p: c for p, c in zip(STORE_PROBES, configs[1:1 + len(STORE_PROBES)])
                             if p not in store_at})
            # "rule": the defaults against the index under the same probe rule (same clusters
            # per query); the first entry compares them at one query's fixed count.
            store_at["rule"] = configs[0]
            facade = {str(p): {"store": f.config, "index": unders[p].config,
                               "store_warm_p50_ms": _ms(f.warm, 50),
                               "index_warm_p50_ms": _ms(unders[p].warm, 50),
                               "overhead_ms": _ms(f.warm, 50) - _ms(unders[p].warm, 50)}
                      for p, f in store_at.items()}
            extra["facade_paired"] = cf.paired_facade(queries, rounds)
            # Where the first-pass tail sits: the slowest first-pass queries of the defaults.
            cold = np.asarray(configs[0].cold)
            slow = np.argsort(-cold)[:5]
            extra["cold_tail_defaults"] = [{"query": int(i), "ms": round(float(cold[i]) * 1e3, 3)} for i in slow]
        rows = [row(c, truth) for c in configs]

        if cf is not None:
            # search_many: one native call for all queries; per-query time = total / q.
            store, times = cf.store, []
            for _ in range(max(1, rounds)):
                t0 = time.perf_counter()
                out = store.search_many(queries, k=K)
                times.append(time.perf_counter() - t0)
            found = np.full((len(queries), K), -1, np.int64)
            for i, hits in enumerate(out):
                r_ids = cf.row_of_id[[h.memory_id for h in hits]]
                found[i, : len(r_ids)] = r_ids[:K]
            per_q = float(np.median(times)) / len(queries) * 1e3
            rows.insert(len([c for c in configs if c.engine == "clag_fast"]), {
                "engine": "clag_fast", "config": f"search_many({len(queries)} queries)",
                "ingest_per_s": None, "build_s": None, "p50_ms": None, "p99_ms": None,
                "warm_p50_ms": per_q, "warm_p99_ms": None, "recall": round(recall(found, truth), 4),
                "scanned": int(np.median([h.scanned for h in out])),
                "note": f"median of {len(times)} batch calls / {len(queries)} (ms per query, all cores)"})
    finally:
        if cf is not None:
            cf.close()
        shutil.rmtree(root, ignore_errors=True)

    info = measure.machine()
    versions = {p: _version(p) for p in ("clag_fast", "faiss-cpu", "chromadb", "lancedb", "pylance", "numpy")}
    return {
        "n": n, "dim": DIM, "blobs": n_blobs, "spread": SPREAD, "queries": len(queries), "k": K,
        "rounds": rounds, "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu": info.get("cpu"), "nproc": info.get("nproc"), "python": info.get("python"),
                    "load": measure.load_avg()},
        "versions": versions, "rows": rows, "facade": facade, "failures": failures, **extra,
    }


def _f(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(result: dict) -> str:
    """The printed table (markdown), with the machine, versions and date above it."""
    m, v = result["machine"], result["versions"]
    lines = [
        f"# MemoryStore.search vs peers: {result['n']:,} x {result['dim']} unit vectors, {result['blobs']} blobs "
        f"(spread {result['spread']}), {result['queries']} held-out queries, k={result['k']}",
        f"# {result['date']}; {m['cpu']}, {m['nproc']} cores, Python {m['python']}, load {m['load']}",
        "# " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"# p50/p99: first pass over the queries, no warm-up; warm: {result['rounds']} more passes, "
        "interleaved call by call across all configs (neighbouring calls on different queries)",
        "",
        "| engine | config | ingest/s | build s | p50 ms | p99 ms | warm p50 ms | warm p99 ms | recall@10 | scanned |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['engine']} | {r['config']} | {_f(r['ingest_per_s'], ',.0f')} | {_f(r['build_s'], '.2f')} | "
            f"{_f(r['p50_ms'], '.3f')} | {_f(r['p99_ms'], '.3f')} | {_f(r['warm_p50_ms'], '.3f')} | "
            f"{_f(r['warm_p99_ms'], '.3f')} | {_f(r['recall'], '.4f')} | {_f(r['scanned'], ',d')} |")
    lines.append("")
    for p, fa in (result.get("facade") or {}).items():
        at = "under the store's probe rule" if p == "rule" else f"at n_probe {p}"
        lines.append(f"facade overhead {at} (warm p50 {fa['store']} - {fa.get('index', 'VectorIndex.search')}): "
                     f"{fa['overhead_ms']:.3f} ms ({fa['store_warm_p50_ms']:.3f} vs {fa['index_warm_p50_ms']:.3f})")
    if result.get("facade_paired"):
        fp = result["facade_paired"]
        lines.append(f"facade overhead call against call (search() defaults vs VectorIndex.search under the "
                     f"store's probe rule, same query back to back, order alternating, {fp['calls']} pairs; "
                     f"p50 of each): {fp['overhead_ms']:.3f} ms ({fp['store_p50_ms']:.3f} vs {fp['index_p50_ms']:.3f})")
    if result.get("cold_tail_defaults"):
        lines.append("slowest first-pass queries of search() defaults (query #: ms): " + ", ".join(
            f"#{t['query']}: {t['ms']:.2f}" for t in result["cold_tail_defaults"]))
    lines += _verdicts(result)
    for name, why in result["failures"].items():
        lines.append(f"FAILED {name}: {why}")
    return "\n".join(lines)


def _verdicts(result: dict) -> list[str]:
    """The search targets in words: equal-recall ratio to faiss, p99/p50, lead over peers."""
    rows = result["rows"]
    out = []
    d = next((r for r in rows if r["engine"] == "clag_fast" and r["config"] == "search() defaults"), None)
    if d is None or d["recall"] is None:
        return out
    out.append(f"clag_fast defaults: recall {d['recall']:.4f}, p99/p50 (first pass) = {d['p99_ms'] / d['p50_ms']:.2f}")
    faiss_rows = [r for r in rows if r["engine"] == "faiss IVFFlat" and r["recall"] is not None]
    # Equal recall: the cheapest faiss nprobe that recalls at least as much as the store config.
    fast = min((r for r in rows if r["engine"] == "clag_fast" and r["config"].startswith("search(")
                and r["recall"] is not None and r["recall"] >= 0.95 and r["warm_p50_ms"]),
               key=lambda r: r["warm_p50_ms"], default=None)
    for s in dict.fromkeys(x["config"] for x in (d, fast) if x is not None):
        c = next(r for r in rows if r["engine"] == "clag_fast" and r["config"] == s)
        match = next((r for r in faiss_rows if r["recall"] >= c["recall"]), None)
        if match is not None:
            out.append(f"equal recall: clag_fast {s} ({c['recall']:.4f}) vs faiss {match['config']} "
                       f"({match['recall']:.4f}): warm p50 {c['warm_p50_ms']:.3f} / {match['warm_p50_ms']:.3f} = "
                       f"{c['warm_p50_ms'] / match['warm_p50_ms']:.2f}x (first pass: "
                       f"{c['p50_ms'] / match['p50_ms']:.2f}x)")
    for peer in ("Chroma", "LanceDB"):
        p = next((r for r in rows if r["engine"] == peer and r["warm_p50_ms"]), None)
        if p is not None:
            out.append(f"vs {peer}: its warm p50 is {p['warm_p50_ms'] / d['warm_p50_ms']:.2f}x clag_fast defaults', "
                       f"recall {p['recall']:.4f}" + (f"; clag_fast ingests {d['ingest_per_s'] / p['ingest_per_s']:.2f}x "
                                                      "its rate" if p["ingest_per_s"] else ""))
    return out


def recorded_cells(result: dict) -> dict[str, str]:
    """The ``search/store`` row of BENCHMARKS.md from a run of clag_fast and faiss: the
    defaults against the cheapest faiss IVFFlat that recalls as much, the first-pass tail, the
    facade call against call and ``search_many``."""
    rows = result["rows"]
    d = next((r for r in rows if r["engine"] == "clag_fast" and r["config"] == "search() defaults"), None)
    match = None if d is None or d["recall"] is None else next(
        (r for r in rows if r["engine"] == "faiss IVFFlat" and r["recall"] is not None and r["recall"] >= d["recall"]), None)
    if match is None:
        raise ValueError("recording needs the store's defaults and a faiss IVFFlat row at equal recall "
                         "(--engines clag_fast,faiss)")
    many = next((r for r in rows if r["engine"] == "clag_fast" and r["config"].startswith("search_many(")), None)
    paired = result.get("facade_paired")
    n = result["n"]
    return {"memories": f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1_000}k",
            "recall@10": f"{d['recall']:.4f}",
            "warm p50 ms": f"{d['warm_p50_ms']:.3f}",
            "faiss IVFFlat at equal recall": f"{match['config']} ({match['recall']:.4f}): {match['warm_p50_ms']:.3f}",
            "ratio": f"{d['warm_p50_ms'] / match['warm_p50_ms']:.2f}x",
            "first-pass p99/p50": f"{d['p99_ms'] / d['p50_ms']:.2f}",
            "facade ms": "-" if not paired else f"{paired['overhead_ms']:.3f} (call against call)",
            "search_many ms/query": "-" if many is None else f"{many['warm_p50_ms']:.3f}"}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000, help="base rows (200000; 1000000 is slower)")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma list of {', '.join(ENGINES)}")
    ap.add_argument("--rounds", type=int, default=3, help="warm passes after the first one")
    ap.add_argument("--queries", type=int, default=N_QUERIES)
    ap.add_argument("--out", type=Path, help="write the table as JSON here")
    ap.add_argument("--record", action="store_true",
                    help="put the result in benches/results/search.json (needs clag_fast and faiss; "
                         "then python benches/render.py)")
    args = ap.parse_args(argv)
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        ap.error(f"unknown engines {bad}; expected some of {ENGINES}")
    if args.record and not {"clag_fast", "faiss"} <= set(engines):
        ap.error("--record compares the store with faiss: --engines must hold clag_fast and faiss")
    result = run(args.n, engines, args.rounds, args.queries, log=lambda s: print(s, flush=True))
    print()
    print(table(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"\nJSON written to {args.out}")
    if args.record:
        import record  # noqa: PLC0415 -- only when recording

        cells = recorded_cells(result)
        print(f"recorded search/store {record.record('search', 'store', cells['memories'], cells)}")


# -- pytest: the whole pipeline at a tiny size -------------------------------------------
def test_store_search_tiny(benchmark, tmp_path) -> None:
    """2,000 rows, 20 queries, every engine that is installed; then a pytest-benchmark of
    one default ``search`` on a store of the same rows."""
    engines = tuple(e for e in ENGINES if e == "clag_fast" or _version(PACKAGES.get(e, e)) != "absent")
    result = run(2_000, engines, rounds=1, n_queries=20, n_blobs=20, cache=False, log=lambda s: None)
    text = table(result)
    assert "search() defaults" in text
    d = result["rows"][0]
    assert d["recall"] is not None and d["recall"] > 0.5, text
    assert not {k: v for k, v in result["failures"].items() if k.startswith("clag_fast")}, text
    base, queries, _ = blobs(2_000, 20, 20, cache=False)
    with MemoryStore.open(tmp_path / "s", slm=False, embedder=False) as store:
        store.add_many([f"m{i}" for i in range(len(base))], embeddings=base)
        store.organize()
        hits = benchmark(store.search, queries[0], k=K)
        assert len(hits) == K


if __name__ == "__main__":
    main()
