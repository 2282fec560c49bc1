"""User-chosen keys: upsert by key in add / add_many, lookups, updates and deletes by key,
bad keys refused with nothing written, the v2 -> v3 schema migration, and a SIGKILL in the
middle of a stream of upserts."""

from __future__ import annotations

import sqlite3
import textwrap
from pathlib import Path

import numpy as np
import pytest

from clag_fast import MemoryStore, StoreConfig
from clag_fast.eval.runner import HashingEmbedder
from clag_fast.store.catalog import SCHEMA_VERSION
from store_helpers import DIM, run_until_killed, topic_vectors

CFG = StoreConfig(min_memories_to_cluster=40, organize_every=0, slm="off")


def open_store(path: Path, **kw) -> MemoryStore:
    return MemoryStore.open(path, config=CFG, embedder=False, slm=False, **kw)


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "s")
    yield s
    s.close()


def test_upsert_replaces_text_metadata_vector_and_keeps_the_id(store):
    vecs, _ = topic_vectors(4, 2, seed=1)
    other = store.add("unrelated", embedding=vecs[2])
    mid = store.add("first text", key="doc-1", metadata={"v": 1}, embedding=vecs[0])
    again = store.add("second text", key="doc-1", metadata={"v": 2}, kind="fact", embedding=vecs[1])
    assert again == mid and other != mid
    assert len(store) == 2
    m = store.get(key="doc-1")
    assert (m.memory_id, m.text, m.metadata, m.kind, m.key) == (mid, "second text", {"v": 2}, "fact", "doc-1")
    assert store.get(mid) == m
    hit = store.search(vecs[1], k=1, mode="flat")[0]
    assert (hit.memory_id, hit.key, hit.text) == (mid, "doc-1", "second text")
    assert abs(hit.score - 1.0) < 1e-5
    # the old vector is gone: the memory no longer scores 1 against it
    hits = store.search(vecs[0], k=2, mode="flat")
    assert all(abs(h.score - 1.0) > 1e-3 for h in hits if h.memory_id == mid)
    assert store.get(other).key is None


def test_upsert_reroutes_after_clustering(tmp_path):
    s = open_store(tmp_path / "c")
    vecs, topics = topic_vectors(200, 4, seed=3)
    keys = [f"k{i}" for i in range(200)]
    ids = s.add_many([f"m{i}" for i in range(200)], embeddings=vecs, keys=keys)
    s.organize()
    assert s.clusters()
    # move memory 0 onto memory j's vector (another topic): it must land in j's cluster
    j = int(np.flatnonzero(topics != topics[0])[0])
    target = s.get(ids[j]).cluster_id
    assert s.get(ids[0]).cluster_id != target
    assert s.add("moved", key="k0", embedding=vecs[j]) == ids[0]
    assert s.get(ids[0]).cluster_id == target
    assert sum(c.size for c in s.clusters()) == len(s) == 200
    hits = s.search(vecs[j], k=2, n_probe=1)
    assert {h.memory_id for h in hits} == {ids[0], ids[j]}
    s.close()
    with open_store(tmp_path / "c") as s2:  # and after a reopen
        assert s2.get(key="k0").text == "moved"
        assert sum(c.size for c in s2.clusters()) == len(s2) == 200


def test_duplicate_keys_in_one_batch_last_wins(store):
    vecs, _ = topic_vectors(4, 2, seed=2)
    ids = store.add_many(["a", "b", "c", "d"], embeddings=vecs, keys=["x", None, "x", "y"])
    assert ids[0] == ids[2] and len(set(ids)) == 3
    assert len(store) == 3
    assert store.get(key="x").text == "c"
    assert store.search(vecs[2], k=1, mode="flat")[0].memory_id == ids[0]
    # a later batch upserting both existing keys and a new one
    ids2 = store.add_many(["y2", "x2", "z"], embeddings=vecs[:3], keys=["y", "x", "z"])
    assert ids2[:2] == [ids[3], ids[0]] and ids2[2] not in ids
    assert len(store) == 4
    assert [m.text for m in store.get_many(keys=["x", "y", "z", "nope"])] == ["x2", "y2", "z"]


def test_keys_are_per_namespace_and_may_hold_separators(store):
    vecs, _ = topic_vectors(6, 2, seed=4)
    odd = ["a/b", "ns:key", "with space", "tab\tkey", "ключ", "🔑" * 10]
    a = store.add_many([f"t{i}" for i in range(6)], embeddings=vecs, keys=odd, namespaces="A")
    b = store.add_many([f"u{i}" for i in range(6)], embeddings=vecs, keys=odd, namespaces="B")
    assert not set(a) & set(b)
    for i, k in enumerate(odd):
        assert store.get(key=k, namespace="A").text == f"t{i}"
        assert store.get(key=k, namespace="B").text == f"u{i}"
    with pytest.raises(KeyError, match="a/b"):
        store.get(key="a/b")  # the default namespace has none
    long_key = "k" * 512
    store.add("long", key=long_key, embedding=vecs[0])
    assert store.get(key=long_key).text == "long"


@pytest.mark.parametrize("bad, match", [
    ("", r"keys\[1\] is empty"),
    ("k" * 513, r"keys\[1\] has 513 characters"),
    ("a\x00b", r"keys\[1\] contains a NUL"),
    (7, r"keys\[1\] must be a string"),
    ("\ud800", r"keys\[1\] is not valid unicode"),
])
def test_bad_keys_write_nothing(store, bad, match):
    vecs, _ = topic_vectors(3, 1, seed=5)
    store.add("kept", key="good", embedding=vecs[0])
    rows = store.stats()["vector_rows"]
    with pytest.raises(ValueError, match=match):
        store.add_many(["x", "y", "z"], embeddings=vecs, keys=["good", bad, None])
    assert len(store) == 1 and store.stats()["vector_rows"] == rows
    assert store.get(key="good").text == "kept"
    with pytest.raises(ValueError, match="keys has 2 items for 3 texts"):
        store.add_many(["x", "y", "z"], embeddings=vecs, keys=["a", "b"])
    with pytest.raises(TypeError):
        store.add_many(["x"], embeddings=vecs[:1], keys="a")
    with pytest.raises(ValueError, match=match.replace(r"keys\[1\]", "key")):
        store.add("x", key=bad, embedding=vecs[0])
    if isinstance(bad, str):
        with pytest.raises(ValueError, match=match.replace(r"keys\[1\]", "key")):
            store.get(key=bad)
    assert len(store) == 1 and store.stats()["vector_rows"] == rows


def test_get_update_delete_by_key(store):
    vecs, _ = topic_vectors(5, 2, seed=6)
    ids = store.add_many([f"t{i}" for i in range(5)], embeddings=vecs, keys=[f"k{i}" for i in range(5)],
                         metadata=[{"i": i} for i in range(5)])
    store.update(key="k1", metadata={"i": 10})
    store.update(key="k2", text="changed", embedding=vecs[4])
    assert store.get(key="k1").metadata == {"i": 10}
    m2 = store.get(key="k2")
    assert (m2.memory_id, m2.text, m2.key, m2.metadata) == (ids[2], "changed", "k2", {"i": 2})
    assert [m.memory_id for m in store.get_many([ids[3], 999, ids[0]])] == [ids[3], ids[0]]
    store.delete(key="k0")
    with pytest.raises(KeyError, match="'k0'"):
        store.get(key="k0")
    with pytest.raises(KeyError, match="'k0'"):
        store.delete(key="k0")
    with pytest.raises(KeyError, match="'k0'"):
        store.update(key="k0", text="x", embedding=vecs[0])
    assert store.delete_many(keys=["k1", "k1", "nope"]) == 1
    assert store.delete_many([ids[3], 12345]) == 1
    assert [m.key for m in store.get_many(keys=["k0", "k1", "k2", "k3", "k4"])] == ["k2", "k4"]
    assert len(store) == 2
    # a deleted key can be used again: a new memory
    new = store.add("again", key="k0", embedding=vecs[0])
    assert new not in (ids[2], ids[4]) and store.get(key="k0").text == "again"
    with pytest.raises(ValueError, match="exactly one"):
        store.get(ids[2], key="k2")
    with pytest.raises(ValueError, match="exactly one"):
        store.delete()
    with pytest.raises(ValueError, match="exactly one"):
        store.get_many()


def test_hybrid_text_search_follows_the_replaced_text(tmp_path):
    with MemoryStore.open(tmp_path / "h", config=CFG, embedder=HashingEmbedder(), slm=False) as s:
        mid = s.add("the violin lesson is on tuesday", key="lesson")
        s.add("groceries: apples and pears", key="shop")
        assert s.add("the piano recital moved to friday", key="lesson") == mid
        hits = s.search("piano recital", k=1)
        assert hits[0].memory_id == mid and hits[0].key == "lesson"
        # the old words are gone from both indexes: nothing matches them any more
        assert max(h.score for h in s.search("violin tuesday", k=2, lexical_weight=1.0)) < 0.1


def test_keys_survive_reopen(tmp_path):
    vecs, _ = topic_vectors(3, 1, seed=8)
    with open_store(tmp_path / "r") as s:
        mid = s.add("one", key="k", namespace="n", embedding=vecs[0])
    with open_store(tmp_path / "r") as s:
        assert s.get(key="k", namespace="n").memory_id == mid
        assert s.add("two", key="k", namespace="n", embedding=vecs[1]) == mid
        assert len(s) == 1
    with open_store(tmp_path / "r", read_only=True) as s:
        assert s.get(key="k", namespace="n").text == "two"


def test_a_v2_store_is_migrated_on_open(tmp_path):
    path = tmp_path / "old"
    vecs, _ = topic_vectors(3, 1, seed=9)
    with open_store(path) as s:
        ids = s.add_many(["a", "b"], embeddings=vecs[:2], metadata=[{"x": 1}, None])
    # Turn it back into a schema-2 database, as the previous release wrote it.
    con = sqlite3.connect(path / "memories.db")
    con.executescript("DROP INDEX memories_key; ALTER TABLE memories DROP COLUMN key; PRAGMA user_version=2;")
    con.close()
    with open_store(path) as s:
        assert [m.text for m in s.get_many(ids)] == ["a", "b"]
        assert s.get(ids[0]).key is None
        k = s.add("c", key="new", embedding=vecs[2])
        assert s.add("c2", key="new", embedding=vecs[2]) == k
        assert s.search(vecs[0], k=1, mode="flat", where={"x": 1})[0].memory_id == ids[0]
    con = sqlite3.connect(path / "memories.db")
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    assert con.execute("SELECT name FROM sqlite_master WHERE name='memories_key'").fetchone()
    con.close()


UPSERTER = textwrap.dedent(
    """
    import sys
    from clag_fast.config import StoreConfig
    from clag_fast.store import MemoryStore
    sys.path.insert(0, {tests!r})
    from store_helpers import topic_vectors

    cfg = StoreConfig(min_memories_to_cluster=40, organize_every=25, max_cluster_size=60, slm="off")
    vecs, _ = topic_vectors(2000, 8, seed=7)
    store = MemoryStore.open({path!r}, config=cfg, embedder=False, slm=False)
    for v in range(100000):
        keys = [f"k{{(v * 3 + j) % 50}}" for j in range(3)]
        rows = [(v * 3 + j) % 2000 for j in range(3)]
        ids = store.add_many([f"{{k}} v{{v}}" for k in keys], embeddings=vecs[rows], keys=keys)
        for k, mid, r in zip(keys, ids, rows):
            print(k, mid, v, r, flush=True)   # printed only after add_many returned
    """
)


def test_sigkill_during_upserts_keeps_one_memory_per_key(tmp_path):
    path = tmp_path / "k"
    lines = run_until_killed(UPSERTER.format(tests=str(Path(__file__).parent), path=str(path)), 300, 0.5)
    acked: dict[str, tuple[int, int, int]] = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 4:  # a line cut by the kill is not a returned add
            acked[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
    assert len(acked) == 50, "the writer should have written every key before the kill"
    vecs, _ = topic_vectors(2000, 8, seed=7)
    with open_store(path) as s:
        assert len(s) == 50
        page = s.memories(limit=100)
        assert sorted(m.key for m in page.items) == sorted(acked)
        for key, (mid, version, row) in acked.items():
            m = s.get(key=key)
            assert m.memory_id == mid
            got = int(m.text.split(" v")[1])
            assert got >= version  # the acked version, or a later one that committed
            if got == version:
                assert s.search(vecs[row], k=1, mode="flat")[0].memory_id == mid
        if s.clusters():
            assert sum(c.size for c in s.clusters()) == 50
