"""Search and add p50 through each framework adapter vs ``MemoryStore`` on the same store.

For each adapter (LangChain, LangGraph, LlamaIndex, mem0, A-MEM) a store of ``--n`` memories
is written through the adapter (clustered unit vectors, ``--dim`` wide, short texts), then the
same ``--queries`` queries are run through the adapter and straight on its ``MemoryStore``
(same k, namespace, kind and scope filter the adapter applies, same search mode), alternating
query by query so both see the same machine state. Embedding is a table lookup (texts and
queries map to precomputed vectors), and the direct search embeds its query the way the
adapter does (through the same LangChain ``Embeddings`` / LangGraph embed function, or the
list LlamaIndex puts in ``query_embedding``, or the store's embedder for mem0 / A-MEM), so
the ratio is the adapter's own cost: result conversion, filters and bookkeeping. The
retrieval cache is off (``cache_size=0``) so every search runs.

Adds: ``--add-batches`` batches of ``--add-size`` new items written through the adapter's own
write call (``add_texts``, a ``batch`` of ``PutOp``, ``add`` of ``TextNode``s, mem0's ``add``,
A-MEM's ``add_note`` one note at a time) vs ``add_many`` (``add`` for A-MEM) of the same texts
with new keys, in the adapter's namespace and embedded the same way, alternating batch by batch.

    PYTHONPATH=python .venv/bin/python benches/bench_adapters.py --n 10000 --queries 300
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from clag_fast import StoreConfig

K = 10


class Table:
    """Texts and queries -> precomputed vectors (an embedder whose cost is a dict lookup)."""

    name = "bench-table"

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.vectors: dict[str, np.ndarray] = {}

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts]).astype(np.float32)


def data(n: int, q: int, dim: int) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((max(1, n // 100), dim))
    which = rng.integers(0, len(centres), n)
    vecs = centres[which] + 0.6 * rng.standard_normal((n, dim))
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    texts = [f"memory {i} about topic {which[i]} with word w{rng.integers(0, 500)}" for i in range(n)]
    qi = rng.integers(0, n, q)
    qvecs = vecs[qi] + 0.3 * rng.standard_normal((q, dim))
    qvecs /= np.linalg.norm(qvecs, axis=1, keepdims=True)
    queries = [f"question {j} about topic {which[qi[j]]}" for j in range(q)]
    return texts, vecs.astype(np.float32), queries, qvecs.astype(np.float32)


def add_data(batches: int, size: int, vecs: np.ndarray) -> list[tuple[list[str], np.ndarray]]:
    """``batches`` batches of ``size`` new texts (unique across batches), their vectors near
    stored ones (so they join existing clusters, as new memories of the same topics do)."""
    rng = np.random.default_rng(11)
    out = []
    for b in range(batches):
        near = rng.integers(0, len(vecs), size)
        # Noise of norm ~0.3 around a unit vector (per coordinate 0.3 / sqrt(dim)): cosine ~0.96.
        v = vecs[near] + (0.3 / np.sqrt(vecs.shape[1])) * rng.standard_normal((size, vecs.shape[1])).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        out.append(([f"added note {b}.{i} near memory {near[i]}" for i in range(size)], v.astype(np.float32)))
    return out


def p50_pair(adapter: Callable[[int], object], direct: Callable[[int], object], q: int,
             warm: range | None = None) -> tuple[float, float]:
    """Median seconds of ``adapter(j)`` and ``direct(j)`` over j < q, alternated (and the
    order flipped every call), after warm-up calls of each on ``warm`` (default: the first 20
    j; writes pass indices past q, so no measured write repeats one)."""
    for j in warm if warm is not None else range(min(q, 20)):
        adapter(j)
        direct(j)
    ta, td = [], []
    for j in range(q):
        pair = [(adapter, ta), (direct, td)]
        for fn, out in (pair if j % 2 == 0 else pair[::-1]):
            t0 = time.perf_counter()
            fn(j)
            out.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(td)


class Workload:
    """What every adapter bench runs: the store's texts, the queries, the add batches."""

    def __init__(self, texts, vecs, queries, qvecs, adds, cfg) -> None:
        self.texts, self.vecs, self.queries, self.qvecs, self.adds, self.cfg = texts, vecs, queries, qvecs, adds, cfg
        self.table = {**dict(zip(texts, vecs)), **dict(zip(queries, qvecs)),
                      **{t: v for ts, vs in adds for t, v in zip(ts, vs)}}
        self.n_adds = len(adds) - 2  # the last two batches warm up

    def lookup(self) -> Table:
        table = Table(self.vecs.shape[1])
        table.vectors = self.table
        return table

    def run(self, search_pair: tuple, add_pair: tuple) -> dict[str, tuple[float, float]]:
        search = p50_pair(*search_pair, len(self.queries))  # first: the adds grow the store
        adds = (p50_pair(*add_pair, self.n_adds, warm=range(self.n_adds, self.n_adds + 2)) if self.n_adds
                else (float("nan"), float("nan")))  # --add-batches 0: searches only
        return {"search": search, "add": adds}


def bench_langchain(root: Path, w: Workload) -> dict[str, tuple[float, float]]:
    from langchain_core.embeddings import Embeddings

    from clag_fast.integrations.langchain import ClagVectorStore

    table = w.table

    class Lookup(Embeddings):
        def embed_documents(self, ts):
            return [table[t].tolist() for t in ts]

        def embed_query(self, t):
            return table[t].tolist()

    vs = ClagVectorStore(Lookup(), path=root / "lc", config=w.cfg)
    texts = w.texts
    for i in range(0, len(texts), 2000):
        vs.add_texts(texts[i:i + 2000], [{"i": j} for j in range(i, min(i + 2000, len(texts)))],
                     ids=[f"d{j}" for j in range(i, min(i + 2000, len(texts)))])
    store, emb, ns = vs.store, vs.embedding, vs.collection_name
    metas = [[{"i": i} for i in range(len(ts))] for ts, _ in w.adds]

    def direct_add(b):
        ts = w.adds[b][0]
        store.add_many(ts, embeddings=np.asarray(emb.embed_documents(ts), np.float32), namespaces=ns,
                       metadata=[dict(m) for m in metas[b]], keys=[f"s{b}.{i}" for i in range(len(ts))])

    try:
        return w.run((lambda j: vs.similarity_search_with_score(w.queries[j], k=K),
                      lambda j: store.search(emb.embed_query(w.queries[j]), K, namespace=ns, mode=vs.search_mode)),
                     (lambda b: vs.add_texts(w.adds[b][0], metas[b], ids=[f"a{b}.{i}" for i in range(len(metas[b]))]),
                      direct_add))
    finally:
        vs.close()


def bench_langgraph(root: Path, w: Workload) -> dict[str, tuple[float, float]]:
    from langgraph.store.base import PutOp

    from clag_fast.integrations.langgraph import KIND, ClagStore

    table = w.table
    index = {"dims": w.vecs.shape[1], "embed": lambda ts: [table[t].tolist() for t in ts], "fields": ["text"]}
    lg = ClagStore(index=index, path=root / "lg", config=w.cfg)
    texts = w.texts
    for i in range(0, len(texts), 2000):
        lg.batch([PutOp(("docs", "u1"), f"d{j}", {"text": texts[j], "i": j}) for j in range(i, min(i + 2000, len(texts)))])
    store, emb = lg.store, lg.embeddings

    def direct_add(b):
        ts = w.adds[b][0]
        store.add_many(ts, embeddings=np.asarray(emb.embed_documents(ts), np.float32), kinds=KIND,
                       namespaces="docs.u1", metadata=[{"text": t, "i": i} for i, t in enumerate(ts)],
                       keys=[f"s{b}.{i}" for i in range(len(ts))])

    try:  # the adapter searches its items' vectors only: the store kind KIND
        return w.run((lambda j: lg.search(("docs", "u1"), query=w.queries[j], limit=K),
                      lambda j: store.search(emb.embed_query(w.queries[j]), K, namespace="docs.u1", kind=KIND,
                                             mode=lg.search_mode)),
                     (lambda b: lg.batch([PutOp(("docs", "u1"), f"a{b}.{i}", {"text": t, "i": i})
                                          for i, t in enumerate(w.adds[b][0])]),
                      direct_add))
    finally:
        lg.close()


def bench_llamaindex(root: Path, w: Workload) -> dict[str, tuple[float, float]]:
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.types import VectorStoreQuery

    from clag_fast.integrations.llamaindex import ClagVectorStore

    vs = ClagVectorStore(path=root / "li", config=w.cfg)
    texts, vecs = w.texts, w.vecs
    for i in range(0, len(texts), 2000):
        vs.add([TextNode(text=texts[j], id_=f"n{j}", metadata={"i": j}, embedding=vecs[j].tolist())
                for j in range(i, min(i + 2000, len(texts)))])
    store = vs.client
    qlists = [v.tolist() for v in w.qvecs]
    # Nodes arrive embedded (lists of floats), built before the clock starts; the direct add
    # gets the same texts, lists and metadata.
    nodes = [[TextNode(text=t, id_=f"a{b}.{i}", metadata={"i": i}, embedding=v.tolist())
              for i, (t, v) in enumerate(zip(ts, vs_))] for b, (ts, vs_) in enumerate(w.adds)]
    lists = [[v.tolist() for v in vs_] for _, vs_ in w.adds]

    def direct_add(b):
        ts = w.adds[b][0]
        store.add_many(ts, embeddings=np.asarray(lists[b], np.float32), namespaces=vs.namespace,
                       metadata=[{"i": i} for i in range(len(ts))], keys=[f"s{b}.{i}" for i in range(len(ts))])

    try:
        return w.run((lambda j: vs.query(VectorStoreQuery(query_embedding=qlists[j], similarity_top_k=K)),
                      lambda j: store.search(qlists[j], K, namespace=vs.namespace, mode=vs.search_mode)),
                     (lambda b: vs.add(nodes[b]), direct_add))
    finally:
        vs.close()


def bench_mem0(root: Path, w: Workload) -> dict[str, tuple[float, float]]:
    from clag_fast.compat.mem0 import Memory

    m = Memory(path=root / "m0", config=w.cfg, embedder=w.lookup())
    texts = w.texts
    for i in range(0, len(texts), 2000):
        m.add([{"role": "user", "content": t} for t in texts[i:i + 2000]], user_id="u1", infer=False)
    store = m.store

    def direct_add(b):
        # mem0 ids are uuid4 strings, so the direct add keys its memories that way too: random
        # keys cost the store's key index more than sequential ones (~1.7 ms per 100 here).
        ts = w.adds[b][0]
        store.add_many(ts, namespaces=m.namespace, metadata=[{"user_id": "u1"} for _ in ts],
                       keys=[str(uuid.uuid4()) for _ in ts])

    try:
        return w.run((lambda j: m.search(w.queries[j], user_id="u1", limit=K),
                      lambda j: store.search(w.queries[j], K, namespace=m.namespace, where={"user_id": "u1"})),
                     (lambda b: m.add([{"role": "user", "content": t} for t in w.adds[b][0]], user_id="u1",
                                      infer=False),
                      direct_add))
    finally:
        m.close()


def bench_amem(root: Path, w: Workload) -> dict[str, tuple[float, float]]:
    from clag_fast.compat.amem import AgenticMemorySystem

    a = AgenticMemorySystem(path=root / "am", config=w.cfg, embedder=w.lookup())
    store = a.store
    texts, vecs = w.texts, w.vecs
    for i in range(0, len(texts), 2000):  # add_note writes one by one; the bench fills in batches
        chunk = range(i, min(i + 2000, len(texts)))
        store.add_many([texts[j] for j in chunk], embeddings=vecs[list(chunk)], namespaces=a.namespace,
                       metadata=[{"tags": [], "context": "General"} for _ in chunk], keys=[f"a{j}" for j in chunk])

    def adapter_add(b):
        for t in w.adds[b][0]:
            a.add_note(t)

    def direct_add(b):  # A-MEM note ids are uuid4 strings too (see bench_mem0)
        for t in w.adds[b][0]:
            store.add(t, key=str(uuid.uuid4()), namespace=a.namespace)

    try:
        return w.run((lambda j: a.search(w.queries[j], k=K),
                      lambda j: store.search(w.queries[j], K, namespace=a.namespace, lexical_weight=0.0)),
                     (adapter_add, direct_add))
    finally:
        a.close()


BENCHES = {"langchain": bench_langchain, "langgraph": bench_langgraph, "llamaindex": bench_llamaindex,
           "mem0": bench_mem0, "amem": bench_amem}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--add-batches", type=int, default=30)
    ap.add_argument("--add-size", type=int, default=100)
    ap.add_argument("--only", nargs="*", choices=sorted(BENCHES))
    args = ap.parse_args(argv)
    texts, vecs, queries, qvecs = data(args.n, args.queries, args.dim)
    adds = add_data(args.add_batches + 2, args.add_size, vecs)
    w = Workload(texts, vecs, queries, qvecs, adds, StoreConfig(cache_size=0, slm="off"))
    print(f"n={args.n} dim={args.dim} queries={args.queries} k={K}; adds: {args.add_batches} batches of "
          f"{args.add_size}")
    print(f"{'adapter':<11} {'search p50 ms':>14} {'store ms':>9} {'ratio':>6}   "
          f"{'add p50 ms':>11} {'store ms':>9} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as d:
        for name in args.only or BENCHES:
            r = BENCHES[name](Path(d), w)
            (sa, sd), (aa, ad) = r["search"], r["add"]
            print(f"{name:<11} {sa * 1e3:>14.3f} {sd * 1e3:>9.3f} {sa / sd:>6.2f}   "
                  f"{aa * 1e3:>11.2f} {ad * 1e3:>9.2f} {aa / ad:>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
