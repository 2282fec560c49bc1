"""MemoryStore API: writes, reads, clustering, persistence, filters, forgetting, bad input.

These tests bring their own vectors (embedder=False, slm=False) so they run in seconds and
check exact results against numpy; the embedder and the SLM are covered in their own tests
and in test_store_e2e.py.
"""

from __future__ import annotations

import json
import sqlite3
import time

import numpy as np
import pytest

from clag_fast.config import StoreConfig
from clag_fast.decay import ForgettingPolicy
from clag_fast.store.catalog import StoreFormatError
from clag_fast.store import MemoryStore
from store_helpers import DIM, exact_top, texts_for, topic_vectors

FAST = StoreConfig(min_memories_to_cluster=50, organize_every=0, slm="off")


def open_store(path, config=FAST, **kw):
    return MemoryStore.open(path, config=config, embedder=False, slm=False, **kw)


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "s")
    yield s
    s.close()


def fill(store, n=200, topics=8, seed=0, **kw):
    vecs, top = topic_vectors(n, topics, seed=seed)
    ids = store.add_many(texts_for(top), embeddings=vecs, **kw)
    return ids, vecs, top


# -- writes and reads ---------------------------------------------------------------------
def test_add_get_roundtrip(store):
    v = topic_vectors(1, 1)[0][0]
    mid = store.add("The user is allergic to seafood", kind="user_input", namespace="u42",
                    metadata={"day": 3}, embedding=v)
    m = store.get(mid)
    assert (m.memory_id, m.text, m.kind, m.namespace, m.metadata) == (
        mid, "The user is allergic to seafood", "user_input", "u42", {"day": 3})
    assert not m.archived and m.access_count == 0
    assert len(store) == 1


def test_add_many_ids_are_distinct_and_ordered(store):
    ids, _, _ = fill(store, 30)
    assert ids == sorted(set(ids)) and len(ids) == 30
    more, _, _ = fill(store, 5, seed=1)
    assert min(more) > max(ids)


def test_flat_search_matches_numpy(store):
    ids, vecs, _ = fill(store, 120)
    q = topic_vectors(1, 3, seed=9)[0][0]
    hits = store.search(q, k=7, mode="flat")
    want = [ids[i] for i in exact_top(vecs, q, 7)]
    assert [h.memory_id for h in hits] == want
    np.testing.assert_allclose([h.score for h in hits], np.sort(vecs @ q)[::-1][:7], atol=1e-5)
    assert hits.mode == "flat" and hits.scanned == hits.candidates == 120


def test_cold_start_clusters_and_soft_assignment(store):
    ids, vecs, topics = fill(store, 200, topics=4)
    clusters = store.clusters()
    assert len(clusters) >= 2, "crossing min_memories_to_cluster must cluster the store"
    assert sum(c.size for c in clusters) == 200
    m = store.get(ids[0])
    assert 1 <= len(m.clusters) <= FAST.soft_k
    affinities = [a for _, a in m.clusters]
    assert affinities == sorted(affinities, reverse=True)
    # clusters are pure in topic on well-separated data
    by_cluster: dict[int, set] = {}
    for mid, t in zip(ids, topics.tolist()):
        by_cluster.setdefault(store.get(mid).cluster_id, set()).add(t)
    assert all(len(ts) == 1 for ts in by_cluster.values())


def test_two_stage_search_scans_less_and_finds_the_exact_top(store):
    ids, vecs, _ = fill(store, 400, topics=10)
    q = vecs[17]
    hits = store.search(q, k=5)  # automatic n_probe
    assert hits.mode == "two_stage"
    assert hits.scanned < hits.candidates
    assert hits[0].memory_id == ids[17] and hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert set(h.memory_id for h in hits) == {ids[i] for i in exact_top(vecs, q, 5)}
    assert all(h.cluster_id is not None for h in hits)


def test_hits_carry_cluster_labels_after_organize(store):
    fill(store, 200)
    store.organize()
    hits = store.search(topic_vectors(1, 8)[0][0], k=3)
    profiles = {c.id: (c.summary, c.tags) for c in store.clusters()}
    assert all(h.cluster_summary for h in hits), "vector profiles label every cluster"
    for h in hits:
        assert (h.cluster_summary, h.cluster_tags) == profiles[h.cluster_id], "a hit carries its own cluster's profile"
        # tags: the next distinctive phrases after the label's (none when there is no other)
        assert isinstance(h.cluster_tags, list) and all(isinstance(t, str) and t for t in h.cluster_tags)
        assert not set(h.cluster_tags) & set(h.cluster_summary.split(" · ")), "tags repeat no label phrase"
        assert h.cluster_id in dict(store.get(h.memory_id).clusters)


def test_update_text_and_metadata(store):
    ids, vecs, _ = fill(store, 60)
    new_vec = -vecs[0]
    store.update(ids[0], text="changed text", metadata={"v": 2}, embedding=new_vec)
    m = store.get(ids[0])
    assert m.text == "changed text" and m.metadata == {"v": 2}
    hits = store.search(new_vec, k=1, mode="flat")
    assert hits[0].memory_id == ids[0] and hits[0].score == pytest.approx(1.0, abs=1e-5)
    # the whole ranking is numpy's over the updated vectors: the old vector is gone, the
    # new one ranks where it should
    now = vecs.copy()
    now[0] = new_vec
    for q in (vecs[0], new_vec, vecs[7]):
        hits = store.search(q, k=60, mode="flat")
        assert [h.memory_id for h in hits] == [ids[i] for i in exact_top(now, q, 60)]
    assert len(store) == 60 and store.stats()["vector_rows"] == 61


def test_delete(store):
    ids, vecs, _ = fill(store, 80)
    store.delete(ids[3])
    with pytest.raises(KeyError):
        store.get(ids[3])
    assert ids[3] not in [h.memory_id for h in store.search(vecs[3], k=10, mode="flat")]
    assert ids[3] not in [h.memory_id for h in store.search(vecs[3], k=10)]
    assert len(store) == 79
    with pytest.raises(KeyError):
        store.delete(ids[3])


@pytest.mark.parametrize("bad", [10**9, -1])
def test_unknown_ids_raise_keyerror(store, bad):
    fill(store, 3)
    with pytest.raises(KeyError):
        store.get(bad)
    with pytest.raises(KeyError):
        store.update(bad, metadata={})
    with pytest.raises(KeyError):
        store.delete(bad)


# -- bad input never changes the store ----------------------------------------------------
@pytest.mark.parametrize(
    "texts, embeddings, error",
    [
        (["ok", ""], None, ValueError),
        (["ok", "   \n"], None, ValueError),
        (["ok", 3], None, TypeError),
        (["ok"], np.ones((1, DIM - 1), np.float32), ValueError),
        (["ok"], np.full((1, DIM), np.nan, np.float32), ValueError),
        (["ok"], np.zeros((1, DIM), np.float32), ValueError),
        (["ok", "two"], np.ones((1, DIM), np.float32), ValueError),
        (["bad \ud800 surrogate"], np.ones((1, DIM), np.float32), ValueError),
    ],
)
def test_bad_input_is_rejected_and_nothing_is_written(store, texts, embeddings, error):
    fill(store, 10)
    before = (len(store), store.stats()["vector_rows"])
    with pytest.raises(error):
        store.add_many(texts, embeddings=embeddings)
    assert (len(store), store.stats()["vector_rows"]) == before


def test_bad_metadata_and_namespaces(store):
    v = topic_vectors(2, 1)[0]
    with pytest.raises(ValueError, match="metadata"):
        store.add_many(["a", "b"], embeddings=v, metadata=[{"x": 1}])
    with pytest.raises(ValueError, match="JSON"):
        store.add("a", embedding=v[0], metadata={"x": object()})
    with pytest.raises(ValueError, match="namespaces"):
        store.add_many(["a", "b"], embeddings=v, namespaces=["", "x"])
    assert len(store) == 0


def test_search_bad_input(store):
    fill(store, 10)
    with pytest.raises(ValueError, match="shape"):
        store.search(np.ones(DIM + 1, np.float32))
    with pytest.raises(ValueError, match="k must"):
        store.search(np.ones(DIM, np.float32), k=0)
    with pytest.raises(ValueError, match="mode"):
        store.search(np.ones(DIM, np.float32), mode="fast")
    with pytest.raises(ValueError, match="embedder=False"):
        store.search("text query without an embedder")


def test_empty_store_and_large_k(store):
    assert list(store.search(np.ones(DIM, np.float32), k=5)) == []
    fill(store, 4)
    assert len(store.search(np.ones(DIM, np.float32), k=50)) == 4


# -- filters ------------------------------------------------------------------------------
def test_namespace_isolation(store):
    vecs, top = topic_vectors(120, 4, seed=3)
    ns = ["alice" if i % 2 else "bob" for i in range(120)]
    ids = store.add_many(texts_for(top), embeddings=vecs, namespaces=ns)
    alice = {m for m, n in zip(ids, ns) if n == "alice"}
    for mode in ("flat", "two_stage"):
        hits = store.search(vecs[0], k=30, namespace="alice", mode=mode)  # vecs[0] is bob's
        assert hits and {h.memory_id for h in hits} <= alice
        assert all(h.namespace == "alice" for h in hits)
    assert list(store.search(vecs[0], k=5, namespace="nobody")) == []
    assert store.delete_namespace("bob") == 60
    assert len(store) == 60
    assert {h.memory_id for h in store.search(vecs[0], k=100, mode="flat")} == alice
    # a namespace too small to fill k from the probed clusters still gets k hits
    few = store.add_many(["c1", "c2", "c3"], embeddings=vecs[:3], namespaces="carol")
    hits = store.search(-vecs[0], k=3, namespace="carol")
    assert sorted(h.memory_id for h in hits) == sorted(few)


def test_kind_and_time_filters(store):
    vecs, top = topic_vectors(40, 2, seed=4)
    kinds = ["tool_result" if i < 10 else "user_input" for i in range(40)]
    ids = store.add_many(texts_for(top), embeddings=vecs, kinds=kinds)
    hits = store.search(vecs[20], k=40, kind="tool_result", mode="flat")
    assert {h.memory_id for h in hits} == set(ids[:10])
    t = time.time()
    time.sleep(0.01)
    late = store.add("late memory", embedding=vecs[0])
    assert [h.memory_id for h in store.search(vecs[0], k=40, since=t, mode="flat")] == [late]
    assert late not in {h.memory_id for h in store.search(vecs[0], k=50, until=t, mode="flat")}


# -- organisation -------------------------------------------------------------------------
def test_oversized_clusters_are_split(tmp_path):
    # coherence=1: split at the cap whatever the data (each topic here is one blob).
    cfg = StoreConfig(min_memories_to_cluster=40, target_cluster_size=30, max_cluster_size=40,
                      organize_every=0, coherence=1.0, slm="off")
    with open_store(tmp_path / "s", cfg) as s:
        fill(s, 300, topics=3)
        report = s.organize()
        assert all(c.size <= 40 for c in s.clusters())
        assert sum(c.size for c in s.clusters()) == 300
        assert report["clusters"] == len(s.clusters())


def test_vectors_around_20_centres_end_in_about_20_clusters(tmp_path):
    """Blobs are coherent: a cluster of one is not split at the size cap, and the pieces a cold
    start cut are merged back (2,000 vectors in calls of 100, the default configuration)."""
    from clag_fast.store import organize as org

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((20, 384)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    blob = rng.integers(0, 20, 2000)
    x = centres[blob] + 0.5 * rng.standard_normal((2000, 384)).astype(np.float32) / np.sqrt(384)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    with MemoryStore.open(tmp_path / "s", config=StoreConfig(slm="off"), embedder=False, slm=False) as s:
        for i in range(0, 2000, 100):
            s.add_many([f"topic {t} number {i + j} note" for j, t in enumerate(blob[i:i + 100])],
                       embeddings=x[i:i + 100])
        s.organize()
        state = s._state
        ids = state.index.cluster_ids().tolist()
        assert 18 <= len(ids) <= 22, len(ids)
        assert max(state.index.cluster_sizes()) <= org.COHERENT_CAP * s.config.cluster_sizes_for(2000)[1]
        # Each cluster is (almost all) one blob.
        purity = [np.bincount(blob[state.index.members(c)]).max() / len(state.index.members(c)) for c in ids]
        assert min(purity) >= 0.95
    # The same data with coherence off: tiled by the size cap, as every store was before.
    with MemoryStore.open(tmp_path / "t", config=StoreConfig(slm="off", coherence=1.0), embedder=False,
                          slm=False) as s:
        for i in range(0, 2000, 100):
            s.add_many([f"note {i + j}" for j in range(100)], embeddings=x[i:i + 100])
        assert s.stats()["clusters"] > 3 * 20


def test_a_topic_cluster_of_one_member_is_folded_into_its_nearest_cluster(tmp_path):
    from clag_fast.store import organize as org

    cfg = StoreConfig(min_memories_to_cluster=40, organize_every=0, slm="off")
    with open_store(tmp_path / "s", cfg) as s:
        _, vecs, _ = fill(s, 200, topics=4)
        odd = np.random.default_rng(9).standard_normal(384).astype(np.float32)
        odd /= np.linalg.norm(odd)
        odd_id = s.add("an odd one out", embedding=odd)
        s.organize()
        state = s._state
        # Two SLM topics: one where many memories are, one only the odd memory is nearest to.
        topics = np.stack([vecs[0], odd])
        with state.lock.write():
            report = org.organize(state, reason="explicit", topics=["first", "odd"], topic_vectors=topics)
        sizes = dict(zip(state.index.cluster_ids().tolist(), state.index.cluster_sizes().tolist()))
        assert report["topics"] == ["first", "odd"] and report["merged"]
        assert min(sizes.values()) >= cfg.min_cluster_size  # the lone topic went, with its one member
        assert sizes[s.get(odd_id).clusters[0][0]] >= 2
        assert sum(sizes.values()) == 201


def test_cohesion_tells_one_group_from_two(tmp_path):
    from clag_fast.store import organize as org

    vecs, topic = topic_vectors(400, 2, seed=3)
    with open_store(tmp_path / "s", StoreConfig(min_memories_to_cluster=10_000, slm="off")) as s:
        s.add_many(texts_for(topic), embeddings=vecs)
        rows = np.arange(400)  # the first vector rows, in order
        one, two = rows[topic == 0], rows[topic == 1]
        # Random halves of one topic: one group, whatever their sizes.
        assert org.cohesion(s._state, one[::2], one[1::2]) > 0.97
        assert org.cohesion(s._state, one[:10], one[10:]) > 0.9
        # Two topics: far apart.
        assert org.cohesion(s._state, one, two) < 0.5
        assert org.cohesion(s._state, one[:1], two) == 0.0  # a group of one has no inner similarity


def test_near_duplicate_clusters_are_merged(tmp_path):
    cfg = StoreConfig(min_memories_to_cluster=40, target_cluster_size=10, organize_every=0,
                      merge_threshold=0.9, slm="off")
    with open_store(tmp_path / "s", cfg) as s:
        # 2 very tight topics, but k-means is asked for ~10 clusters: many near-duplicates
        fill(s, 100, topics=2)
        s.organize()
        centres = s._state.index.centres()
        sims = centres @ centres.T
        np.fill_diagonal(sims, -1)
        assert sims.max() < 0.9
        assert sum(c.size for c in s.clusters()) == 100


def test_periodic_organisation_profiles_new_clusters(tmp_path):
    cfg = StoreConfig(min_memories_to_cluster=30, organize_every=20, slm="off")
    with open_store(tmp_path / "s", cfg) as s:
        first, _, _ = fill(s, 40, topics=4)
        old_clusters = {c.id for c in s.clusters()}
        assert s.stats()["organizations"] == 1 and old_clusters  # the cold start
        cold_s = s.stats()["timings_s"]["organize"]
        assert cold_s > 0
        later, _, _ = fill(s, 60, topics=4, seed=5)  # far-away topics open new clusters
        assert s.stats()["organizations"] >= 2  # periodic, every 20 adds
        assert s.stats()["timings_s"]["organize"] > cold_s  # the periodic passes' time is counted
        new_home = {s.get(m).clusters[0][0] for m in later}
        assert new_home and not (new_home & old_clusters), "the new topics live in clusters of their own"
        assert {s.get(m).clusters[0][0] for m in first} <= {c.id for c in s.clusters()}
        assert all(c.summary for c in s.clusters())


def test_periodic_organisations_leave_the_saved_index_state_to_checkpoints(tmp_path):
    """A periodic organisation does not rewrite ``clusters.bin`` before ``SAVE_ROWS`` rows
    were added since the last save (a kill after it is repaired on open: ``test_store_crash``);
    flush(), an explicit organize() and close do."""
    cfg = StoreConfig(min_memories_to_cluster=30, organize_every=20, slm="off")
    state_file = tmp_path / "s" / "index" / "clusters.bin"
    with open_store(tmp_path / "s", cfg) as s:
        for seed in range(3):
            fill(s, 20, topics=4, seed=seed)
        assert s.stats()["organizations"] >= 2 and not state_file.exists()
        s.flush()
        saved = state_file.read_bytes()
        for seed in range(3, 6):
            fill(s, 20, topics=4, seed=seed)
        assert s.stats()["organizations"] >= 4 and state_file.read_bytes() == saved
        s.organize()
        assert state_file.read_bytes() != saved
        clusters = sorted((c.id, c.size) for c in s.clusters())
    with open_store(tmp_path / "s", cfg) as s:
        assert sorted((c.id, c.size) for c in s.clusters()) == clusters


def test_vector_organisations_in_the_worker_when_asked(tmp_path, monkeypatch):
    """SLMConfig(vector_in_background=True): the add that makes a vector-only organisation
    due returns before it (it runs in the store's worker, held here until released);
    flush() waits for it. Without the option it runs inside that add (test above)."""
    import threading

    from clag_fast.config import SLMConfig
    from clag_fast.store import slm_scheduler as scheduler

    gate, started, ran_in = threading.Event(), threading.Event(), []
    real = scheduler.org_ops.organize

    def held(state, **kw):
        ran_in.append(threading.current_thread().name)
        started.set()
        assert gate.wait(60)
        return real(state, **kw)

    monkeypatch.setattr(scheduler.org_ops, "organize", held)
    cfg = StoreConfig(min_memories_to_cluster=30, organize_every=20,
                      slm=SLMConfig(mode="off", vector_in_background=True))
    with open_store(tmp_path / "s", cfg) as s:
        ids, _, _ = fill(s, 40, topics=4)  # makes the cold start due
        assert started.wait(60), "the organisation did not start"
        assert s.stats()["organizations"] == 0  # the add returned while it is held
        assert len(s.get_many(ids)) == 40  # and its memories are committed
        gate.set()
        s.flush()
        assert s.stats()["organizations"] == 1 and s.clusters()
        fill(s, 60, topics=4, seed=5)
        s.flush()
        assert s.stats()["organizations"] >= 2  # periodic, every 20 adds
        assert set(ran_in) == {"clag-fast-organizer"}
        assert all(c.summary for c in s.clusters())


def test_templated_labels_mode(tmp_path):
    vecs, top = topic_vectors(90, 3, seed=6)
    labels = ("flights", "hotels", "food")
    cfg = StoreConfig(labels=labels, min_memories_to_cluster=10, organize_every=0, slm="off")
    with open_store(tmp_path / "s", cfg) as s:
        # label embeddings: here the topic centres stand in for embedded label texts
        centres = np.stack([vecs[top == t].mean(0) for t in range(3)])
        s.set_label_vectors(centres)
        s.add_many(texts_for(top), embeddings=vecs)
        clusters = s.clusters()
        assert sorted(c.summary for c in clusters) == sorted(labels)
        assert all(c.source == "template" for c in clusters)
        counts = np.bincount(top, minlength=3)
        assert {c.summary: c.size for c in clusters} == {labels[t]: int(counts[t]) for t in range(3)}
        # no invented topics, even for far-away memories
        far = topic_vectors(20, 2, seed=99)[0]
        s.add_many([f"far {i}" for i in range(20)], embeddings=far)
        assert len(s.clusters()) == 3


def test_templated_labels_need_label_vectors_without_embedder(tmp_path):
    cfg = StoreConfig(labels=("a", "b"), organize_every=0, slm="off")
    with open_store(tmp_path / "s", cfg) as s:
        with pytest.raises(ValueError, match="set_label_vectors"):
            s.add("x", embedding=topic_vectors(1, 1)[0][0])
        assert len(s) == 0


# -- persistence --------------------------------------------------------------------------
def test_reopen_keeps_everything(tmp_path):
    with open_store(tmp_path / "s") as s:
        ids, vecs, _ = fill(s, 150)
        s.organize()
        before = [(h.memory_id, h.cluster_id, h.cluster_summary) for h in s.search(vecs[5], k=5)]
        clusters = s.clusters()
    with open_store(tmp_path / "s") as s:
        assert len(s) == 150
        assert s.clusters() == clusters
        assert [(h.memory_id, h.cluster_id, h.cluster_summary) for h in s.search(vecs[5], k=5)] == before


def test_reopen_without_config_keeps_dim(tmp_path):
    with open_store(tmp_path / "s", config=FAST.replace(dim=DIM)):
        pass
    with MemoryStore.open(tmp_path / "s", embedder=False, slm=False) as s:
        assert s.config.dim == DIM
    with pytest.raises(ValueError, match="dim"):
        MemoryStore.open(tmp_path / "s", config=StoreConfig(dim=8), embedder=False, slm=False)


def test_not_a_store(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    with pytest.raises(StoreFormatError, match="no clag_fast store"):
        open_store(tmp_path / "junk")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        open_store(tmp_path / "file")
    assert (tmp_path / "junk" / "notes.txt").read_text() == "hello"


def test_newer_schema_is_refused_untouched(tmp_path):
    with open_store(tmp_path / "s") as s:
        fill(s, 5)
    db = tmp_path / "s" / "memories.db"
    con = sqlite3.connect(db)
    con.execute("PRAGMA user_version=99")
    con.commit()
    con.close()
    before = db.read_bytes()
    with pytest.raises(StoreFormatError, match="newer"):
        open_store(tmp_path / "s")
    assert db.read_bytes() == before


def test_foreign_sqlite_file_is_refused(tmp_path):
    (tmp_path / "s").mkdir()
    con = sqlite3.connect(tmp_path / "s" / "memories.db")
    con.execute("CREATE TABLE other (x)")
    con.commit()
    con.close()
    with pytest.raises(StoreFormatError, match="another application"):
        open_store(tmp_path / "s")


def test_second_writer_is_refused_reader_allowed(tmp_path):
    from clag_fast.store.locks import StoreLockedError

    with open_store(tmp_path / "s") as s:
        ids, vecs, _ = fill(s, 20)
        s.flush()
        with pytest.raises(StoreLockedError):
            open_store(tmp_path / "s")
        with open_store(tmp_path / "s", read_only=True) as r:
            assert len(r) == 20
            assert r.search(vecs[0], k=1, mode="flat")[0].memory_id == ids[0]
            with pytest.raises(PermissionError):
                r.add("x", embedding=vecs[0])


def test_read_only_on_missing_store(tmp_path):
    with pytest.raises(FileNotFoundError):
        open_store(tmp_path / "nothing", read_only=True)


# -- cache, forgetting ----------------------------------------------------------------------
class _CountingEmbedder:
    """A deterministic stand-in embedder that counts calls (the real one is tested elsewhere)."""

    def __init__(self):
        self.calls = 0

    def encode(self, texts):
        self.calls += 1
        out = np.zeros((len(texts), DIM), np.float32)
        for i, t in enumerate(texts):
            rng = np.random.default_rng(abs(hash(t)) % (2**32))
            out[i] = rng.standard_normal(DIM)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_retrieval_cache_hits_and_invalidates(tmp_path):
    emb = _CountingEmbedder()
    with MemoryStore.open(tmp_path / "s", config=FAST, embedder=emb, slm=False) as s:
        s.add_many(["alpha", "beta", "gamma"])
        first = s.search("alpha", k=2)
        calls = emb.calls
        again = s.search("alpha", k=2)
        assert again.cached and [h.memory_id for h in again] == [h.memory_id for h in first]
        assert emb.calls == calls
        s.add("alpha", kind="dup")
        after = s.search("alpha", k=2)
        assert not after.cached and len({h.text for h in after}) == 1


@pytest.mark.parametrize("batch", [False, True])
def test_a_write_between_a_search_and_its_cache_filing_is_not_hidden(tmp_path, batch):
    """A search files its hits after releasing the read lock; another thread's add can land
    in between (the service runs adds and searches side by side). The hits from before the
    add must not be filed: the next identical search is answered afresh and finds the new
    memory. The add is made at the search's last step before filing (in the searching
    thread: the read lock is already released there)."""
    emb = _CountingEmbedder()
    with MemoryStore.open(tmp_path / "s", config=FAST, embedder=emb, slm=False) as s:
        s.add_many(["alpha", "beta", "gamma"])
        added: list[int] = []
        scheduler = s._slm
        original = scheduler.after_search if batch else s._searched

        def write_then(*args):
            out = original(*args)
            if not added:
                added.append(s.add("alpha", kind="late"))
            return out

        if batch:
            scheduler.after_search = write_then
        else:
            s._searched = write_then
        first = s.search_many(["alpha"], k=2)[0] if batch else s.search("alpha", k=2)
        assert added and added[0] not in [h.memory_id for h in first]  # searched before the add
        again = s.search("alpha", k=2)
        assert not again.cached
        assert added[0] in [h.memory_id for h in again]
        # Without a write in between, the result is filed as before.
        assert s.search("alpha", k=2).cached


def test_search_many_shares_the_retrieval_cache_with_search(tmp_path):
    emb = _CountingEmbedder()
    # The same memories in a store without a cache: what a fresh search answers.
    ref = MemoryStore.open(tmp_path / "ref", config=StoreConfig(min_memories_to_cluster=50, organize_every=0,
                                                                slm="off", cache_size=0),
                           embedder=_CountingEmbedder(), slm=False)

    def ids(hits):
        return [h.memory_id for h in hits]

    # embed_cache=0: embedder calls then count the searches the retrieval cache did not answer.
    cfg = StoreConfig(min_memories_to_cluster=50, organize_every=0, slm="off", embed_cache=0)
    with ref, MemoryStore.open(tmp_path / "s", config=cfg, embedder=emb, slm=False) as s:
        for store in (s, ref):
            store.add_many(["alpha", "beta", "gamma", "delta"])
        one = s.search("alpha", k=2)
        calls = emb.calls
        # A batch with one cached and one new text: only the new one is embedded, in order.
        both = s.search_many(["beta", "alpha"], k=2)
        assert emb.calls == calls + 1
        assert [h.cached for h in both] == [False, True]
        assert ids(both[1]) == ids(one) == ids(ref.search("alpha", k=2))
        assert ids(both[0]) == ids(ref.search("beta", k=2))
        # lexical_weight=None is the store's default weight: the same entry.
        assert s.search_many(["beta"], k=2, lexical_weight=None)[0].cached
        # search() now finds the batch's result, and an all-cached batch embeds nothing.
        calls = emb.calls
        assert s.search("beta", k=2).cached
        again = s.search_many(["alpha", "beta"], k=2)
        assert all(h.cached for h in again) and emb.calls == calls
        # Other arguments are other entries; a write clears them all.
        assert not s.search_many(["alpha"], k=3)[0].cached
        for store in (s, ref):
            store.add("epsilon")
        fresh = s.search_many(["alpha", "beta"], k=2)
        assert not any(h.cached for h in fresh)
        assert [ids(hs) for hs in fresh] == [ids(ref.search(q, k=2)) for q in ("alpha", "beta")]


def test_decay_ranks_fresh_memories_first_and_prunes(tmp_path):
    policy = ForgettingPolicy(half_life_days=1.0, prune_below=0.3)
    cfg = StoreConfig(forgetting=policy, organize_every=0, slm="off", cache_size=0)
    v = topic_vectors(1, 1)[0][0]
    with open_store(tmp_path / "s", cfg) as s:
        old = s.add("old", embedding=v)
        new = s.add("new", embedding=v)
        stale = s.add("stale", embedding=v)
        rows = s._state.rows

        def age(mid, days):  # what reopening the store `days` later would see
            r = int(np.flatnonzero(rows.memory_id[: rows.n] == mid)[0])
            rows.created_at[r] -= days * 86400

        age(old, 1)
        age(stale, 3)
        report = s.forget()
        assert report["pruned"] == 1 and s.get(stale).archived and not s.get(old).archived
        hits = s.search(v, k=3, mode="flat")
        assert [h.memory_id for h in hits] == [new, old]
        assert hits[1].score == pytest.approx(hits[0].score * 0.5, rel=1e-3)
        # being retrieved counts as use: the old memory is as fresh as the new one again
        s.flush()  # access counts are written in batches
        assert s.get(old).access_count == 1 and s.get(new).access_count == 1
        w = rows.weights(policy, time.time())
        r = {m: int(np.flatnonzero(rows.memory_id[: rows.n] == m)[0]) for m in (old, new)}
        assert w[r[old]] == pytest.approx(w[r[new]], rel=1e-3)
        assert w[r[old]] > 1.0  # the access boost


def test_stats_shape(store):
    fill(store, 60)
    store.search(topic_vectors(1, 1)[0][0])
    st = store.stats()
    assert st["memories"] == 60 and st["searches"] == 1 and st["clusters"] >= 2
    assert "organizer_errors" in st["slm_usage"]  # no SLM: no call counters, but the error count
    json.dumps(st)


def _meta(path, key):
    with sqlite3.connect(path / "memories.db") as db:
        row = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    return None if row is None else row[0]


def test_default_embedder_precision_is_fixed_per_store(tmp_path):
    """A store keeps the precision it started with, whatever Embedder() would pick now."""
    from clag_fast.embed.embedder import resolve_precision

    new = tmp_path / "new"
    MemoryStore.open(new, config=FAST, slm=False).close()
    assert _meta(new, "embed_precision") == resolve_precision()
    # A store moved to a machine where "auto" means something else keeps its own.
    other = "fp32" if resolve_precision() == "int8" else "int8"
    with sqlite3.connect(new / "memories.db") as db:
        db.execute("UPDATE meta SET value=? WHERE key='embed_precision'", (other,))
    with MemoryStore.open(new, config=FAST, slm=False) as s:
        assert s._get_embedder().precision == other
    # Stores written before the key existed hold fp32 vectors.
    legacy = tmp_path / "legacy"
    with open_store(legacy) as s:
        fill(s, n=5)
    assert _meta(legacy, "embed_precision") is None  # an explicit embedder records nothing
    MemoryStore.open(legacy, config=FAST, slm=False).close()
    assert _meta(legacy, "embed_precision") == "fp32"


def test_identical_memories_organise_without_endless_splits(tmp_path):
    # 2-means cannot cut identical vectors; the oversized cluster must stay as it is instead
    # of being split again forever. Run in a daemon thread so a regression fails, not hangs.
    import threading

    cfg = StoreConfig(dim=8, min_memories_to_cluster=20, max_cluster_size=16, target_cluster_size=4, slm="off")
    out = {}

    def work():
        with MemoryStore.open(tmp_path / "s", config=cfg, embedder=False, slm=False) as s:
            s.add_many(["same text"] * 200, embeddings=np.ones((200, 8), np.float32))
            out["report"] = s.organize()
            out["found"] = len(s.search(np.ones(8, np.float32), k=200))

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "organize() did not finish: endless splits of identical vectors"
    assert out["report"]["clusters"] >= 1
    assert out["found"] == 200


def test_hits_never_show_stale_text_or_metadata(tmp_path):
    # Hit details are cached by memory id; every write to a memory must be visible at once.
    with MemoryStore.open(tmp_path / "s", config=StoreConfig(dim=8, slm="off"), embedder=False, slm=False) as s:
        v = np.eye(8, dtype=np.float32)
        a = s.add("first text", embedding=v[0], metadata={"n": 1})
        assert s.search(v[0], k=1)[0].text == "first text"
        s.update(a, text="second text", embedding=v[0])
        s.update(a, metadata={"n": 2})
        hit = s.search(v[0], k=1)[0]
        assert (hit.text, hit.metadata) == ("second text", {"n": 2})
        hit.metadata["n"] = 99  # a caller's dict is its own
        assert s.search(v[0], k=1)[0].metadata == {"n": 2}
        s.delete(a)
        b = s.add("third text", embedding=v[1])  # may reuse the deleted id
        assert s.search(v[1], k=1)[0].text == "third text"
        assert s.get(b).text == "third text"


def test_explicit_n_probe_is_a_floor_not_a_flat_fallback(tmp_path):
    # Clusters of ~2 memories: 1-2 probed clusters hold fewer than k rows. The store probes on
    # until k rows are reachable instead of scanning everything, so scanned never falls as
    # n_probe grows and the search stays two-stage.
    cfg = StoreConfig(dim=16, min_memories_to_cluster=40, target_cluster_size=2, max_cluster_size=4,
                      organize_every=0, slm="off", cache_size=0)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 16)).astype(np.float32)
    with MemoryStore.open(tmp_path / "s", config=cfg, embedder=False, slm=False) as s:
        s.add_many([f"m{i}" for i in range(300)], embeddings=x)
        s.organize()
        assert len(s.clusters()) > 50
        for q in x[:20]:
            scanned = []
            for n_probe in (1, 2, 4, 8):
                hits = s.search(q, k=10, n_probe=n_probe)
                assert hits.mode == "two_stage" and len(hits) == 10
                assert len(hits.clusters_probed) >= n_probe
                scanned.append(hits.scanned)
            assert scanned == sorted(scanned) and scanned[-1] < 300


def test_vector_index_min_rows_bounds_adaptive_probing(tmp_path):
    from clag_fast import VectorIndex

    rng = np.random.default_rng(2)
    x = rng.standard_normal((400, 8)).astype(np.float32)
    with VectorIndex.open(tmp_path / "ix", dim=8) as ix:
        ix.append(x)
        ix.kmeans(100, seed=0)
        q = x[0]
        wide = ix.search(q, k=50, n_probe=100, probe_gap=0.0, min_probe=1)
        narrow = ix.search(q, k=50, n_probe=100, probe_gap=0.0, min_probe=1, min_rows=5)
        sizes = dict(zip(ix.cluster_ids().tolist(), ix.cluster_sizes().tolist()))
        listed = lambda res: sum(sizes[c] for c in res.probed[0].tolist() if c >= 0)  # noqa: E731
        assert listed(wide) >= 50 and listed(narrow) >= 5
        assert (res_n := (narrow.probed[0] >= 0).sum()) < (wide.probed[0] >= 0).sum()
        assert res_n >= 1


def test_searches_record_each_clusters_last_hit_through_flush(store, monkeypatch):
    # cluster hits are folded in batches (state.HIT_BATCH searches): a flush sees them all,
    # with each cluster's last hit time, and no time for clusters never hit
    from clag_fast.store import search as search_mod
    from clag_fast.store.state import HIT_BATCH

    ids, vecs, top = fill(store, n=300, topics=12)
    store.organize()
    clock = {"t": 2_000_000_000.0}

    def tick() -> float:
        clock["t"] += 1.0
        return clock["t"]

    monkeypatch.setattr(search_mod.time, "time", tick)
    last = {}
    for i in range(HIT_BATCH + 37):  # one full batch and a partial one
        hits = store.search(vecs[(7 * i) % 40], k=3, n_probe=1)  # the first 40 vectors: some clusters only
        now = clock["t"]
        for h in hits:
            last[h.cluster_id] = now
    monkeypatch.undo()
    store.flush()
    got = {c: t for c, t, _ in store._state.catalog.cluster_hits()}
    assert last and set(last) < set(got)
    assert {c: got[c] for c in last} == last
    assert all(got[c] is None for c in got if c not in last)


def test_reopen_rebuilds_the_row_table_column_for_column(tmp_path):
    """The in-memory row table (what filters, decay and liveness read) is rebuilt at open
    from the database: every column equal after a reopen, with several namespaces and kinds,
    accessed and never-accessed memories, deleted ones and a gap-free id/row mapping."""
    cfg = StoreConfig(min_memories_to_cluster=50, organize_every=0, slm="off", cache_size=0)

    def columns(s):
        rows = s._state.rows
        n = rows.n
        ns, kinds = rows.names("namespace"), rows.names("kind")
        return dict(memory_id=rows.memory_id[:n].tolist(), namespace=[ns.get(c) for c in rows.namespace[:n].tolist()],
                    kind=[kinds.get(c) for c in rows.kind[:n].tolist()], created_at=rows.created_at[:n].tolist(),
                    last_accessed=[None if x != x else x for x in rows.last_accessed[:n].tolist()],
                    access_count=rows.access_count[:n].tolist(), strength=rows.strength[:n].tolist(),
                    live=rows.live[:n].tolist())

    vecs, top = topic_vectors(120, 4, seed=2)
    with open_store(tmp_path / "s", cfg) as s:
        ids = s.add_many(texts_for(top), embeddings=vecs, namespaces=["a", "b", "c"] * 40,
                         kinds=["note", "tool"] * 60)
        for v in vecs[:6]:
            s.search(v, k=3)  # accessed rows: counts and times to persist
        s.delete(ids[7])
        s.delete(ids[50])
        s.flush()
        before = columns(s)
    assert any(x is not None for x in before["last_accessed"]) and any(x is None for x in before["last_accessed"])
    assert before["live"].count(False) == 2 and len(set(before["namespace"])) == 3
    with open_store(tmp_path / "s", cfg) as s:
        after = columns(s)
    # A deleted memory's row is dead (its database row is gone): only liveness and the id
    # column (-1) speak for it; every column of a live row must match.
    live = before["live"]
    assert after["live"] == live and after["memory_id"] == before["memory_id"]
    for name in before:
        diff = [(i, b, a) for i, (b, a, ok) in enumerate(zip(before[name], after[name], live)) if ok and a != b]
        assert not diff, (name, diff[:5], len(diff))


@pytest.mark.parametrize("bad, error, message", [
    (7, TypeError, "text 2 is int, not str"),
    ("  \n", ValueError, "text 2 is empty or whitespace only"),
    ("\ud800", ValueError, "text 2 is not valid unicode"),
])
def test_add_many_names_the_bad_text_and_writes_nothing(store, bad, error, message):
    vecs, _ = topic_vectors(3, 1, seed=5)
    with pytest.raises(error, match=message):
        store.add_many(["fine", "also fine", bad], embeddings=vecs)
    assert len(store) == 0
    assert store.add_many(["fine", "also fine", "third"], embeddings=vecs) == [1, 2, 3]


def test_add_many_namespace_names_the_batch(store):
    vecs, _ = topic_vectors(4, 2, seed=5)
    ids = store.add_many(list("abcd"), embeddings=vecs, namespace="u1")
    assert [store.get(i).namespace for i in ids] == ["u1"] * 4
    assert store.namespaces() == ["u1"]
    with pytest.raises(ValueError, match="not both"):
        store.add_many(["e"], embeddings=vecs[:1], namespace="u1", namespaces=["u1"])
    with pytest.raises(ValueError, match="non-empty string"):
        store.add_many(["e"], embeddings=vecs[:1], namespace="")
    assert len(store) == 4
