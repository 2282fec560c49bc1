"""The default SLM scheduling: with an SLM in use, its work runs in a background worker
(``SLMConfig.background=True``), so ``add()`` and ``organize()`` return after the vector
work; ``flush()``/``close()`` wait for the SLM's decisions; a managed server that cannot
start is reported once.

The fake server holds every answer until the test opens its gate, which turns "add() does
not wait for the SLM" into an ordering fact rather than a timing one.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import numpy as np
import pytest

from clag_fast.config import SLMConfig, StoreConfig
from clag_fast.errors import ServerUnavailable
from clag_fast.store import MemoryStore
from llm_fixtures import completion, fake_server  # noqa: F401
from store_helpers import texts_for, topic_vectors

# Memories read "memory 5 about topic 2": the vector label leads with "topic 2", the fake SLM
# picks "memory" first, so a cluster labelled "memory · ..." was profiled by the SLM.
SUMMARY = "memory"
HOLD_S = 20.0  # the longest the fake server holds an answer (a safety net: tests open the gate)


def _find(obj, key):
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            found = _find(v, key)
            if found is not None:
                return found
    elif isinstance(obj, list):
        for v in obj:
            found = _find(v, key)
            if found is not None:
                return found
    return None


def answer(body: dict):
    """Profiles pick SUMMARY; routes pick each note's last option (never the vector's first)."""
    system = body["messages"][0]["content"]
    if "shared by a group" in system:
        groups = _find(body.get("response_format", {}), "prefixItems") or []
        picks = [[SUMMARY] + [p for p in g["items"]["enum"] if p != SUMMARY][:1] if SUMMARY in g["items"]["enum"]
                 else g["items"]["enum"][::-1][:2] for g in groups]
        return 200, completion(json.dumps({"groups": picks}))
    if "sort notes into groups" in system:
        items = _find(body.get("response_format", {}), "prefixItems") or []
        return 200, completion(json.dumps({"choices": [item["enum"][-1] for item in items]}))
    return 200, completion("{}")


class Gate:
    """Holds the fake server's answers until ``open()``; counts requests and answers."""

    def __init__(self, server) -> None:
        self.opened = threading.Event()
        self.asked = threading.Event()
        self.answers = 0
        self._lock = threading.Lock()
        server.behaviour = self._behaviour

    def _behaviour(self, body: dict):
        self.asked.set()
        self.opened.wait(HOLD_S)
        with self._lock:
            self.answers += 1
        return answer(body)

    def open(self) -> None:
        self.opened.set()


@pytest.fixture
def gate(fake_server):  # noqa: F811
    g = Gate(fake_server)
    yield g
    g.open()  # never leave a server thread waiting


def config(**slm) -> StoreConfig:
    return StoreConfig(min_memories_to_cluster=30, organize_every=0,
                       slm=SLMConfig(route_batch=2, profile_min_size=2, **slm))


def wait_for_clusters(store: MemoryStore) -> None:
    """Until the worker's cold start has made the store's clusters (it asks no SLM)."""
    deadline = time.monotonic() + HOLD_S
    while store.stats()["clusters"] == 0:
        assert time.monotonic() < deadline, "the cold start should run in the worker"
        time.sleep(0.05)


def slm_profiled(store: MemoryStore) -> int:
    return sum(c.summary.startswith(SUMMARY + " · ") for c in store.clusters())


def test_background_is_the_default():
    assert SLMConfig().background is True
    assert StoreConfig().slm.background is True


def test_add_returns_before_the_slm_answers_and_flush_applies_its_decisions(tmp_path, fake_server, gate):  # noqa: F811
    vecs, top = topic_vectors(160, 3, seed=2, spread=0.6)  # several clusters per topic: ambiguous routes
    with MemoryStore.open(tmp_path / "s", config=config(), embedder=False, slm=fake_server.url) as s:
        # The cold start goes to the worker; it labels its young clusters by vectors and leaves
        # their SLM labels to a later pass or flush().
        s.add_many(texts_for(top[:60]), embeddings=vecs[:60])
        wait_for_clusters(s)
        vector_cluster = {}
        for i in range(60, 160):
            mid = s.add(f"late memory {i}", embedding=vecs[i])
            vector_cluster[mid] = s.get(mid).cluster_id
            assert vector_cluster[mid] is not None, "vector routing is done before add() returns"
        assert gate.asked.wait(HOLD_S), "the worker should be asking the SLM to route"
        # Every add returned while the SLM had not answered anything yet.
        assert not gate.opened.is_set() and gate.answers == 0
        assert slm_profiled(s) == 0
        pending = s.stats()["slm_pending"]
        assert pending["routes"] + pending["jobs"] > 0
        assert s.stats()["routing"].get("slm", 0) == 0

        gate.open()
        s.flush()
        assert s.stats()["slm_pending"] == {"routes": 0, "jobs": 0}
        assert gate.answers > 0
        assert slm_profiled(s) > 0, "the SLM's profiles were applied"
        routed = s.stats()["routing"].get("slm", 0)
        assert routed > 0, "ambiguous adds were routed by the SLM"
        moved = [m for m, c in vector_cluster.items() if s.get(m).cluster_id != c]
        assert moved, "the SLM's routes (never the vector choice) were applied"
        # Still consistent: a moved memory is found in the cluster it now belongs to.
        for m in moved[:5]:
            hit = s.search(vecs[m - 1], k=1, mode="flat")[0]
            assert hit.memory_id == m and hit.cluster_id == s.get(m).cluster_id


def test_adds_while_the_worker_is_busy_queue_one_job_of_each_kind(tmp_path, fake_server, gate):  # noqa: F811
    vecs, top = topic_vectors(160, 3, seed=2, spread=0.6)
    with MemoryStore.open(tmp_path / "s", config=config(), embedder=False, slm=fake_server.url) as s:
        s.add_many(texts_for(top[:60]), embeddings=vecs[:60])
        wait_for_clusters(s)
        for i in range(60, 160):
            s.add(f"late memory {i}", embedding=vecs[i])
        assert gate.asked.wait(HOLD_S)
        pending = s.stats()["slm_pending"]
        assert pending["routes"] >= 4, "the test needs ambiguous adds"
        # The running job, at most one queued route job and one queued organisation.
        assert pending["jobs"] <= 3, pending
        gate.open()
        s.flush()
        assert s.stats()["slm_pending"] == {"routes": 0, "jobs": 0}


def test_a_reopened_store_routes_ambiguous_adds_through_the_slm(tmp_path, fake_server):  # noqa: F811
    """The organiser connects lazily: a reopened store (no cold start to connect it) must
    still queue ambiguous routes for the SLM."""
    fake_server.behaviour = answer
    vecs, top = topic_vectors(160, 3, seed=2, spread=0.6)
    path = tmp_path / "s"
    with MemoryStore.open(path, config=config(), embedder=False, slm=False) as s:
        s.add_many(texts_for(top[:60]), embeddings=vecs[:60])
        assert s.clusters()
    with MemoryStore.open(path, config=config(), embedder=False, slm=fake_server.url) as s:
        for i in range(60, 160):
            s.add(f"late memory {i}", embedding=vecs[i])
        s.flush()
        assert s.stats()["routing"]["slm"] > 0
    routes = [b for b in fake_server.chat_requests() if "sort notes" in b["messages"][0]["content"]]
    assert routes


def test_close_waits_for_queued_slm_work(tmp_path, fake_server, gate):  # noqa: F811
    vecs, top = topic_vectors(80, 3, seed=3, spread=0.6)
    path = tmp_path / "s"
    s = MemoryStore.open(path, config=config(), embedder=False, slm=fake_server.url)
    s.add_many(texts_for(top), embeddings=vecs)
    closer = threading.Thread(target=s.close)
    closer.start()
    # The SLM labels of the cold start's clusters are still owed: close() asks for them.
    assert gate.asked.wait(HOLD_S)
    closer.join(0.5)
    # Ordering, not speed: close() cannot have finished, the SLM has not answered.
    assert closer.is_alive() and gate.answers == 0
    gate.open()
    closer.join(HOLD_S * 2)
    assert not closer.is_alive()
    assert gate.answers > 0
    with MemoryStore.open(path, config=config(), embedder=False, slm=False) as s:
        assert slm_profiled(s) > 0, "close() applied and saved the SLM's profiles"


def test_organize_defers_profiles_past_its_budget_to_the_worker(tmp_path, fake_server, gate):  # noqa: F811
    vecs, top = topic_vectors(120, 4, seed=4, spread=0.6)
    cfg = StoreConfig(min_memories_to_cluster=1000, organize_every=0,  # no cold start on add
                      slm=SLMConfig(profile_min_size=2, profile_budget_s=0))
    with MemoryStore.open(tmp_path / "s", config=cfg, embedder=False, slm=fake_server.url) as s:
        s.add_many(texts_for(top), embeddings=vecs)
        report = s.organize()
        assert report["clusters"] > 0
        assert report["profiles_deferred"] > 0
        # organize() returned without an SLM answer: no SLM profile can exist yet.
        assert gate.answers == 0 and slm_profiled(s) == 0
        assert all(c.summary for c in s.clusters()), "vector profiles stand in meanwhile"
        assert s.stats()["slm_pending"]["jobs"] >= 1
        gate.open()
        s.flush()
        assert slm_profiled(s) >= report["profiles_deferred"]


@pytest.mark.parametrize("how", ["not installed", "start fails"])
def test_a_managed_server_that_cannot_start_is_reported_once(tmp_path, monkeypatch, caplog, how):
    from clag_fast.slm import server

    if how == "not installed":
        monkeypatch.setattr(server.ManagedServer, "available", staticmethod(lambda: False))
        reason = "not installed"
    else:
        def fail(self, *a, **kw):
            raise ServerUnavailable("llama.cpp exited: boom")

        monkeypatch.setattr(server.ManagedServer, "available", staticmethod(lambda: True))
        monkeypatch.setattr(server.ManagedServer, "start", fail)
        reason = "boom"
    vecs, top = topic_vectors(150, 3, seed=5, spread=0.6)
    cfg = StoreConfig(min_memories_to_cluster=30, organize_every=20)  # default SLMConfig: auto, background
    with caplog.at_level(logging.WARNING):
        with MemoryStore.open(tmp_path / "s", config=cfg, embedder=False) as s:
            ids = s.add_many(texts_for(top[:60]), embeddings=vecs[:60])
            s.organize(task_context="a trip")  # asks for topics: the SLM is needed now
            ids += [s.add(f"more {i}", embedding=vecs[i]) for i in range(60, 150)]
            s.organize(task_context="a trip")
            s.flush()
            st = s.stats()
            assert reason in st["slm"] and "vector-only" in st["slm"]
            assert len(s) == 150
            for m, h in zip(ids[::10], s.search_many(vecs[::10], k=1, mode="flat")):
                assert h[0].memory_id == m
            assert s.get(ids[-1]).cluster_id is not None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("clag_fast.slm")]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert reason in warnings[0].getMessage()


def test_stats_while_the_managed_server_starts_in_the_worker(monkeypatch, fake_server):  # noqa: F811
    """The worker starts the managed server on first need; a stats() on another thread
    meanwhile (the demo times its stages with it) describes the SLM instead of raising."""
    from clag_fast.slm import server
    from clag_fast.slm.connection import SLMConnection

    started, release = threading.Event(), threading.Event()

    def slow_start(self):
        started.set()
        assert release.wait(HOLD_S)
        self.port = int(fake_server.url.rsplit(":", 1)[1])
        self._proc = object()  # running, as far as ``url`` can tell

    monkeypatch.setattr(server.ManagedServer, "available", staticmethod(lambda: True))
    monkeypatch.setattr(server.ManagedServer, "start", slow_start)
    conn = SLMConnection(None, SLMConfig())
    worker = threading.Thread(target=conn.organizer)
    worker.start()
    try:
        assert started.wait(HOLD_S)
        assert conn.describe().endswith("starting")
    finally:
        release.set()
        worker.join(HOLD_S)
    assert conn.describe().startswith("managed SmolLM2-135M-Instruct (llama.cpp) at http://127.0.0.1:")
    conn._server = None  # nothing to stop: the fake never ran a process


def test_a_queued_route_whose_candidate_cluster_is_gone_still_routes(tmp_path, fake_server):  # noqa: F811
    """An organisation on another thread may merge away a cluster between the time a route is
    queued and the time the SLM is asked: the route goes on among the clusters still there."""
    vecs, top = topic_vectors(80, 3, seed=3, spread=0.6)
    with MemoryStore.open(tmp_path / "s", config=config(background=False), embedder=False,
                          slm=fake_server.url) as s:
        s.add_many(texts_for(top), embeddings=vecs)
        ids = [c.id for c in s.clusters()]
        assert len(ids) >= 2
        mid = s.add("one more memory", embedding=vecs[0])
        row = int(np.flatnonzero(s._state.rows.memory_id == mid)[0])
        before = s.stats()["routing"]
        gone = max(ids) + 1000  # a cluster no longer there
        s._slm._route([(mid, row, "one more memory", [ids[0], gone, ids[1]], [0.50, 0.495, 0.49])])
        after = s.stats()["routing"]
        asked = sum(after.get(k, 0) - before.get(k, 0) for k in ("slm", "fallback"))
        assert asked == 1, (before, after)
        assert s.get(mid).cluster_id in ids
