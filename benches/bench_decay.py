"""What decay (``ForgettingPolicy(half_life_days=...)``) costs a search, through ``MemoryStore``.

A store with decay multiplies every scored row's similarity by its weight (strength, age,
accesses). Searches are timed alone and each right after an ``add`` (what a search derives
per row, the eligible rows and the weights, must follow writes at the cost of the rows they
changed, not the store's size). The same store is searched with decay off and on, in alternating blocks of the
same held-out queries (so a noisy spell hits both alike), each block after the opened
store's start-up settled and one untimed pass, through ``MemoryStore.search``
with the defaults; the table gives each side's p50 and their ratio. Data: unit vectors in
1,000 Gaussian blobs (dim 384, spread 1.0), added with ``add_many`` in calls of 10,000, then
``organize()``.

Script: ``python benches/bench_decay.py [--n 1000000] [--rounds 4]``. pytest: ``pytest
benches/bench_decay.py`` runs a 20k store and a pytest-benchmark of the decayed search.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import measure  # noqa: E402
from bench_ingest import Vectors  # noqa: E402

from clag_fast import ForgettingPolicy, MemoryStore, StoreConfig  # noqa: E402

K = 10
BATCH = 10_000
HALF_LIFE_DAYS = 30.0


def build(path: Path, n: int) -> np.ndarray:
    """A store of ``n`` blob vectors at ``path``, organised and closed; returns 300 queries."""
    vecs = Vectors("blobs")
    with MemoryStore.open(path, slm=False, embedder=False) as store:
        for start in range(0, n, BATCH):
            m = min(BATCH, n - start)
            store.add_many([f"m{i}" for i in range(start, start + m)], embeddings=vecs.chunk(start, m))
        store.organize()
    return vecs.chunk(10**7, 300)  # held out: a start no build reaches


def settle(store: MemoryStore, queries: np.ndarray) -> None:
    """Let an opened store finish its start: the open's background thread that builds the
    clusters' int8 member copies (seconds at 1M rows, sharing the cores with the searches
    otherwise), then one untimed pass over the queries."""
    for t in threading.enumerate():
        if t.name == "clag-fast-warm":
            t.join()
    for q in queries:
        store.search(q, k=K)


def config(decay: bool) -> StoreConfig:
    return StoreConfig(forgetting=ForgettingPolicy(half_life_days=HALF_LIFE_DAYS if decay else None))


def run(n: int, rounds: int, root: Path) -> dict:
    path = root / "store"
    queries = build(path, n)
    new_rows = Vectors("blobs").chunk(2 * 10**7, rounds * len(queries))  # one add per query
    times: dict[tuple[bool, bool], list[float]] = {(d, a): [] for d in (False, True) for a in (False, True)}
    added = 0
    for r in range(rounds):
        for decay in (False, True) if r % 2 == 0 else (True, False):
            with MemoryStore.open(path, config=config(decay), slm=False, embedder=False) as store:
                settle(store, queries)
                for q in queries:
                    t0 = time.perf_counter()
                    store.search(q, k=K)
                    times[decay, False].append(time.perf_counter() - t0)
                if r < 2:  # writes: one add, then a search (the first two blocks of each side)
                    for q in queries:
                        store.add(f"added {added}", embedding=new_rows[added % len(new_rows)])
                        added += 1
                        t0 = time.perf_counter()
                        store.search(q, k=K)
                        times[decay, True].append(time.perf_counter() - t0)
    p50 = {key: float(np.median(v)) * 1e3 for key, v in times.items()}
    info = measure.machine()
    return {"n": n, "rounds": rounds, "queries": len(queries), "p50_ms_off": p50[False, False],
            "p50_ms_on": p50[True, False], "ratio": p50[True, False] / p50[False, False],
            "after_add_ms_off": p50[False, True], "after_add_ms_on": p50[True, True],
            "cpu": info.get("cpu"), "nproc": info.get("nproc"), "load": measure.load_avg()}


def table(res: dict) -> str:
    return "\n".join([
        f"# MemoryStore.search with and without decay: {res['n']:,} blob vectors, {res['queries']} queries x "
        f"{res['rounds']} alternating blocks, k={K}; {res['cpu']}, {res['nproc']} cores, load {res['load']}",
        "| search() defaults | p50 ms | p50 ms, each search right after an add |",
        "|---|---:|---:|",
        f"| decay off | {res['p50_ms_off']:.3f} | {res['after_add_ms_off']:.3f} |",
        f"| decay on (half_life_days={HALF_LIFE_DAYS:g}) | {res['p50_ms_on']:.3f} | {res['after_add_ms_on']:.3f} |",
        f"decay on / off: {res['ratio']:.2f}x (searches alone)",
    ])


def test_decayed_search(benchmark, tmp_path) -> None:
    """A 20k store: decay on and off both answer; pytest-benchmark times the decayed search."""
    res = run(20_000, 2, tmp_path)
    print(table(res))
    assert res["p50_ms_on"] > 0 and res["p50_ms_off"] > 0
    with MemoryStore.open(tmp_path / "store", config=config(True), slm=False, embedder=False) as store:
        q = Vectors("blobs").chunk(10**7, 1)[0]
        hits = benchmark(store.search, q, k=K)
        assert len(hits) == K


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=4, help="alternating blocks (even: both sides alike)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        print(table(run(args.n, args.rounds, Path(d))))


if __name__ == "__main__":
    main()
