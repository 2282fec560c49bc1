"""``memories()`` (paged listing by id with namespace / kind / cluster / where filters) and
``namespaces()``."""

from __future__ import annotations

import pytest

from clag_fast import MemoryPage, MemoryStore, StoreConfig
from store_helpers import topic_vectors

CFG = StoreConfig(min_memories_to_cluster=40, organize_every=0, slm="off")


@pytest.fixture
def store(tmp_path):
    vecs, _ = topic_vectors(230, 5, seed=2)
    s = MemoryStore.open(tmp_path / "s", config=CFG, embedder=False, slm=False)
    s.add_many([f"m{i}" for i in range(230)], embeddings=vecs,
               namespaces=[["a", "b", "c"][i % 3] for i in range(230)],
               kinds=["fact" if i % 5 == 0 else "user_input" for i in range(230)],
               metadata=[{"i": i, "even": i % 2 == 0} for i in range(230)],
               keys=[f"k{i}" for i in range(230)])
    yield s
    s.close()


def pages(s: MemoryStore, **kw) -> list[list[int]]:
    out, cursor = [], None
    while True:
        page = s.memories(cursor=cursor, **kw)
        assert isinstance(page, MemoryPage)
        out.append([m.memory_id for m in page.items])
        cursor = page.next_cursor
        if cursor is None:
            return out
        assert isinstance(cursor, str)


def test_pages_cover_everything_once_in_id_order(store):
    got = pages(store, limit=50)
    assert [len(p) for p in got] == [50, 50, 50, 50, 30]
    flat = [m for p in got for m in p]
    assert flat == sorted(flat) and len(set(flat)) == 230 == len(store)
    assert pages(store, limit=230) == [flat]  # an exact fit has no further page
    first = store.memories(limit=3).items
    assert [m.text for m in first] == ["m0", "m1", "m2"] and first[0].key == "k0"
    assert first[1].metadata == {"i": 1, "even": False} and first[1].namespace == "b"


def test_filters_combine(store):
    ids = [m for p in pages(store, namespace="a", kind="fact", where={"even": True}, limit=7) for m in p]
    expected = [store.get(key=f"k{i}", namespace="a").memory_id for i in range(230)
                if i % 3 == 0 and i % 5 == 0 and i % 2 == 0]
    assert ids == expected
    assert store.memories(namespace="nope").items == []
    assert store.memories(where={"i": {"$gte": 228}}).items[0].text == "m228"


def test_cluster_lists_its_primary_members(store):
    store.organize()
    clusters = store.clusters()
    assert clusters
    seen = []
    for c in clusters:
        items = [m for p in pages(store, cluster=c.id, limit=25) for m in p]
        assert len(items) == c.size
        assert all(store.get(m).cluster_id == c.id for m in items)
        seen += items
    assert sorted(seen) == [m for p in pages(store, limit=500) for m in p]
    assert store.memories(cluster=10**9).items == []


def test_deleted_and_updated_memories(store):
    store.delete(key="k0", namespace="a")
    assert store.delete_many(keys=["k1", "k2"], namespace="b") == 1  # k2 lives in "c"
    store.delete(key="k2", namespace="c")
    store.update(key="k3", namespace="a", text="moved", embedding=topic_vectors(1, 1, seed=9)[0][0])
    items = store.memories(limit=2).items
    assert [m.text for m in items] == ["moved", "m4"]
    assert store.namespaces() == ["a", "b", "c"]
    store.delete_namespace("b")
    assert store.namespaces() == ["a", "c"]
    assert len([m for p in pages(store, limit=100) for m in p]) == len(store)


def test_bad_arguments(store):
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="limit"):
            store.memories(limit=bad)
    for bad in ("x", "m-1", "12"):
        with pytest.raises(ValueError, match="cursor"):
            store.memories(cursor=bad)


def test_empty_store(tmp_path):
    with MemoryStore.open(tmp_path / "e", config=CFG, embedder=False, slm=False) as s:
        assert s.memories() == MemoryPage([], None)
        assert s.namespaces() == []
