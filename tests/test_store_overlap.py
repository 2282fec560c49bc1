"""A large ``add_many`` writes its SQLite rows on the catalog's helper thread while the batch
is routed (``MemoryStore._route_while``). These tests check that this path stores exactly what
the one-thread path stores, and that a failure on either side leaves the store as it was."""

from __future__ import annotations

import sqlite3
import threading

import numpy as np
import pytest

from clag_fast import MemoryStore, StoreConfig
from clag_fast.store import memory_store, placement
from clag_fast.store.catalog import Catalog

from store_helpers import topic_vectors

DIM = 16
N = memory_store.OVERLAP_ROWS + 500  # large enough to take the helper thread


def _open(path):
    return MemoryStore.open(path, config=StoreConfig(dim=DIM, min_memories_to_cluster=50),
                            embedder=False, llm=False)


def _batch(n, start, seed):
    vecs, _ = topic_vectors(n, 12, seed=seed, dim=DIM)
    return [f"memory {i}" for i in range(start, start + n)], vecs


def _writer_threads(monkeypatch):
    """Record the thread every ``Catalog.insert_memories`` call runs on."""
    seen: list[str] = []
    real = Catalog.insert_memories

    def spy(self, *a, **k):
        seen.append(threading.current_thread().name)
        return real(self, *a, **k)

    monkeypatch.setattr(Catalog, "insert_memories", spy)
    return seen


def test_overlapped_batch_stores_and_routes_like_a_small_one(tmp_path, monkeypatch):
    seen = _writer_threads(monkeypatch)
    texts, vecs = _batch(N, 0, seed=1)
    with _open(tmp_path / "s") as s:
        s.add_many(texts[:100], embeddings=vecs[:100])  # the cold start: clusters to route into
        ids = s.add_many(texts[100:], embeddings=vecs[100:],
                         metadata=[{"i": i} for i in range(100, N)])
        got = s.get_many(ids)
        assert [m.text for m in got] == texts[100:]
        assert [m.metadata for m in got] == [{"i": i} for i in range(100, N)]
        assert all(m.clusters for m in got)  # routed: every memory has its clusters
        for i in (0, 700, len(ids) - 1):
            assert s.search(vecs[100 + i], k=1)[0].memory_id == ids[i]
        assert len(s) == N
    assert seen[0] == "MainThread" and seen[1].startswith("clag-fast-sqlite")
    with _open(tmp_path / "s") as s:  # what was committed survives a reopen
        assert len(s) == N
        assert s.get(ids[-1]).text == texts[-1]


def test_overlapped_upsert_batch_replaces_and_inserts(tmp_path, monkeypatch):
    """A batch mixing new memories and replacements (by key) takes the helper thread too."""
    seen = _writer_threads(monkeypatch)
    texts, vecs = _batch(N, 0, seed=2)
    keys = [f"k{i}" for i in range(N)]
    with _open(tmp_path / "s") as s:
        first = s.add_many(texts[:200], embeddings=vecs[:200], keys=keys[:200])
        new_texts = [t + " v2" for t in texts]
        ids = s.add_many(new_texts, embeddings=vecs, keys=keys)
        assert ids[:200] == first  # replaced memories keep their ids
        assert len(s) == N
        assert [m.text for m in s.get_many(ids)] == new_texts
    assert seen[-1].startswith("clag-fast-sqlite")


def test_failed_write_on_the_helper_thread_rolls_back(tmp_path, monkeypatch):
    texts, vecs = _batch(N, 0, seed=3)
    with _open(tmp_path / "s") as s:
        kept = s.add_many(texts[:100], embeddings=vecs[:100])
        real = Catalog.insert_memories

        def failing(self, *a, **k):
            if threading.current_thread().name.startswith("clag-fast-sqlite"):
                real(self, *a, **k)  # rows written, then the write fails: all must go
                raise sqlite3.OperationalError("disk I/O error")
            return real(self, *a, **k)

        monkeypatch.setattr(Catalog, "insert_memories", failing)
        with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
            s.add_many(texts[100:], embeddings=vecs[100:])
        assert len(s) == 100
        monkeypatch.setattr(Catalog, "insert_memories", real)
        more = s.add_many(texts[100:], embeddings=vecs[100:])  # the store still takes writes
        assert len(s) == N
        assert s.get(more[0]).text == texts[100]
    with _open(tmp_path / "s") as s:
        assert len(s) == N
        assert [m.text for m in s.get_many(kept)] == texts[:100]


def test_failed_routing_waits_for_the_write_then_rolls_back(tmp_path, monkeypatch):
    texts, vecs = _batch(N, 0, seed=4)
    with _open(tmp_path / "s") as s:
        s.add_many(texts[:100], embeddings=vecs[:100])
        written = threading.Event()
        real_insert = Catalog.insert_memories

        def slow_insert(self, *a, **k):
            real_insert(self, *a, **k)
            written.set()

        def failing_route(*a, **k):
            raise RuntimeError("routing failed")

        monkeypatch.setattr(Catalog, "insert_memories", slow_insert)
        monkeypatch.setattr(placement, "route_new_rows", failing_route)
        with pytest.raises(RuntimeError, match="routing failed"):
            s.add_many(texts[100:], embeddings=vecs[100:])
        # The rollback ran after the helper's write (not beside it): its rows are gone.
        assert written.is_set()
        assert len(s) == 100
        monkeypatch.undo()
        s.add_many(texts[100:], embeddings=vecs[100:])
        assert len(s) == N
    with _open(tmp_path / "s") as s:
        assert len(s) == N
