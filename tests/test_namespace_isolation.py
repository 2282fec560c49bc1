"""Namespace isolation under metadata filters: ``search(..., namespace="a", where={...})``
returns memories of "a" only, whatever the path: one query (vector or text, flat, two-stage,
hybrid), a batch (``search_many``), listing, the filter cache carried across writes, the
service (its hot path and its routes, with and without a tenant key) and the adapters that
keep their collections in namespaces (LangChain, LlamaIndex, LangGraph, mem0).

Every namespace holds the same texts, vectors and metadata, so a memory of another namespace
ties with the right one: any leak shows up among the hits."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

import clag_fast
from clag_fast import MemoryStore, StoreConfig
from clag_fast.eval.embedders import HashingEmbedder, LookupEmbedder
from service_helpers import ServiceProcess
from store_helpers import topic_vectors
from test_filters import ref

NAMESPACES = ("a", "b", "ab")  # "ab" starts with "a": a prefix match would leak it
TOPICS = ["tea", "trains", "rain"]
TEXTS = [f"note {i} about {TOPICS[i % 3]} and the weekend plans" for i in range(60)]
METAS = [{"n": i % 6, "topic": TOPICS[i % 3], "even": i % 2 == 0} for i in range(60)]
WHERES = [
    {"topic": "tea"},
    {"n": {"$gte": 3}},
    {"n": {"$lt": 2}, "even": True},
    {"$or": [{"topic": "rain"}, {"n": {"$in": [0, 1]}}]},
    {"topic": {"$ne": "trains"}},
    {"n": {"$nin": [5]}},
]
CFG = StoreConfig(min_memories_to_cluster=30, organize_every=0, slm="off", cache_size=0)


def matching(ids: list[int], where: dict) -> set[int]:
    """Of one namespace's ``ids`` (in the order of METAS), those ``where`` matches."""
    return {m for m, meta in zip(ids, METAS) if ref(meta, where)}


def rows(where: dict) -> list[int]:
    """The indices into TEXTS / METAS that ``where`` matches."""
    return [i for i, meta in enumerate(METAS) if ref(meta, where)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = MemoryStore.open(tmp_path_factory.mktemp("iso") / "s", config=CFG, embedder=HashingEmbedder(), slm=False)
    ids = {ns: s.add_many(TEXTS, namespaces=ns, metadata=METAS) for ns in NAMESPACES}
    s.organize()
    assert len(s.clusters()) > 1
    yield s, ids
    s.close()


def check(hits, expected: set[int], k: int) -> None:
    got = [h.memory_id for h in hits]
    assert set(got) <= expected, f"hits outside the namespace's matches: {sorted(set(got) - expected)}"
    assert len(got) == min(k, len(expected))


@pytest.mark.parametrize("where", WHERES + [None])
@pytest.mark.parametrize("mode", ["flat", "two_stage"])
def test_one_query_stays_in_its_namespace(store, where, mode):
    s, ids = store
    for ns in NAMESPACES:
        expected = matching(ids[ns], where or {})
        qvec = HashingEmbedder().encode([TEXTS[7]])[0]
        for query in (qvec, TEXTS[7], "tea weekend"):  # a vector; texts: hybrid
            for k in (3, 100):
                hits = s.search(query, k=k, namespace=ns, where=where, mode=mode)
                check(hits, expected, k)
                assert all(h.namespace == ns for h in hits)
        assert s.search(qvec, k=100, namespace=ns, where=where, mode="flat").candidates == len(expected)


@pytest.mark.parametrize("where", WHERES + [None])
def test_a_batch_stays_in_its_namespace(store, where):
    s, ids = store
    queries = [TEXTS[1], "rain weekend", TEXTS[30]]
    for ns in NAMESPACES:
        expected = matching(ids[ns], where or {})
        for mode in ("flat", "two_stage"):
            for batch in (queries, HashingEmbedder().encode(queries)):
                for hits in s.search_many(batch, k=8, namespace=ns, where=where, mode=mode):
                    check(hits, expected, 8)


@pytest.mark.parametrize("where", WHERES)
def test_listing_stays_in_its_namespace(store, where):
    s, ids = store
    for ns in NAMESPACES:
        page = s.memories(namespace=ns, where=where, limit=1000)
        assert [m.memory_id for m in page.items] == sorted(matching(ids[ns], where))


def test_the_filter_cache_keeps_namespaces_apart_across_writes(tmp_path):
    """Masks of namespace filters are carried across writes with the written rows
    recomputed: rows written to another namespace must not join them."""
    with MemoryStore.open(tmp_path / "s", config=CFG, embedder=HashingEmbedder(), slm=False) as s:
        a = s.add_many(TEXTS, namespaces="a", metadata=METAS)
        s.add_many(TEXTS, namespaces="ab", metadata=METAS)
        s.organize()
        where = {"topic": "tea"}
        for _ in range(3):
            check(s.search(TEXTS[0], k=100, namespace="a", mode="flat"), set(a), 100)
            check(s.search(TEXTS[0], k=100, namespace="a", where=where, mode="flat"), matching(a, where), 100)
            # Writes to the other namespace (new rows, an upsert, a delete), then the same searches.
            b = s.add_many(TEXTS[:6], namespaces="ab", metadata=METAS[:6], keys=[f"k{i}" for i in range(6)])
            s.update(b[0], metadata={"topic": "tea", "n": 0})
            s.delete(b[1])
        moved = s.add("note about tea", namespace="a", metadata={"topic": "tea"})
        check(s.search(TEXTS[0], k=200, namespace="a", where=where, mode="flat"), matching(a, where) | {moved}, 200)
        assert all(m.namespace == "a" for m in s.memories(namespace="a", where=where, limit=1000).items)


def test_the_cluster_a_texts_words_point_at_adds_only_eligible_members(tmp_path):
    """Two-stage hybrid search also scans the cluster of the best lexical match when it was not
    probed; that cluster holds the other namespace's copies and rows the filter excludes, at
    cosines as good as the probed ones'. None of them may join the candidates."""
    topics, per = 30, 10
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((topics, 384)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    noise = rng.standard_normal((topics * per, 384)).astype(np.float32) / np.sqrt(384)
    vecs = np.repeat(centres, per, axis=0) + noise
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    texts = [("zeppelin " if i == 0 else "") + f"memory {i % per} of topic {i // per}" for i in range(topics * per)]
    metas = [{"n": i % per} for i in range(topics * per)]
    cfg = StoreConfig(min_memories_to_cluster=30, organize_every=0, slm="off", cache_size=0,
                      target_cluster_size=2 * per, max_cluster_size=8 * per)
    for mix in (0.5, 0.52):  # the query between topic 0 (its word's) and topic 20 (probed)
        q = mix * centres[0] + (1 - mix) * centres[20]
        q /= np.linalg.norm(q)
        embedder = LookupEmbedder(["zeppelin trip"], q[None, :])
        with MemoryStore.open(tmp_path / f"s{mix}", config=cfg, embedder=embedder, slm=False) as s:
            for ns in ("a", "b"):
                s.add_many(texts, embeddings=vecs, namespaces=ns, metadata=metas)
            s.organize()
            hits = s.search("zeppelin trip", k=5, namespace="a", where={"n": {"$lt": 5}}, n_probe=1)
            assert hits.mode == "two_stage" and len(hits.clusters_probed) == 2  # probed + the word's cluster
            assert len(hits) == 5 and hits[0].text.startswith("zeppelin")
            assert all(h.namespace == "a" and h.metadata["n"] < 5 for h in hits), [
                (h.namespace, h.metadata) for h in hits]


# -- the service ----------------------------------------------------------------------------
KEY_A = "iso-key-a-0123456789abc"
KEY_ADMIN = "iso-admin-0123456789abc"
KEYS = f"""
[[keys]]
name = "a"
key = "{KEY_A}"
write = ["a"]

[[keys]]
name = "admin"
key = "{KEY_ADMIN}"
admin = true
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("iso-service")
    (root / "keys.toml").write_text(KEYS)
    vecs, _ = topic_vectors(60, 3, seed=3)
    with ServiceProcess(root / "store", keys=root / "keys.toml") as svc:
        admin = clag_fast.connect(svc.url, api_key=KEY_ADMIN)
        ids = {ns: admin.add_many(TEXTS, embeddings=vecs, namespaces=ns, metadata=METAS) for ns in NAMESPACES}
        admin.organize()
        yield svc, admin, ids, vecs
        admin.close()


@pytest.mark.parametrize("where", WHERES)
def test_the_service_keeps_namespaces_apart(service, where):
    svc, admin, ids, vecs = service
    for ns in NAMESPACES:
        expected = matching(ids[ns], where)
        for mode in ("flat", "two_stage"):
            check(admin.search(vecs[4], k=50, namespace=ns, where=where, mode=mode), expected, 50)
            for hits in admin.search_many(vecs[:3], k=6, namespace=ns, where=where, mode=mode):
                check(hits, expected, 6)
            # The raw request, as the hot path answers it.
            r = httpx.post(svc.url + "/v1/search", headers={"X-API-Key": KEY_ADMIN},
                           json={"vector": vecs[4].tolist(), "k": 50, "namespace": ns, "where": where, "mode": mode})
            assert r.status_code == 200, r.text
            got = {h["memory_id"] for h in r.json()["hits"]}
            assert got <= expected and len(got) == min(50, len(expected))
        page = admin.memories(namespace=ns, where=where, limit=1000)
        assert [m.memory_id for m in page.items] == sorted(expected)


def test_concurrent_searches_of_several_namespaces_stay_apart(service):
    """The service coalesces concurrent searches with the same options into one batch: ones
    that differ only in their namespace must not share a batch's namespace."""
    from concurrent.futures import ThreadPoolExecutor

    svc, _, ids, vecs = service
    where = WHERES[1]
    asked = [(NAMESPACES[i % 3], i % 5) for i in range(48)]

    def one(item):
        ns, q = item
        r = httpx.post(svc.url + "/v1/search", headers={"X-API-Key": KEY_ADMIN},
                       json={"vector": vecs[q].tolist(), "k": 5, "namespace": ns, "where": where})
        assert r.status_code == 200, r.text
        return ns, {h["memory_id"] for h in r.json()["hits"]}

    for _ in range(3):
        with ThreadPoolExecutor(16) as pool:
            for ns, got in pool.map(one, asked):
                assert got <= matching(ids[ns], where) and len(got) == 5, ns


@pytest.mark.parametrize("where", WHERES[:3])
def test_a_tenant_key_without_a_namespace_sees_its_own(service, where):
    svc, _, ids, vecs = service
    a = clag_fast.connect(svc.url, api_key=KEY_A)
    try:
        expected = matching(ids["a"], where)
        check(a.search(vecs[4], k=50, where=where), expected, 50)
        for hits in a.search_many(vecs[:3], k=6, where=where):
            check(hits, expected, 6)
        r = httpx.post(svc.url + "/v1/search", headers={"X-API-Key": KEY_A},
                       json={"vector": vecs[4].tolist(), "k": 50, "where": where})
        assert r.status_code == 200, r.text
        got = {h["memory_id"] for h in r.json()["hits"]}
        assert got <= expected and len(got) == min(50, len(expected))
    finally:
        a.close()


# -- the adapters ---------------------------------------------------------------------------
@pytest.fixture
def shared(tmp_path):
    s = MemoryStore.open(tmp_path / "shared", config=CFG, embedder=HashingEmbedder(), slm=False)
    yield s
    s.close()


def test_langchain_collections_stay_apart(shared):
    pytest.importorskip("langchain_core")
    from langchain_core.embeddings import Embeddings

    from clag_fast.integrations.langchain import ClagVectorStore

    class Hashing(Embeddings):
        def embed_documents(self, texts):
            return HashingEmbedder().encode(list(texts)).tolist()

        def embed_query(self, text):
            return self.embed_documents([text])[0]

    stores = {ns: ClagVectorStore(Hashing(), store=shared, collection_name=ns) for ns in NAMESPACES}
    for ns, vs in stores.items():
        vs.add_texts(TEXTS, metadatas=METAS, ids=[f"{ns}-{i}" for i in range(len(TEXTS))])
    for ns, vs in stores.items():
        for where in WHERES:
            want = {f"{ns}-{i}" for i in rows(where)}
            docs = vs.similarity_search(TEXTS[5], k=100, filter=where)
            assert {d.id for d in docs} == want
            picked = vs.max_marginal_relevance_search(TEXTS[5], k=5, fetch_k=100, filter=where)
            assert {d.id for d in picked} <= want and len(picked) == min(5, len(want))
        docs = vs.similarity_search(TEXTS[5], k=100, filter=lambda d: d.metadata["topic"] == "tea")
        assert {d.id for d in docs} == {f"{ns}-{i}" for i, m in enumerate(METAS) if m["topic"] == "tea"}


def test_llamaindex_namespaces_stay_apart(shared):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.types import (FilterOperator, MetadataFilter, MetadataFilters,
                                                      VectorStoreQuery)

    from clag_fast.integrations.llamaindex import ClagVectorStore

    vecs = HashingEmbedder().encode(TEXTS)
    stores = {ns: ClagVectorStore(store=shared, namespace=ns) for ns in NAMESPACES}
    for ns, vs in stores.items():
        vs.add([TextNode(text=t, id_=f"{ns}-{i}", metadata=dict(m), embedding=vecs[i].tolist())
                for i, (t, m) in enumerate(zip(TEXTS, METAS))])
    cases = [
        (MetadataFilters(filters=[MetadataFilter(key="topic", value="tea")]), {"topic": "tea"}),
        (MetadataFilters(filters=[MetadataFilter(key="n", value=3, operator=FilterOperator.GTE)]), {"n": {"$gte": 3}}),
    ]
    for ns, vs in stores.items():
        for filters, where in cases:
            want = {f"{ns}-{i}" for i in rows(where)}
            res = vs.query(VectorStoreQuery(query_embedding=vecs[5].tolist(), similarity_top_k=100, filters=filters))
            assert set(res.ids) == want
            assert {n.node_id for n in vs.get_nodes(filters=filters)} == want


def test_langgraph_namespaces_stay_apart(tmp_path):
    pytest.importorskip("langgraph")
    from adapter_helpers import LG_INDEX
    from clag_fast.integrations.langgraph import ClagStore

    lg = ClagStore(index=LG_INDEX, path=tmp_path / "lg")
    try:
        for ns in NAMESPACES:
            for i, (t, m) in enumerate(zip(TEXTS, METAS)):
                lg.put((ns,), f"k{i}", {"text": t, **m})
        for ns in NAMESPACES:
            for where in WHERES[:3]:
                want = {f"k{i}" for i in rows(where)}
                found = lg.search((ns,), query=TEXTS[5], filter=where, limit=100)
                assert {it.key for it in found} == want and {it.namespace for it in found} == {(ns,)}
    finally:
        lg.close()


def test_mem0_namespaces_stay_apart(shared):
    from clag_fast.compat.mem0 import Memory

    mems = {ns: Memory(shared, namespace=ns) for ns in NAMESPACES}
    for ns, m in mems.items():
        for t, meta in zip(TEXTS, METAS):
            m.add(t, user_id="u1", metadata={"topic": meta["topic"], "n": meta["n"]}, infer=False)
    for ns, m in mems.items():
        want = {t for t, meta in zip(TEXTS, METAS) if meta["topic"] == "tea"}
        got = m.search("tea weekend", filters={"user_id": "u1", "topic": "tea"}, limit=100)["results"]
        assert {r["memory"] for r in got} == want
        listed = m.get_all(filters={"user_id": "u1", "n": {"gte": 3}}, limit=100)["results"]
        assert len(listed) == sum(meta["n"] >= 3 for meta in METAS)
        ids = {r["id"] for r in got}
        others = {r["id"] for o, mm in mems.items() if o != ns
                  for r in mm.search("tea weekend", filters={"user_id": "u1", "topic": "tea"}, limit=100)["results"]}
        assert not ids & others
