"""The default ``MemoryStore.open(path)``: ``SLMConfig.mode="auto"`` and no ``slm=`` start a
managed SmolLM2 server on first need. When that server cannot start, the store organises by
vectors and says so once: one WARNING log line and ``stats()``."""

from __future__ import annotations

import logging
import socket

import pytest

from clag_fast.config import StoreConfig
from clag_fast.store import MemoryStore
from llm_fixtures import require_slm
from store_helpers import texts_for, topic_vectors

CFG = StoreConfig(min_memories_to_cluster=40, organize_every=20)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slm
@pytest.mark.slow
def test_default_open_starts_and_stops_its_managed_server(tmp_path):
    require_slm()
    vecs, top = topic_vectors(80, 3, seed=1)
    s = MemoryStore.open(tmp_path / "s", config=CFG, embedder=False)  # slm=None: managed
    try:
        assert s.stats()["slm"].startswith("not started yet"), "the server starts on first need, not at open"
        s.add_many(texts_for(top), embeddings=vecs)  # the cold start needs the SLM
        s.flush()
        st = s.stats()
        assert st["slm"].startswith("managed SmolLM2"), st["slm"]
        assert st["slm_usage"]["unavailable"] is None
        assert st["slm_usage"]["calls"] > 0 and st["slm_usage"]["prompt_tokens"] > 0
        port = int(st["slm"].rsplit(":", 1)[1])
        assert _port_open(port)
        assert s.clusters() and all(c.summary for c in s.clusters())
    finally:
        s.close()
    assert not _port_open(port), "close() stops the managed server"


def test_a_managed_server_that_cannot_start_is_reported_once(tmp_path, monkeypatch, caplog):
    require_slm()
    # A real start failure: the server's interpreter cannot initialise (it inherits this
    # environment), so llama_cpp.server exits during start-up.
    monkeypatch.setenv("PYTHONHOME", str(tmp_path / "no-python-here"))
    vecs, top = topic_vectors(120, 3, seed=2)
    caplog.set_level(logging.WARNING, logger="clag_fast")
    with MemoryStore.open(tmp_path / "s", config=CFG, embedder=False) as s:
        ids = s.add_many(texts_for(top[:60]), embeddings=vecs[:60])
        s.flush()
        s.organize(task_context="anything")
        s.add_many(texts_for(top[60:], 60), embeddings=vecs[60:])  # periodic organisations
        s.flush()
        st = s.stats()
        assert st["slm_usage"]["unavailable"] is not None and "vector-only" in st["slm_usage"]["unavailable"]
        assert st["slm"] == st["slm_usage"]["unavailable"]
        assert st["slm_usage"].get("calls", 0) == 0
        assert st["organizations"] >= 2 and len(s.clusters()) >= 2, "vector organisation goes on"
        # Labels made from the members' phrases, within what the writes paid for
        # (store.label_budget); an explicit organisation labels every cluster.
        assert any(c.summary for c in s.clusters())
        s.organize()
        assert all(c.summary for c in s.clusters())
        assert s.stats()["slm_usage"].get("calls", 0) == 0
        assert s.search(vecs[0], k=1)[0].memory_id == ids[0]
    unavailable = [r for r in caplog.records if r.levelno == logging.WARNING and "SLM unavailable" in r.getMessage()]
    assert len(unavailable) == 1, [r.getMessage()[:120] for r in caplog.records]
