"""A large ``add_many`` writes its SQLite rows on the catalog's helper thread while the batch
is routed (``MemoryStore._route_while``). These tests check that this path stores exactly what
the one-thread path stores, that the batch commits only after the helper's last row, and that
a failure on either side, or Ctrl-C, leaves the store as it was."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Callable

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
                            embedder=False, slm=False)


def _batch(n, start, seed):
    vecs, _ = topic_vectors(n, 12, seed=seed, dim=DIM)
    return [f"memory {i}" for i in range(start, start + n)], vecs


@contextmanager
def _clustered(path, seed):
    """An open store holding the first 100 of ``N`` memories (its cold start: clusters to
    route into), with all ``N`` texts and vectors."""
    texts, vecs = _batch(N, 0, seed=seed)
    with _open(path) as s:
        s.add_many(texts[:100], embeddings=vecs[:100])
        yield s, texts, vecs


def _fail_routing(*a, **k):
    raise RuntimeError("routing failed")


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


def _slow_insert(monkeypatch, done: threading.Event, pause: float = 0.3,
                 at_pause: Callable[[], None] | None = None):
    """``Catalog.insert_memories`` that writes the first half of its rows, pauses (calling
    ``at_pause`` first), writes the second half, then sets ``done``: a write still running
    when the caller moves on."""
    real = Catalog.insert_memories

    def slow(self, ids, texts, kinds, namespaces, metadata, now, rows, keys=None, conversation=None):
        h = len(ids) // 2

        def part(a, b):
            real(self, ids[a:b], texts[a:b], kinds[a:b], namespaces[a:b], metadata[a:b], now,
                 rows[a:b], None if keys is None else keys[a:b],
                 {name: values[a:b] for name, values in (conversation or {}).items()})

        part(0, h)
        if at_pause is not None:
            at_pause()
        time.sleep(pause)
        part(h, len(ids))
        done.set()

    monkeypatch.setattr(Catalog, "insert_memories", slow)


def test_a_reader_never_sees_a_batch_that_is_rolled_back(tmp_path, monkeypatch):
    """``get``/``get_many``/``links``/``stats`` take no lock and read through the catalog's
    read-only connection: on the writer's own one they would read its open transaction, here
    a batch that is then rolled back. (That they do not wait for the write lock is
    ``test_store.test_vector_organisations_in_the_worker_when_asked``.)"""
    texts, vecs = _batch(N, 0, seed=10)
    with _open(tmp_path / "s") as s:
        kept = s.add_many(texts[:100], embeddings=vecs[:100], keys=[f"k{i}" for i in range(100)])
        half = threading.Event()
        real = Catalog.insert_memories

        def insert_then_pause(self, *a, **k):
            real(self, *a, **k)
            half.set()
            time.sleep(0.5)  # the batch's rows are in the open transaction, not committed

        monkeypatch.setattr(Catalog, "insert_memories", insert_then_pause)
        monkeypatch.setattr(placement, "route_new_rows", _fail_routing)
        seen: dict[str, object] = {}

        def reader():
            half.wait(10)
            try:
                seen["get"] = s.get(kept[-1] + 1).text
            except KeyError as e:
                seen["get"] = e
            seen["get_many"] = [m.text for m in s.get_many([kept[-1] + 1, kept[-1] + 2])]
            seen["by_key"] = [m.text for m in s.get_many(keys=["k0", "k100"])]
            seen["stats"] = s.stats()["archived"]

        t = threading.Thread(target=reader)
        t.start()
        with pytest.raises(RuntimeError, match="routing failed"):
            s.add_many(texts[100:], embeddings=vecs[100:], keys=[f"k{i}" for i in range(100, N)])
        t.join(10)
        assert isinstance(seen["get"], KeyError), seen["get"]
        assert seen["get_many"] == [] and seen["by_key"] == [texts[0]] and seen["stats"] == 0
        monkeypatch.undo()
        assert s.get(kept[0]).text == texts[0] and s.links(kept[0]) == []
        with pytest.raises(KeyError):
            s.links(kept[-1] + 1)


def _rows_in_database(path) -> int:
    with closing(sqlite3.connect(path / "memories.db")) as db:
        return db.execute("SELECT COUNT(*) FROM memories").fetchone()[0]


def test_the_batch_commits_only_after_the_helper_wrote_it(tmp_path, monkeypatch):
    with _clustered(tmp_path / "s", seed=5) as (s, texts, vecs):
        done = threading.Event()
        _slow_insert(monkeypatch, done)
        seen: list[bool] = []
        real_record = placement.record_placement

        def record(*a, **k):
            seen.append(done.is_set())
            return real_record(*a, **k)

        monkeypatch.setattr(placement, "record_placement", record)
        s.add_many(texts[100:], embeddings=vecs[100:])
        assert seen == [True]  # recorded (and committed) after the helper's last row
        assert len(s) == N
    assert _rows_in_database(tmp_path / "s") == N


def test_failed_routing_waits_for_the_write_then_rolls_back(tmp_path, monkeypatch):
    with _clustered(tmp_path / "s", seed=4) as (s, texts, vecs):
        done = threading.Event()
        _slow_insert(monkeypatch, done)
        monkeypatch.setattr(placement, "route_new_rows", _fail_routing)
        with pytest.raises(RuntimeError, match="routing failed"):
            s.add_many(texts[100:], embeddings=vecs[100:])
        # The rollback ran after the helper's write (not beside it): its rows are gone.
        assert done.is_set()
        assert len(s) == 100 and _rows_in_database(tmp_path / "s") == 100
        monkeypatch.undo()
        s.add_many(texts[100:], embeddings=vecs[100:])
        assert len(s) == N
    with _open(tmp_path / "s") as s:
        assert len(s) == N


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="SIGINT goes to the main thread")
def test_ctrl_c_during_the_write_commits_nothing(tmp_path, monkeypatch):
    """Ctrl-C while the helper is between its statements: the caller keeps waiting for it, so
    the rollback takes every row it wrote (rolled back while it ran, its later rows would be
    committed one by one)."""
    with _clustered(tmp_path / "s", seed=6) as (s, texts, vecs):
        done = threading.Event()
        # The helper sends the Ctrl-C itself, between its two statements, the moment this test
        # is about. (With a 0.3 s timer instead, one CI simulation saw add_many return without
        # it, in a full run; 21 runs of the test alone or with its file could not repeat that.)
        _slow_insert(monkeypatch, done, pause=0.5, at_pause=lambda: os.kill(os.getpid(), signal.SIGINT))
        # Python's own Ctrl-C handler, whatever an earlier test in the process installed.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with pytest.raises(KeyboardInterrupt):
                s.add_many(texts[100:], embeddings=vecs[100:])
        finally:
            signal.signal(signal.SIGINT, previous)
        assert done.is_set()
        assert len(s) == 100 and _rows_in_database(tmp_path / "s") == 100
        monkeypatch.undo()
        s.add_many(texts[100:], embeddings=vecs[100:])  # the store still takes writes
        assert len(s) == N
    assert _rows_in_database(tmp_path / "s") == N


def test_overlap_stores_what_one_thread_stores(tmp_path, monkeypatch):
    texts, vecs = _batch(N, 0, seed=7)
    meta = [{"i": i} for i in range(N)]
    got = []
    for name, overlap in (("two", memory_store.OVERLAP_ROWS), ("one", 10**9)):
        monkeypatch.setattr(memory_store, "OVERLAP_ROWS", overlap)
        with _open(tmp_path / name) as s:
            s.add_many(texts[:100], embeddings=vecs[:100])
            ids = s.add_many(texts[100:], embeddings=vecs[100:], metadata=meta[100:])
            got.append([(m.memory_id, m.text, m.metadata, m.clusters) for m in s.get_many(ids)])
    assert got[0] == got[1]


def test_close_stops_the_helper_thread(tmp_path):
    def helpers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("clag-fast-sqlite")}

    before = helpers()  # another test's store still open is not this one's to stop
    texts, vecs = _batch(N, 0, seed=8)
    s = _open(tmp_path / "s")
    s.add_many(texts, embeddings=vecs)
    assert helpers() - before
    s.close()
    assert not helpers() - before


def test_a_large_batch_at_interpreter_exit_is_written(tmp_path):
    """From an ``atexit`` handler the helper thread cannot start (the executor refuses new work
    once the interpreter shuts down): the batch is written on the caller's thread."""
    code = f"""
import atexit, sys
import numpy as np
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_store_overlap import _batch, _open, N
texts, vecs = _batch(N, 0, seed=9)
s = _open({str(tmp_path / "s")!r})
s.add_many(texts[:100], embeddings=vecs[:100])

def at_exit():
    s.add_many(texts[100:], embeddings=vecs[100:])
    s.close()
    print("stored", N)

atexit.register(at_exit)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"stored {N}" in out.stdout
    assert _rows_in_database(tmp_path / "s") == N


def test_ctrl_c_while_the_write_is_handed_over_writes_nothing(tmp_path, monkeypatch):
    """The writer thread can start before ``submit`` returns: a Ctrl-C at that moment must not
    leave it writing into a transaction the caller rolls back."""
    from concurrent.futures import ThreadPoolExecutor

    real = ThreadPoolExecutor.submit

    def submit_then_interrupt(self, fn, *args, **kwargs):
        real(self, fn, *args, **kwargs)  # queued, and the thread may already have taken it
        raise KeyboardInterrupt

    with _clustered(tmp_path / "s", seed=11) as (s, texts, vecs):
        monkeypatch.setattr(ThreadPoolExecutor, "submit", submit_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            s.add_many(texts[100:], embeddings=vecs[100:])
        monkeypatch.undo()
        assert len(s) == 100 and _rows_in_database(tmp_path / "s") == 100
        s.add_many(texts[100:], embeddings=vecs[100:])
        assert len(s) == N
    assert _rows_in_database(tmp_path / "s") == N
