"""MemoryStore paths the README promises that the other store tests do not run: the closed
store, update() edge cases, search edge inputs, links() of an unknown id, refresh() of a
reader, forgetting by deletion and stale-cluster archiving, the confusion and drift
re-organisation triggers through the store, both SLM scheduling modes, and bad files handed
to ``MemoryStore.open``. Every refused call is checked to leave the store as it was (files
byte for byte, or everything a caller can observe)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import threading
import time

import numpy as np
import pytest

from clag_fast.config import SLMConfig, StoreConfig
from clag_fast.decay import ForgettingPolicy
from clag_fast.errors import StoreFormatError
from clag_fast.store import MemoryStore
from llm_fixtures import completion
from store_helpers import DIM, files_snapshot, store_state, texts_for, topic_vectors

FAST = StoreConfig(min_memories_to_cluster=50, organize_every=0, slm="off")


def open_store(path, config=FAST, **kw):
    return MemoryStore.open(path, config=config, embedder=False, slm=False, **kw)


def fill(store, n=120, topics=6, seed=0, spread=0.35):
    vecs, top = topic_vectors(n, topics, seed=seed, spread=spread)
    return store.add_many(texts_for(top), embeddings=vecs), vecs, top


class _HashEmbedder:
    """Deterministic vectors per text, for tests that search by text."""

    def encode(self, texts):
        out = np.zeros((len(texts), DIM), np.float32)
        for i, t in enumerate(texts):
            out[i] = np.random.default_rng(sum(t.encode()) + len(t)).standard_normal(DIM)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


# -- the closed store ---------------------------------------------------------------------
def test_every_call_on_a_closed_store_says_it_is_closed(tmp_path):
    s = open_store(tmp_path / "s")
    ids, vecs, _ = fill(s, 20)
    s.close()
    s.close()  # closing twice is harmless
    calls = [
        lambda: s.add("x", embedding=vecs[0]),
        lambda: s.add_many(["x"], embeddings=vecs[:1]),
        lambda: s.update(ids[0], metadata={"a": 1}),
        lambda: s.delete(ids[0]),
        lambda: s.search(vecs[0]),
        lambda: s.search_many(vecs[:2]),
        lambda: s.get(ids[0]),
        lambda: s.links(ids[0]),
        lambda: s.clusters(),
        lambda: s.stats(),
        lambda: s.organize(),
        lambda: s.forget(),
        lambda: s.flush(),
        lambda: s.refresh(),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="closed"):
            call()
    assert "closed" in repr(s)
    with open_store(tmp_path / "s") as again:  # nothing was lost by closing
        assert len(again) == 20 and again.get(ids[3]).text.startswith("memory 3 about topic")


# -- update -------------------------------------------------------------------------------
def test_update_with_neither_argument_is_refused_and_changes_nothing(tmp_path):
    with open_store(tmp_path / "s") as s:
        ids, vecs, _ = fill(s, 60)
        before = store_state(s)
        with pytest.raises(ValueError, match="text= and/or metadata="):
            s.update(ids[0])
        with pytest.raises(ValueError, match="text= and/or metadata="):
            s.update(ids[0], embedding=vecs[1])  # a vector alone is not a change either
        assert store_state(s) == before


def test_metadata_only_update_keeps_text_vector_and_clusters(tmp_path):
    with open_store(tmp_path / "s") as s:
        ids, vecs, _ = fill(s, 60, topics=3)
        m0 = s.get(ids[5])
        rows_before = s.stats()["vector_rows"]
        hits_before = [(h.memory_id, h.score) for h in s.search(vecs[5], k=5, mode="flat")]
        s.update(ids[5], metadata={"day": 3, "tags": ["x"]})
        m1 = s.get(ids[5])
        assert m1.metadata == {"day": 3, "tags": ["x"]} and m0.metadata is None
        assert (m1.text, m1.clusters, m1.created_at) == (m0.text, m0.clusters, m0.created_at)
        assert s.stats()["vector_rows"] == rows_before, "no new vector row for a metadata change"
        assert [(h.memory_id, h.score) for h in s.search(vecs[5], k=5, mode="flat")] == hits_before
        assert s.search(vecs[5], k=1, mode="flat")[0].metadata == {"day": 3, "tags": ["x"]}
        # an empty dict is a change too (unlike metadata=None, which means "not this")
        s.update(ids[5], metadata={})
        assert s.get(ids[5]).metadata == {}
    with open_store(tmp_path / "s") as s:
        assert s.get(ids[5]).metadata == {} and s.get(ids[5]).text == m0.text


def test_refused_updates_leave_the_store_untouched(tmp_path):
    with open_store(tmp_path / "s") as s:
        ids, vecs, _ = fill(s, 60)
        before = store_state(s)
        for bad in (
            lambda: s.update(ids[0], text=""),
            lambda: s.update(ids[0], text="ok", embedding=np.full(DIM, np.nan, np.float32)),
            lambda: s.update(ids[0], text="ok", embedding=np.ones(DIM + 1, np.float32)),
            lambda: s.update(ids[0], metadata={"x": object()}),
            lambda: s.update(ids[0], metadata=["not", "a", "dict"]),
            lambda: s.update(10**9, metadata={"a": 1}),
        ):
            with pytest.raises((ValueError, TypeError, KeyError)):
                bad()
            assert store_state(s) == before


# -- search edge inputs ---------------------------------------------------------------------
def test_search_edge_inputs_are_refused_and_change_nothing(tmp_path):
    with MemoryStore.open(tmp_path / "s", config=FAST, embedder=_HashEmbedder(), slm=False) as s:
        fill(s, 60)
        before, searches = store_state(s), s.stats()["searches"]
        q = np.ones(DIM, np.float32)
        with pytest.raises(ValueError, match="n_probe"):
            s.search(q, n_probe=0)
        with pytest.raises(ValueError, match="n_probe"):
            s.search_many(q[None, :], n_probe=0)
        with pytest.raises(ValueError, match="empty"):
            s.search("")
        with pytest.raises(ValueError, match="empty"):
            s.search("  \n\t")
        with pytest.raises(ValueError, match="empty"):
            s.search_many(["fine", ""])
        for bad in (np.nan, np.inf, -np.inf):
            v = q.copy()
            v[7] = bad
            with pytest.raises(ValueError, match="NaN or infinity"):
                s.search(v)
            with pytest.raises(ValueError):
                s.search_many(v[None, :])
        assert store_state(s) == before and s.stats()["searches"] == searches
        assert len(s.search("a fine query", k=3)) == 3  # still answers


@pytest.mark.parametrize("where", ["clustered", "filtered to nothing", "empty"])
def test_a_non_finite_query_vector_is_refused_on_every_search_path(tmp_path, where):
    # A clustered store answers a vector query in one native call, which checks the query;
    # a filter that leaves nothing, or an empty store, answers without it: both must refuse.
    with open_store(tmp_path / "s") as s:
        if where != "empty":
            fill(s, 200)
            s.organize()
            assert s.stats()["clusters"] > 0
        ns = "nobody" if where == "filtered to nothing" else None
        for bad in (np.nan, np.inf, -np.inf):
            v = np.ones(DIM, np.float32)
            v[3] = bad
            with pytest.raises(ValueError, match="NaN or infinity"):
                s.search(v, namespace=ns)
        ok = s.search(np.ones(DIM, np.float32), k=3, namespace=ns)
        assert len(ok) == (3 if where == "clustered" else 0)


def test_links_of_an_unknown_id_is_a_keyerror(tmp_path):
    with open_store(tmp_path / "s") as s:
        ids, _, _ = fill(s, 10)
        assert s.links(ids[0]) == []
        with pytest.raises(KeyError, match="no memory with id"):
            s.links(10**9)
        s.delete(ids[0])
        with pytest.raises(KeyError):
            s.links(ids[0])
        with pytest.raises(TypeError):
            s.links("1")


# -- refresh ------------------------------------------------------------------------------
def test_refresh_shows_a_reader_what_the_writer_committed(tmp_path):
    with open_store(tmp_path / "s") as w:
        ids, vecs, _ = fill(w, 80, topics=4)
        w.flush()
        with open_store(tmp_path / "s", read_only=True) as r:
            assert len(r) == 80
            new_vec = -vecs[0]
            new = w.add("added after the reader opened", embedding=new_vec)
            w.delete(ids[1])
            w.flush()
            assert len(r) == 80 and r.search(new_vec, k=1, mode="flat")[0].memory_id != new  # as of its open
            r.refresh()
            assert len(r) == 80
            hit = r.search(new_vec, k=1, mode="flat")[0]
            assert hit.memory_id == new and hit.text == "added after the reader opened"
            assert ids[1] not in {h.memory_id for h in r.search(vecs[1], k=5, mode="flat")}
            assert r.search(new_vec, k=1)[0].memory_id == new  # two-stage too
        before = store_state(w)
        w.refresh()  # a writer sees its own writes: refresh is a no-op
        assert store_state(w) == before


# -- forgetting ---------------------------------------------------------------------------
def test_prune_action_delete_removes_faded_memories_for_good(tmp_path):
    policy = ForgettingPolicy(half_life_days=1.0, prune_below=0.3, prune_action="delete")
    cfg = StoreConfig(forgetting=policy, organize_every=0, slm="off", cache_size=0)
    vecs, _ = topic_vectors(3, 1)
    with open_store(tmp_path / "s", cfg) as s:
        keep, fade = s.add("kept words", embedding=vecs[0]), s.add("faded words", embedding=vecs[1])
        rows = s._state.rows
        r = int(np.flatnonzero(rows.memory_id[: rows.n] == fade)[0])
        rows.created_at[r] -= 3 * 86400  # what the store would see three days later
        report = s.forget()
        assert report == {"pruned": 1, "action": "delete", "archived_clusters": []}
        with pytest.raises(KeyError):
            s.get(fade)  # deleted, not archived
        assert s.stats()["archived"] == 0 and len(s) == 1
        assert [h.memory_id for h in s.search(vecs[1], k=5, mode="flat")] == [keep]
        assert [h.memory_id for h in s.search_many(vecs[1:2], k=5, mode="flat")[0]] == [keep]
    with open_store(tmp_path / "s", cfg) as s:
        with pytest.raises(KeyError):
            s.get(fade)
        assert len(s) == 1


def test_clusters_no_query_touched_are_archived(tmp_path):
    policy = ForgettingPolicy(archive_clusters_after_days=10)
    cfg = StoreConfig(min_memories_to_cluster=50, organize_every=0, slm="off", forgetting=policy, cache_size=0)
    with open_store(tmp_path / "s", cfg) as s:
        ids, vecs, top = fill(s, 120, topics=4)
        s.organize()
        assert s.forget()["archived_clusters"] == []  # everything is fresh
        with s._catalog.transaction():  # what the store would see 20 days later
            s._catalog.db.execute("UPDATE clusters SET created_at = created_at - 20 * 86400")
        hit = s.search(vecs[0], k=3)  # touched now
        touched = {h.cluster_id for h in hit}
        report = s.forget()
        archived = set(report["archived_clusters"])
        assert archived and not (archived & touched)
        live_clusters = {c.id for c in s.clusters()}
        assert touched <= live_clusters and not (archived & live_clusters)
        for mid in ids:
            if s.get(mid).archived:
                assert mid not in {h.memory_id for h in s.search(vecs[ids.index(mid)], k=3, mode="flat")}
        n_archived = sum(s.get(m).archived for m in ids)
        assert n_archived == s.stats()["archived"] > 0
        assert n_archived == 120 - len(s)
        assert all(not s.get(h.memory_id).archived for h in hit)
        assert s.forget()["archived_clusters"] == []  # nothing left to archive


# -- re-organisation triggers through the store --------------------------------------------
def test_confusion_reorganises_at_the_next_write_without_a_worker(tmp_path):
    cfg = StoreConfig(min_memories_to_cluster=50, organize_every=0, slm="off", cache_size=0)
    with open_store(tmp_path / "s", cfg) as s:
        fill(s, 100)
        orgs = s.stats()["organizations"]
        rng = np.random.default_rng(5)
        for _ in range(cfg.slm.confusion_window):  # queries like no stored memory
            s.search(rng.standard_normal(DIM).astype(np.float32), k=3)
        assert s.stats()["organizations"] == orgs, "a search never runs the re-organisation itself"
        s.add("one more", embedding=topic_vectors(1, 6)[0][0])
        assert s.stats()["organizations"] == orgs + 1
        # the trigger was reset: one more confused search does not fire it again
        s.search(rng.standard_normal(DIM).astype(np.float32), k=3)
        s.add("and another", embedding=topic_vectors(1, 6)[0][0])
        assert s.stats()["organizations"] == orgs + 1


def test_confident_searches_do_not_reorganise(tmp_path):
    with open_store(tmp_path / "s") as s:
        ids, vecs, _ = fill(s, 100)
        orgs = s.stats()["organizations"]
        for v in vecs[:10]:
            s.search(v, k=3)
        s.add("one more", embedding=vecs[0])
        assert s.stats()["organizations"] == orgs


def test_drift_reorganises(tmp_path):
    window = SLMConfig().drift_window
    cfg = StoreConfig(min_memories_to_cluster=50, organize_every=0, slm="off")
    with open_store(tmp_path / "s", cfg) as s:
        fill(s, 100, seed=3)
        orgs = s.stats()["organizations"]
        # The same topic centres (same seed and topic count): first memories that fit them
        # closely, then ones that fit them much worse (but not so badly that they open
        # clusters of their own).
        close, top = topic_vectors(window, 6, seed=3, spread=0.05)
        loose, top2 = topic_vectors(window, 6, seed=3, spread=0.5)
        s.add_many(texts_for(top), embeddings=close)
        assert s.stats()["organizations"] == orgs, "no drift yet"
        s.add_many(texts_for(top2), embeddings=loose)
        assert s.stats()["organizations"] == orgs + 1


def test_steady_adds_do_not_count_as_drift(tmp_path):
    window = SLMConfig().drift_window
    cfg = StoreConfig(min_memories_to_cluster=50, organize_every=0, slm="off")
    with open_store(tmp_path / "s", cfg) as s:
        fill(s, 100, seed=3)
        orgs = s.stats()["organizations"]
        for i in range(2):
            v, top = topic_vectors(window, 6, seed=3, spread=0.35)
            s.add_many(texts_for(top), embeddings=v)
        assert s.stats()["organizations"] == orgs


# -- SLM scheduling: background worker or inline, same decisions -----------------------------
def _find(obj, key):
    """The first value of ``key`` anywhere in a JSON-like object (the answer schema's shape
    differs by how the client sends it)."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        obj = list(obj.values())
    if isinstance(obj, list):
        for v in obj:
            found = _find(v, key)
            if found is not None:
                return found
    return None


def _profiles_only(body):
    """Profiles: the SLM picks "memory" first among each group's candidate phrases (the vector
    label leads with "topic N", so a cluster labelled "memory · ..." was profiled by the SLM);
    anything else gets an unusable answer."""
    if "shared by a group" in body["messages"][0]["content"]:
        groups = _find(body.get("response_format", {}), "prefixItems") or []
        picks = [["memory"] + [p for p in g["items"]["enum"] if p != "memory"][:1] if "memory" in g["items"]["enum"]
                 else g["items"]["enum"][::-1][:2] for g in groups]
        return 200, completion(json.dumps({"groups": picks}))
    return 200, completion("not json")


@pytest.mark.parametrize("background", [True, False])
def test_background_and_inline_slm_work_apply_the_same_decisions(tmp_path, fake_server, background):
    fake_server.behaviour = _profiles_only
    cfg = StoreConfig(min_memories_to_cluster=40, organize_every=0,
                      slm=SLMConfig(background=background, profile_min_size=2))
    vecs, top = topic_vectors(120, 3, seed=5, spread=0.3)
    with MemoryStore.open(tmp_path / "s", config=cfg, embedder=False, slm=fake_server.url) as s:
        workers = [t for t in threading.enumerate() if t.name == "clag-fast-organizer"]
        assert bool(workers) == background
        s.add_many(texts_for(top), embeddings=vecs)
        s.flush()  # waits for the worker in background mode
        st = s.stats()
        assert st["slm_pending"] == {"routes": 0, "jobs": 0}
        clusters = s.clusters()
        assert clusters and all(c.summary.startswith("memory · ") for c in clusters if c.size >= 2)
        assert st["slm_usage"]["profiles"]["slm"] == st["slm_usage"]["decisions"]["profile"] >= 1
        assert st["slm_usage"]["unavailable"] is None
        assert sum(c.size for c in clusters) >= 120
    assert not [t for t in threading.enumerate() if t.name == "clag-fast-organizer" and t.is_alive()]


# -- bad files through MemoryStore.open: refused, and left exactly as they were ---------------
@pytest.fixture(scope="module")
def good_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("good") / "s"
    with open_store(path) as s:
        fill(s, 80, topics=4)
    return path


def _garbage_db(p):
    (p / "memories.db").write_bytes(b"this is not an SQLite database\n" * 64)


def _foreign_db(p):
    (p / "memories.db").unlink()
    con = sqlite3.connect(p / "memories.db")
    con.execute("CREATE TABLE recipes (name TEXT)")
    con.execute("INSERT INTO recipes VALUES ('bread')")
    con.commit()
    con.close()


def _newer_schema(p):
    con = sqlite3.connect(p / "memories.db")
    con.execute("PRAGMA user_version=99")
    con.commit()
    con.close()


def _vectors_garbage(p):
    (p / "index" / "vectors.f32").write_bytes(b"x" * 5000)


def _vectors_truncated(p):
    f = p / "index" / "vectors.f32"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _vectors_bad_magic(p):
    f = p / "index" / "vectors.f32"
    b = bytearray(f.read_bytes())
    b[0] ^= 0xFF
    f.write_bytes(bytes(b))


def _vectors_lost(p):
    (p / "index" / "vectors.f32").unlink()


@pytest.mark.parametrize("damage, error, message", [
    (_garbage_db, StoreFormatError, "not a clag_fast store database"),
    (_foreign_db, StoreFormatError, "another application"),
    (_newer_schema, StoreFormatError, "newer"),
    (_vectors_garbage, OSError, "vectors.f32: not a clag_fast vector file"),
    (_vectors_bad_magic, OSError, "vectors.f32: not a clag_fast vector file"),
    (_vectors_truncated, OSError, "vectors.f32: truncated or corrupt"),
    (_vectors_lost, StoreFormatError, "vector file was lost"),
])
@pytest.mark.parametrize("read_only", [False, True])
def test_bad_store_files_are_refused_and_left_untouched(tmp_path, good_store, damage, error, message, read_only):
    path = tmp_path / "s"
    shutil.copytree(good_store, path)
    damage(path)
    before = files_snapshot(path)
    with pytest.raises(error, match=message):
        open_store(path, read_only=read_only)
    with pytest.raises(error, match=message):  # refused again: the first refusal repaired nothing
        open_store(path, read_only=read_only)
    after = files_snapshot(path)
    if read_only:
        # A reader of a WAL database needs SQLite's shared-memory index beside it and may
        # leave it (and an empty log) behind: they hold no data.
        assert after.pop("memories.db-wal", b"") == b""
        after.pop("memories.db-shm", None)
    assert after.keys() == before.keys(), "files created or removed by a refused open"
    changed = [name for name in before if after[name] != before[name]]
    assert not changed, f"a refused open changed {changed}"


def test_a_damaged_cluster_file_is_repaired_and_the_memories_kept(tmp_path, good_store):
    """clusters.bin is derived state: damage is not refused but set aside and rebuilt from the
    database; the memories and the vector file are untouched."""
    path = tmp_path / "s"
    shutil.copytree(good_store, path)
    (path / "index" / "clusters.bin").write_bytes(b"zz" * 100)
    vectors = (path / "index" / "vectors.f32").read_bytes()
    with open_store(path) as s:
        texts = sorted(s.get(m).text for m in range(1, 81))
        assert len(s) == 80 and sum(c.size for c in s.clusters()) >= 80
    assert (path / "index" / "vectors.f32").read_bytes() == vectors
    assert any(p.name.startswith("clusters.bin.corrupt") for p in (path / "index").iterdir())
    with open_store(path) as s:
        assert sorted(s.get(m).text for m in range(1, 81)) == texts


# -- deletes reach the lexical index ----------------------------------------------------------
def test_deleted_memories_leave_the_lexical_statistics(tmp_path):
    """After delete(), BM25 scores are those of a store that never held the memory: its
    words no longer count in the term statistics (checked on the store's LexicalIndex right
    after the delete, and through search)."""
    from clag_fast.eval.runner import HashingEmbedder

    common = [f"note {i} about gardening tomatoes" for i in range(20)] + ["rare quokka sighting",
                                                                         "another quokka note"]
    doomed = "quokka quokka zoo quokka"
    cfg = StoreConfig(min_memories_to_cluster=50, organize_every=0, slm="off", cache_size=0,
                      lexical_fusion="bound")

    def lexical_scores(store, word):
        lex = store._searcher.lexical
        m = lex.score(word, None, None, 10, np.empty(0, np.int64))
        rows = store._state.rows
        return {store.get(int(rows.memory_id[r])).text: round(float(s), 5)
                for r, s in zip(m.rows.tolist(), m.scores.tolist()) if r >= 0}

    def search_scores(store, word):
        return {h.text: round(h.score, 5) for h in store.search(word, k=5, mode="flat", lexical_weight=1.0)
                if word in h.text}

    with MemoryStore.open(tmp_path / "a", config=cfg, embedder=HashingEmbedder(), slm=False) as a, \
            MemoryStore.open(tmp_path / "b", config=cfg, embedder=HashingEmbedder(), slm=False) as b:
        ids = a.add_many(common[:10] + [doomed] + common[10:])
        b.add_many(common)
        before = lexical_scores(a, "quokka")
        a.delete(ids[10])
        after = lexical_scores(a, "quokka")
        assert doomed in before and doomed not in after
        assert after == lexical_scores(b, "quokka") and len(after) == 2
        assert after != {t: s for t, s in before.items() if t != doomed}, "the statistics changed"
        assert search_scores(a, "quokka") == search_scores(b, "quokka")


def test_single_vector_search_answers_as_the_batch_path_does(tmp_path, monkeypatch):
    """search(vector) takes the single-vector path (one native call); search_many takes the
    batch path. Both give the same hits, under no filter, filters, deletions, a decay policy,
    a fixed n_probe, a k past the probed rows and on an unclustered store."""
    policy = ForgettingPolicy(half_life_days=3.0)
    config = StoreConfig(min_memories_to_cluster=50, organize_every=0, slm="off", forgetting=policy)
    vecs, top = topic_vectors(400, 8, seed=3)
    queries = topic_vectors(12, 8, seed=5)[0]
    from clag_fast.index import VectorIndex

    native_one = VectorIndex.search_one
    taken = []

    def counted(self, *args, **kwargs):
        taken.append(1)
        return native_one(self, *args, **kwargs)

    monkeypatch.setattr(VectorIndex, "search_one", counted)

    def same(s, **kw):
        for qv in queries:
            one = s.search(qv, **{"k": 7, **kw})
            batch = s.search_many(qv[None, :], **{"k": 7, **kw})[0]
            assert [h.memory_id for h in one] == [h.memory_id for h in batch]
            assert [h.score for h in one] == pytest.approx([h.score for h in batch], abs=1e-5)
            assert [h.cluster_id for h in one] == [h.cluster_id for h in batch]
            assert (one.mode, one.scanned, one.candidates) == (batch.mode, batch.scanned, batch.candidates)
            assert one.clusters_probed == batch.clusters_probed
            assert len(one) == min(kw.get("k", 7), one.candidates)
        return one

    with open_store(tmp_path / "s", config) as s:
        s.add_many(texts_for(top[:30]), embeddings=vecs[:30], namespaces="a")
        assert same(s).mode == "flat"  # not clustered yet
        for ns in ("a", "b"):
            idx = [i for i in range(30, 400) if (ns == "a") == bool(i % 3)]
            s.add_many(texts_for(top[idx], idx[0]), embeddings=vecs[idx], namespaces=ns)
        s.organize()
        s.delete(5)
        for kw in (dict(), dict(namespace="b"), dict(n_probe=2), dict(k=300), dict(kind="note")):
            taken.clear()
            hits = same(s, **kw)
            assert kw != dict() or hits.mode == "two_stage"
            if kw in (dict(), dict(namespace="b"), dict(n_probe=2)):
                assert taken, f"{kw}: the single-vector path was not taken"
        before = s.stats()["searches"]
        s.search(queries[1], k=3)
        assert s.stats()["searches"] == before + 1


def test_search_after_writes_answers_as_a_fresh_open(tmp_path):
    # A search keeps the eligible rows of each filter and their count up to date with the
    # rows each write changed (not rebuilt per write); after adds, updates and deletes in
    # two namespaces it must answer as the same store freshly opened (everything rebuilt
    # from the database), filtered or not.
    path = tmp_path / "s"
    vecs, top = topic_vectors(360, 8, seed=3)
    queries = topic_vectors(12, 8, seed=9)[0]
    filters = [{}, {"namespace": "a"}, {"namespace": "b"}, {"kind": "note"}, {"namespace": "a", "kind": "note"},
               {"namespace": "nobody"}, {"where": {"n": 1}}, {"namespace": "a", "where": {"n": {"$gte": 1}}}]
    meta = [{"n": i % 3} for i in range(360)]

    def searches(s):
        return [s.search(q, k=8, **f) for q in queries for f in filters]

    with open_store(path) as s:
        ids = s.add_many(texts_for(top[:200]), embeddings=vecs[:200], namespaces="a", metadata=meta[:200])
        s.organize()
        searches(s)  # the filters' derived state exists before the writes below
        ids += s.add_many(texts_for(top[200:300], 200), embeddings=vecs[200:300], namespaces="b", kinds="note",
                          metadata=meta[200:300])
        for i in range(300, 330):
            ids.append(s.add(f"single {i}", embedding=vecs[i], namespace="ab"[i % 2], kind="note", metadata=meta[i]))
            s.search(queries[i % len(queries)], namespace="a")
            s.search(queries[i % len(queries)], kind="note")
        s.update(ids[3], text="moved", embedding=vecs[340])
        s.update(ids[7], metadata={"n": 1})  # metadata alone: the rows' columns do not change
        searches(s)
        s.delete(ids[5])
        assert s.delete_many(ids[10:39]) == 29
        assert s.delete_many(ids[205:210]) == 5
        searches(s)
        ids += s.add_many(texts_for(top[330:340], 330), embeddings=vecs[330:340], namespaces="a", kinds="note")
        got = searches(s)
    with open_store(path) as s:
        want = searches(s)
    assert sum(len(g) for g in got) > 0
    for g, w in zip(got, want):
        assert [h.memory_id for h in g] == [h.memory_id for h in w]
        np.testing.assert_allclose([h.score for h in g], [h.score for h in w], rtol=1e-6)
        assert g.candidates == w.candidates
    assert got[0].candidates == len(ids) - 35


def test_decay_weights_follow_writes_row_by_row(tmp_path, monkeypatch):
    # Between full rebuilds (one a minute), the weights a search uses are brought up to date
    # for the rows each write changed, at the rebuild's clock: they must equal a full
    # computation at that clock. A test clock makes the first memories 3 days old (weight
    # 2**-1.5 at a 2-day half-life) and the later ones new; no search runs in between (a
    # search's accesses count only at the next full rebuild, by design).
    clock = [1.7e9]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    policy = ForgettingPolicy(half_life_days=2.0)
    vecs, top = topic_vectors(360, 8, seed=3)
    with open_store(tmp_path / "s", config=dataclasses.replace(FAST, forgetting=policy)) as s:
        searcher, rows = s._searcher, s._state.rows
        ids = s.add_many(texts_for(top[:200]), embeddings=vecs[:200])
        s.organize()
        clock[0] += 3 * 86400
        searcher._decay_weights()  # a full build at this clock
        built_at = clock[0]
        clock[0] += 10
        ids += s.add_many(texts_for(top[200:300], 200), embeddings=vecs[200:300])
        for i in range(300, 330):
            ids.append(s.add(f"single {i}", embedding=vecs[i]))
            searcher._decay_weights()
        s.update(ids[3], text="moved", embedding=vecs[340])  # keeps its creation time: old
        s.delete_many(ids[10:39])
        ids += s.add_many(texts_for(top[330:340], 330), embeddings=vecs[330:340])
        w = searcher._decay_weights()
        assert searcher._weights[1] == built_at  # no full rebuild happened
        want = rows.weights(policy, built_at)
        live = rows.live[: rows.n]
        np.testing.assert_allclose(w[live], want[live], rtol=1e-6)
        assert len(w) == rows.n and np.isclose(w[live], 2 ** -1.5).sum() == 200 - 29 - 1 + 1
        clock[0] += 61  # a minute on: everything is rebuilt at the new clock
        searcher._decay_weights()
        assert searcher._weights[1] == clock[0]
