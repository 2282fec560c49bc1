"""The SLM's update judge (``SLMConfig(updates=True)``): a new memory that changes a fact an
older one states marks it superseded, judged by a constrained yes/no against a real HTTP
server on loopback whose answers each test scripts; a failing or garbled judge changes nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llm_fixtures import completion, fake_server  # noqa: F401

from clag_fast import MemoryStore, SLMConfig, StoreConfig
from clag_fast.slm import prompts

DIM = 16


def _vec(seed: int, base: np.ndarray | None = None, mix: float = 0.0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    v /= np.linalg.norm(v)
    if base is not None:
        v = mix * base + (1 - mix) * v
        v /= np.linalg.norm(v)
    return v.astype(np.float32)


def _judge(server, verdict):
    """Answer the update judge with ``verdict`` (a JSON body, or raw text), anything else
    with an empty object (the organiser's vector fallbacks)."""
    def behaviour(body):
        system = body["messages"][0]["content"]
        if system == prompts.UPDATE_SYSTEM:
            return (200, completion(verdict if isinstance(verdict, str) else json.dumps(verdict)))
        return (200, completion("{}"))
    server.behaviour = behaviour


def _store(path, server, **slm):
    cfg = StoreConfig(dim=DIM, min_memories_to_cluster=4, target_cluster_size=2, max_cluster_size=8,
                      slm=SLMConfig(updates=True, background=False, profile_min_size=100, **slm))
    return MemoryStore.open(path, config=cfg, embedder=False, slm=server.url)


def _seed(s):
    """Two topics of three memories, organised into clusters; returns the flight memory."""
    flight = _vec(1)
    ids = s.add_many(["The flight to Tokyo leaves on April 3.", "We fly with Air Canada.", "Seats 14A and 14B."],
                     embeddings=np.stack([flight, _vec(2, flight, 0.6), _vec(3, flight, 0.6)]))
    s.add_many(["Maya is vegetarian.", "No fish stock for the user.", "Tofu is fine."],
               embeddings=np.stack([_vec(10), _vec(11, _vec(10), 0.6), _vec(12, _vec(10), 0.6)]))
    s.organize()
    return ids[0], flight


def _judge_calls(server):
    return [b for b in server.chat_requests() if b["messages"][0]["content"] == prompts.UPDATE_SYSTEM]


def test_a_yes_marks_the_older_memory_superseded(tmp_path, fake_server):
    _judge(fake_server, {"updates": "yes"})
    with _store(tmp_path / "s", fake_server) as s:
        old, flight = _seed(s)
        new = s.add("Moved: the flight to Tokyo now leaves on April 10.", embedding=_vec(4, flight, 0.85))
        s.flush()
        assert s.get(old).superseded_by == new
        calls = _judge_calls(fake_server)
        assert calls, "the judge was asked"
        asked = calls[-1]["messages"][1]["content"]
        assert "April 3" in asked and "April 10" in asked
        hits = s.search(flight, k=3)
        ids = [h.memory_id for h in hits]
        assert ids.index(new) < ids.index(old)
        assert hits[ids.index(old)].superseded_by == new
    with MemoryStore.open(tmp_path / "s", embedder=False, slm=False) as s:
        assert s.get(old).superseded_by == new


@pytest.mark.parametrize("verdict", [{"updates": "no"}, {"updates": "maybe"}, "not json at all", {"other": 1}])
def test_a_no_or_a_garbled_answer_changes_nothing(tmp_path, fake_server, verdict):
    _judge(fake_server, verdict)
    with _store(tmp_path / "s", fake_server) as s:
        old, flight = _seed(s)
        new = s.add("Moved: the flight to Tokyo now leaves on April 10.", embedding=_vec(4, flight, 0.85))
        s.flush()
        assert _judge_calls(fake_server), "the judge was asked"
        assert s.get(old).superseded_by is None
        assert len(s) == 7 and s.get(new).text.startswith("Moved")


def test_no_question_without_a_similar_older_memory(tmp_path, fake_server):
    _judge(fake_server, {"updates": "yes"})
    with _store(tmp_path / "s", fake_server, update_similarity=0.95) as s:
        old, flight = _seed(s)
        s.add("Something else entirely about trains.", embedding=_vec(5, flight, 0.3))
        s.flush()
        assert _judge_calls(fake_server) == []
        assert s.get(old).superseded_by is None


def test_the_judge_is_off_by_default(tmp_path, fake_server):
    _judge(fake_server, {"updates": "yes"})
    cfg = StoreConfig(dim=DIM, min_memories_to_cluster=4, target_cluster_size=2, max_cluster_size=8,
                      slm=SLMConfig(background=False, profile_min_size=100))
    with MemoryStore.open(tmp_path / "s", config=cfg, embedder=False, slm=fake_server.url) as s:
        old, flight = _seed(s)
        s.add("Moved: the flight to Tokyo now leaves on April 10.", embedding=_vec(4, flight, 0.85))
        s.flush()
        assert _judge_calls(fake_server) == []
        assert s.get(old).superseded_by is None
    with pytest.raises(ValueError, match="update_similarity"):
        SLMConfig(update_similarity=1.5)
