"""One suite, three backends: every test runs against an in-process ``MemoryStore``, against
``clag_fast.connect`` and against ``clag_fast.connect_async`` to a ``clag-fast serve`` child
process, with the same calls and the same expected results and exceptions (the client's
promise: change one line)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import clag_fast
from clag_fast.config import StoreConfig
from clag_fast.results import ClusterInfo, Hit, Hits, Memory
from clag_fast.store import MemoryStore
from service_helpers import ServiceProcess
from store_helpers import DIM, topic_vectors

_counter = itertools.count()


class _Blocking:
    """The async client driven from a test: each coroutine method runs to completion on an
    event loop in another thread, so the same test body runs against it."""

    def __init__(self, url: str) -> None:
        import asyncio
        import threading

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.client = clag_fast.connect_async(url)

    def __getattr__(self, name):
        import asyncio

        method = getattr(self.client, name)
        return lambda *a, **kw: asyncio.run_coroutine_threadsafe(method(*a, **kw), self._loop).result()

    def close(self) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.client.aclose(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()


@pytest.fixture(scope="module", params=["memory_store", "client", "async_client"])
def backend(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "store"
    if request.param == "memory_store":
        store = MemoryStore.open(path, config=StoreConfig(slm="off"), embedder=False, slm=False)
        yield store
        store.close()
    else:
        with ServiceProcess(path) as service:
            client = clag_fast.connect(service.url) if request.param == "client" else _Blocking(service.url)
            yield client
            client.close()


@pytest.fixture
def ns():
    """A fresh namespace per test: the backends are shared by the module's tests."""
    return f"t{next(_counter)}"


def vecs(n, seed=0):
    return topic_vectors(n, 3, seed=seed)[0]


def test_add_then_get_roundtrips_every_field(backend, ns):
    v = vecs(1)
    mid = backend.add("the user likes tea", kind="fact", namespace=ns, metadata={"src": "chat", "n": 3},
                      embedding=v[0])
    m = backend.get(mid)
    assert isinstance(m, Memory)
    assert (m.memory_id, m.text, m.kind, m.namespace, m.metadata) == (mid, "the user likes tea", "fact", ns,
                                                                      {"src": "chat", "n": 3})
    assert m.archived is False and m.access_count == 0


def test_add_many_returns_ids_in_order_and_search_finds_each(backend, ns):
    v = vecs(20, seed=1)
    ids = backend.add_many([f"memory {i}" for i in range(20)], embeddings=v, namespaces=ns)
    assert len(ids) == 20 and len(set(ids)) == 20 and ids == sorted(ids)
    for i in (0, 7, 19):
        hits = backend.search(v[i], k=3, namespace=ns)
        assert isinstance(hits, Hits) and all(isinstance(h, Hit) for h in hits)
        assert hits[0].memory_id == ids[i] and hits[0].text == f"memory {i}"
        assert hits[0].score == pytest.approx(1.0, abs=1e-4)
        assert hits.candidates == 20 and len(hits) == 3


def test_search_many_matches_search(backend, ns):
    v = vecs(12, seed=2)
    ids = backend.add_many([f"m{i}" for i in range(12)], embeddings=v, namespaces=ns)
    many = backend.search_many(v[:4], k=2, namespace=ns, mode="flat")
    assert [h[0].memory_id for h in many] == ids[:4]
    one = backend.search(v[2], k=2, namespace=ns, mode="flat")
    assert [h.memory_id for h in one] == [h.memory_id for h in many[2]]
    assert backend.search_many(np.empty((0, DIM), np.float32), k=2) == []


def test_namespace_filter_and_kind_filter(backend, ns):
    v = vecs(4, seed=3)
    a = backend.add_many(["a0", "a1"], embeddings=v[:2], namespaces=ns, kinds=["x", "y"])
    backend.add_many(["b0", "b1"], embeddings=v[2:], namespaces=ns + "-other")
    hits = backend.search(v[2], k=10, namespace=ns)
    assert {h.memory_id for h in hits} == set(a)
    hits = backend.search(v[0], k=10, namespace=ns, kind="y")
    assert [h.memory_id for h in hits] == [a[1]]


def test_update_text_metadata_and_vector(backend, ns):
    v = vecs(3, seed=4)
    ids = backend.add_many(["one", "two", "three"], embeddings=v, namespaces=ns)
    backend.update(ids[0], metadata={"edited": True})
    assert backend.get(ids[0]).metadata == {"edited": True}
    backend.update(ids[0], text="one, rewritten", embedding=v[2])
    m = backend.get(ids[0])
    assert m.text == "one, rewritten" and m.memory_id == ids[0]
    top = backend.search(v[2], k=2, namespace=ns, mode="flat")
    assert {h.memory_id for h in top} == {ids[0], ids[2]}


def test_delete_and_unknown_ids(backend, ns):
    v = vecs(2, seed=5)
    ids = backend.add_many(["keep", "drop"], embeddings=v, namespaces=ns)
    backend.delete(ids[1])
    with pytest.raises(KeyError):
        backend.get(ids[1])
    with pytest.raises(KeyError):
        backend.delete(ids[1])
    with pytest.raises(KeyError):
        backend.get(10**12)
    assert backend.get(ids[0]).text == "keep"
    assert [h.memory_id for h in backend.search(v[1], k=5, namespace=ns)] == [ids[0]]


def test_delete_namespace(backend, ns):
    v = vecs(3, seed=6)
    backend.add_many(["x", "y", "z"], embeddings=v, namespaces=ns)
    assert backend.delete_namespace(ns) == 3
    assert len(backend.search(v[0], k=5, namespace=ns)) == 0


@pytest.mark.parametrize("call, exc", [
    (lambda s, v: s.search(v[0], k=0), ValueError),
    (lambda s, v: s.search(v[0], k=5, mode="sideways"), ValueError),
    (lambda s, v: s.search(v[0][:10], k=5), ValueError),
    (lambda s, v: s.search(np.full(DIM, np.nan, np.float32), k=5), ValueError),
    (lambda s, v: s.add("   ", embedding=v[0]), ValueError),
    (lambda s, v: s.add("text", embedding=v[0][:7]), ValueError),
    (lambda s, v: s.add("text", embedding=np.full(DIM, np.inf, np.float32)), ValueError),
    (lambda s, v: s.add_many("not a list", embeddings=v[:1]), TypeError),
    (lambda s, v: s.add_many(["a", 3], embeddings=v[:2]), TypeError),
    (lambda s, v: s.add_many(["a", "b"], embeddings=v[:1]), ValueError),
    (lambda s, v: s.get("12"), TypeError),
    (lambda s, v: s.update(1), ValueError),
    (lambda s, v: s.search_many("one string", k=1), TypeError),
    (lambda s, v: s.add("text", embedding=v[0], metadata="not a dict"), TypeError),
    (lambda s, v: s.add("text", embedding=v[0], metadata={"when": object()}), ValueError),
    (lambda s, v: s.add("text", embedding=v[0], metadata={"x": float("nan")}), ValueError),
])
def test_bad_arguments_raise_what_memory_store_raises(backend, call, exc):
    v = vecs(1, seed=7)
    n = backend.stats()["memories"]
    with pytest.raises(exc):
        call(backend, v)
    assert backend.stats()["memories"] == n  # nothing written


def test_text_needs_an_embedder(backend, ns):
    """Both backends here bring their own vectors: a text add is refused the same way."""
    with pytest.raises(ValueError, match="embedder=False"):
        backend.add("no vector given", namespace=ns)


def test_stats_and_clusters_after_organize(backend, ns):
    v, _ = topic_vectors(300, 4, seed=8)
    before = backend.stats()["memories"]
    backend.add_many([f"c{i}" for i in range(300)], embeddings=v, namespaces=ns)
    assert backend.stats()["memories"] == before + 300
    report = backend.organize()
    assert isinstance(report, dict)
    clusters = backend.clusters()
    assert clusters and all(isinstance(c, ClusterInfo) for c in clusters)
    assert sum(c.size for c in clusters) >= before + 300
    assert [c.size for c in clusters] == sorted((c.size for c in clusters), reverse=True)
    hits = backend.search(v[0], k=5, namespace=ns)
    assert hits.mode == "two_stage" and hits[0].cluster_id is not None


def test_keys_upsert_get_update_delete(backend, ns):
    v = vecs(3, seed=9)
    first = backend.add("v1 of the note", key="note", namespace=ns, embedding=v[0])
    again = backend.add("v2 of the note", key="note", namespace=ns, embedding=v[0])
    assert again == first
    m = backend.get(key="note", namespace=ns)
    assert (m.memory_id, m.text, m.key) == (first, "v2 of the note", "note")
    backend.update(key="note", namespace=ns, metadata={"v": 2})
    assert backend.get(first).metadata == {"v": 2}
    ids = backend.add_many(["a", "b"], embeddings=v[1:], namespaces=ns, keys=["ka", "kb"])
    assert [m.memory_id for m in backend.get_many(keys=["kb", "missing", "ka"], namespace=ns)] == [ids[1], ids[0]]
    assert backend.search(v[1], k=1, namespace=ns)[0].key == "ka"
    backend.delete(key="ka", namespace=ns)
    with pytest.raises(KeyError):
        backend.get(key="ka", namespace=ns)
    assert backend.delete_many(keys=["kb", "nope"], namespace=ns) == 1
    assert backend.delete_many([first, 10**9]) == 1
    with pytest.raises(ValueError):
        backend.add("bad key", key="", namespace=ns, embedding=v[0])


def test_where_filters_in_search_and_listing(backend, ns):
    v = vecs(6, seed=10)
    ids = backend.add_many([f"w{i}" for i in range(6)], embeddings=v, namespaces=ns,
                           metadata=[{"n": i, "tag": "even" if i % 2 == 0 else "odd"} for i in range(6)])
    hits = backend.search(v[1], k=6, namespace=ns, where={"tag": "even"})
    assert {h.memory_id for h in hits} == {ids[0], ids[2], ids[4]}
    hits = backend.search_many(v[:1], k=6, namespace=ns, where={"n": {"$gte": 4}})[0]
    assert {h.memory_id for h in hits} == {ids[4], ids[5]}
    page = backend.memories(namespace=ns, where={"$or": [{"n": 1}, {"n": {"$in": [3, 5]}}]})
    assert [m.memory_id for m in page.items] == [ids[1], ids[3], ids[5]]
    with pytest.raises(ValueError, match=r"\$near"):
        backend.search(v[0], k=3, namespace=ns, where={"n": {"$near": 3}})


def test_listing_pages_through_a_namespace(backend, ns):
    v = vecs(25, seed=11)
    ids = backend.add_many([f"p{i}" for i in range(25)], embeddings=v, namespaces=ns)
    seen, cursor = [], None
    while True:
        page = backend.memories(namespace=ns, limit=10, cursor=cursor)
        assert len(page.items) <= 10
        seen += [m.memory_id for m in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ids
    assert ns in backend.namespaces()
    with pytest.raises(ValueError):
        backend.memories(namespace=ns, cursor="not-a-cursor")


@pytest.mark.parametrize("name", ["add", "add_many", "search", "search_many", "get", "get_many", "update",
                                  "delete", "delete_many", "delete_namespace", "memories", "namespaces",
                                  "clusters", "forget", "stats", "flush", "close"])
def test_the_client_has_memory_stores_signatures(name):
    import inspect

    store_params = inspect.signature(getattr(MemoryStore, name)).parameters
    client_params = inspect.signature(getattr(clag_fast.Client, name)).parameters
    async_params = inspect.signature(getattr(clag_fast.AsyncClient, "aclose" if name == "close" else name)).parameters
    assert list(client_params) == list(store_params)
    assert list(async_params) == list(store_params)
    for p in store_params.values():
        assert client_params[p.name].kind == p.kind and client_params[p.name].default == p.default


def test_namespaces_with_slashes(backend, ns):
    v = vecs(2, seed=12)
    backend.add_many(["s0", "s1"], embeddings=v, namespaces=f"{ns}/sub dir")
    assert f"{ns}/sub dir" in backend.namespaces()
    assert backend.delete_namespace(f"{ns}/sub dir") == 2
    assert f"{ns}/sub dir" not in backend.namespaces()


def test_add_many_takes_one_namespace_for_the_batch(backend, ns):
    v = vecs(3, seed=21)
    ids = backend.add_many(["a", "b", "c"], embeddings=v, namespace=ns)
    assert [m.namespace for m in backend.get_many(ids)] == [ns] * 3
    assert backend.search(v[1], k=1, namespace=ns)[0].memory_id == ids[1]
    n = backend.stats()["memories"]
    with pytest.raises(ValueError, match="not both"):
        backend.add_many(["d"], embeddings=v[:1], namespace=ns, namespaces=[ns])
    assert backend.stats()["memories"] == n


def test_conversations_through_every_backend(backend, ns):
    """Threads, turns, speakers and updates are written and read back alike through the store
    and the service; a hit carries its neighbouring turns and its newer version."""
    v = vecs(5, seed=21)
    ids = backend.add_many([f"turn {i} of the talk" for i in range(4)], embeddings=v[:4], namespace=ns,
                           thread="talk", turns=[1, 2, 3, 4], speakers=["Ann", "Bob", "Ann", "Bob"])
    new = backend.add("turn 2, corrected", embedding=v[4], namespace=ns, thread="talk", turn=5, supersedes=ids[1])
    m = backend.get(ids[1])
    assert (m.thread, m.turn, m.speaker, m.superseded_by) == ("talk", 2.0, "Bob", new)
    hits = backend.search(v[1], k=5, namespace=ns, context=1)
    by_id = {h.memory_id: h for h in hits}
    assert [h.memory_id for h in hits].index(new) < [h.memory_id for h in hits].index(ids[1])
    assert by_id[ids[1]].superseded_by == new
    assert [(t.offset, t.memory_id, t.speaker) for t in by_id[ids[2]].context] == [(-1, ids[1], "Bob"), (1, ids[3], "Bob")]
    past = backend.search(v[1], k=5, namespace=ns, as_of=backend.get(ids[3]).created_at)
    assert new not in [h.memory_id for h in past]
    with pytest.raises((ValueError, clag_fast.ServiceError), match="turns|turn"):
        backend.add_many(["x"], embeddings=v[:1], namespace=ns, turns=[float("nan")])
    with pytest.raises((KeyError, clag_fast.ServiceError), match="supersedes"):
        backend.add("y", embedding=v[0], namespace=ns, supersedes=10 ** 9)
