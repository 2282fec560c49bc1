"""Search p50 through each framework adapter vs ``MemoryStore.search`` on the same store.

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

    PYTHONPATH=python .venv/bin/python benches/bench_adapters.py --n 10000 --queries 300
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
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


def p50_pair(adapter: Callable[[int], object], direct: Callable[[int], object], q: int) -> tuple[float, float]:
    """Median seconds of ``adapter(j)`` and ``direct(j)`` over queries j, alternated (and the
    order flipped every query)."""
    for j in range(min(q, 20)):  # warm-up
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


def bench_langchain(root: Path, texts, vecs, queries, qvecs, cfg) -> tuple[float, float]:
    from langchain_core.embeddings import Embeddings

    from clag_fast.integrations.langchain import ClagVectorStore

    table = {**dict(zip(texts, vecs)), **dict(zip(queries, qvecs))}

    class Lookup(Embeddings):
        def embed_documents(self, ts):
            return [table[t].tolist() for t in ts]

        def embed_query(self, t):
            return table[t].tolist()

    vs = ClagVectorStore(Lookup(), path=root / "lc", config=cfg)
    for i in range(0, len(texts), 2000):
        vs.add_texts(texts[i:i + 2000], [{"i": j} for j in range(i, min(i + 2000, len(texts)))],
                     ids=[f"d{j}" for j in range(i, min(i + 2000, len(texts)))])
    store, emb = vs.store, vs.embedding
    try:
        return p50_pair(lambda j: vs.similarity_search_with_score(queries[j], k=K),
                        lambda j: store.search(emb.embed_query(queries[j]), K, namespace=vs.collection_name,
                                               mode=vs.search_mode), len(queries))
    finally:
        vs.close()


def bench_langgraph(root: Path, texts, vecs, queries, qvecs, cfg) -> tuple[float, float]:
    from clag_fast.integrations.langgraph import KIND, ClagStore

    table = {**dict(zip(texts, vecs)), **dict(zip(queries, qvecs))}
    index = {"dims": vecs.shape[1], "embed": lambda ts: [table[t].tolist() for t in ts], "fields": ["text"]}
    lg = ClagStore(index=index, path=root / "lg", config=cfg)
    from langgraph.store.base import PutOp

    for i in range(0, len(texts), 2000):
        lg.batch([PutOp(("docs", "u1"), f"d{j}", {"text": texts[j], "i": j}) for j in range(i, min(i + 2000, len(texts)))])
    store, emb = lg.store, lg.embeddings
    try:  # the adapter searches its items' vectors only: the store kind KIND
        return p50_pair(lambda j: lg.search(("docs", "u1"), query=queries[j], limit=K),
                        lambda j: store.search(emb.embed_query(queries[j]), K, namespace="docs.u1", kind=KIND,
                                               mode=lg.search_mode), len(queries))
    finally:
        lg.close()


def bench_llamaindex(root: Path, texts, vecs, queries, qvecs, cfg) -> tuple[float, float]:
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.types import VectorStoreQuery

    from clag_fast.integrations.llamaindex import ClagVectorStore

    vs = ClagVectorStore(path=root / "li", config=cfg)
    for i in range(0, len(texts), 2000):
        vs.add([TextNode(text=texts[j], id_=f"n{j}", metadata={"i": j}, embedding=vecs[j].tolist())
                for j in range(i, min(i + 2000, len(texts)))])
    store = vs.client
    qlists = [v.tolist() for v in qvecs]
    try:
        return p50_pair(lambda j: vs.query(VectorStoreQuery(query_embedding=qlists[j], similarity_top_k=K)),
                        lambda j: store.search(qlists[j], K, namespace=vs.namespace, mode=vs.search_mode),
                        len(queries))
    finally:
        vs.close()


def bench_mem0(root: Path, texts, vecs, queries, qvecs, cfg) -> tuple[float, float]:
    from clag_fast.compat.mem0 import Memory

    table = Table(vecs.shape[1])
    table.vectors.update(zip(texts, vecs))
    table.vectors.update(zip(queries, qvecs))
    m = Memory(path=root / "m0", config=cfg, embedder=table)
    for i in range(0, len(texts), 2000):
        m.add([{"role": "user", "content": t} for t in texts[i:i + 2000]], user_id="u1", infer=False)
    store = m.store
    try:
        return p50_pair(lambda j: m.search(queries[j], user_id="u1", limit=K),
                        lambda j: store.search(queries[j], K, namespace=m.namespace, where={"user_id": "u1"}),
                        len(queries))
    finally:
        m.close()


def bench_amem(root: Path, texts, vecs, queries, qvecs, cfg) -> tuple[float, float]:
    from clag_fast.compat.amem import AgenticMemorySystem

    table = Table(vecs.shape[1])
    table.vectors.update(zip(texts, vecs))
    table.vectors.update(zip(queries, qvecs))
    a = AgenticMemorySystem(path=root / "am", config=cfg, embedder=table)
    store = a.store
    for i in range(0, len(texts), 2000):  # add_note writes one by one; the bench fills in batches
        chunk = range(i, min(i + 2000, len(texts)))
        store.add_many([texts[j] for j in chunk], embeddings=vecs[list(chunk)], namespaces=a.namespace,
                       metadata=[{"tags": [], "context": "General"} for _ in chunk], keys=[f"a{j}" for j in chunk])
    try:
        return p50_pair(lambda j: a.search(queries[j], k=K),
                        lambda j: store.search(queries[j], K, namespace=a.namespace, lexical_weight=0.0),
                        len(queries))
    finally:
        a.close()


BENCHES = {"langchain": bench_langchain, "langgraph": bench_langgraph, "llamaindex": bench_llamaindex,
           "mem0": bench_mem0, "amem": bench_amem}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--only", nargs="*", choices=sorted(BENCHES))
    args = ap.parse_args(argv)
    texts, vecs, queries, qvecs = data(args.n, args.queries, args.dim)
    cfg = StoreConfig(cache_size=0, slm="off")
    print(f"n={args.n} dim={args.dim} queries={args.queries} k={K}")
    print(f"{'adapter':<11} {'adapter p50 ms':>15} {'store p50 ms':>13} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as d:
        for name in args.only or BENCHES:
            adapter, direct = BENCHES[name](Path(d), texts, vecs, queries, qvecs, cfg)
            print(f"{name:<11} {adapter * 1e3:>15.3f} {direct * 1e3:>13.3f} {adapter / direct:>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
