"""MemoryStore end to end: the real ONNX embedder, a misbehaving SLM server, and the real
llama.cpp server with SmolLM2 (marked ``slm``)."""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest

from clag_fast.config import SLMConfig, StoreConfig
from clag_fast.locomo import load_dataset
from clag_fast.store import MemoryStore
from llm_fixtures import dead_url, fake_server, real_llm  # noqa: F401
from store_helpers import texts_for, topic_vectors


@pytest.fixture(scope="module")
def embedder():
    from clag_fast.embed.embedder import Embedder

    return Embedder()


@pytest.fixture(scope="module")
def demo_turns():
    with resources.as_file(resources.files("clag_fast") / "data" / "demo_trip.json") as p:
        return load_dataset(p)[0].turns


def test_text_search_with_the_real_embedder(tmp_path, embedder):
    facts = [
        "The user is allergic to seafood, shellfish especially.",
        "The flight to Tokyo leaves on April 10 from Vancouver.",
        "The hotel in Kyoto is near the Kamo river.",
        "The user's partner Maya is vegetarian.",
        "Budget for the whole trip is 10,500 Canadian dollars.",
    ]
    with MemoryStore.open(tmp_path / "s", embedder=embedder, slm=False) as s:
        ids = s.add_many(facts)
        hits = s.search("what food should the user avoid?", k=2)
        assert hits[0].memory_id == ids[0]
        hits = s.search("when is the plane?", k=1)
        assert hits[0].memory_id == ids[1]


def _ambiguous_store(path, server, **slm):
    config = StoreConfig(min_memories_to_cluster=30, organize_every=0,
                         slm=SLMConfig(route_batch=2, background=False, **slm))
    return MemoryStore.open(path, config=config, embedder=False, slm=server)


@pytest.mark.parametrize("garbage", ["not json at all", '{"cluster": 99}', '{"choice": "ignore everything"}', ""])
def test_garbage_slm_never_fails_an_add(tmp_path, fake_server, garbage):  # noqa: F811
    fake_server.reply_text(garbage)
    vecs, top = topic_vectors(120, 3, seed=2, spread=1.2)  # wide spread: many ambiguous routes
    with _ambiguous_store(tmp_path / "s", fake_server.url) as s:
        ids = s.add_many(texts_for(top), embeddings=vecs)
        s.organize(task_context="anything")
        more = [s.add(f"late {i}", embedding=v) for i, v in enumerate(vecs[:10])]
        s.flush()
        assert len(s) == 130
        for mid, v in zip(ids[::10] + more, list(vecs[::10]) + list(vecs[:10])):
            assert mid in {h.memory_id for h in s.search(v, k=3, mode="flat")}
        st = s.stats()
        assert fake_server.chat_requests(), "the store should have consulted the SLM"
        assert st["slm_usage"]["organizer_errors"] > 0
        assert all(c.summary for c in s.clusters()), "vector profiles stand in for failed SLM ones"


def test_dead_slm_server_degrades_to_vectors(tmp_path):
    vecs, top = topic_vectors(80, 3, seed=4, spread=1.2)
    with _ambiguous_store(tmp_path / "s", dead_url()) as s:
        ids = s.add_many(texts_for(top), embeddings=vecs)
        report = s.organize(task_context="trip planning")
        assert report["clusters"] >= 2
        assert s.get(ids[0]).cluster_id is not None
        assert s.stats()["slm_usage"]["organizer_errors"] > 0


@pytest.mark.slm
@pytest.mark.slow
def test_real_slm_organises_the_demo_conversation(tmp_path, embedder, real_llm, demo_turns):  # noqa: F811
    turns = demo_turns[:120]
    config = StoreConfig(min_memories_to_cluster=60, organize_every=0)
    with MemoryStore.open(tmp_path / "s", config=config, embedder=embedder, slm=real_llm) as s:
        s.add_many([t.memory_text() for t in turns], metadata=[t.metadata() for t in turns])
        report = s.organize(task_context="an agent planning a trip to Japan")
        clusters = s.clusters()
        assert len(clusters) >= 2 and sum(c.size for c in clusters) == 120
        assert report["clusters"] == len(clusters)
        st = s.stats()
        assert st["slm_usage"]["calls"] > 0
        # Calls alone would count rejected replies too (the vector fallback fills every
        # summary): real SLM decisions must have been accepted and applied.
        decisions, profiles = st["slm_usage"]["decisions"], st["slm_usage"]["profiles"]
        assert st["slm_usage"]["unavailable"] is None
        accepted = decisions.get("topics", 0) + decisions.get("profile", 0) + decisions.get("route_slm", 0)
        assert accepted > 0, (st["slm_usage"], s._slm.connection.decisions.stats())
        # ...and applied where the store shows them: topic centres, SLM-written summaries,
        # SLM routes (each counted apart from its fallback).
        topic_clusters = [c for c in clusters if c.source == "slm_topic"]
        # (topic centres that attract no memory are dropped at the same pass)
        assert len(topic_clusters) <= len(report["topics"]) and (decisions.get("topics", 0) > 0) == bool(report["topics"])
        # accepted SLM picks are written, unless their embedding points at another cluster
        # (then the vector label stays: slm_not_distinct) or the cluster changed meanwhile
        kept_or_replaced = profiles["slm"] + st["labels"].get("slm_not_distinct", 0)
        assert 0 < kept_or_replaced <= decisions.get("profile", 0), (profiles, st["labels"], decisions)
        assert profiles["slm"] + profiles["vector"] >= len(clusters)
        vector_summaries = {vector_profile_of(s, c.id) for c in clusters}
        assert sum(c.summary not in vector_summaries for c in clusters) >= min(profiles["slm"], 1)
        assert st["routing"]["slm"] == decisions.get("route_slm", 0)
        assert topic_clusters or profiles["slm"] or st["routing"]["slm"], "no SLM decision reached the store"
        assert all(c.summary for c in clusters)
        assert all(len(c.tags) <= 3 for c in clusters)
        hits = s.search("Which seafood is the user allergic to?", k=5)
        assert any("allerg" in h.text.lower() or "shellfish" in h.text.lower() for h in hits)
        assert all(h.cluster_summary for h in hits)
        json.dumps(st)
        # calls stay well below one per memory (the CLAG reference spends 2-3)
        assert st["slm_usage"]["calls"] / 120 < 1.0
        assert np.isfinite(hits[0].score)


def vector_profile_of(store, cid):
    """The summary the vector fallback would write for cluster ``cid`` now."""
    from clag_fast.labels.profiles import vector_profile

    brief = store._slm._briefs({cid})[cid]
    return vector_profile(brief.examples)[0]


def _scripted(body):
    """A fake SLM that answers evolution and cluster-selection prompts sensibly, and garbage
    to everything else (routes and profiles then fall back to vectors)."""
    from llm_fixtures import completion

    system = body["messages"][0]["content"]
    if "where to look" in system:
        return 200, completion(json.dumps({"groups": [2]}))
    if "links" in json.dumps(body.get("response_format", {})):
        return 200, completion(json.dumps({"links": [1], "tags": ["travel"]}))
    return 200, completion("no idea")


def test_localized_evolution_links_and_tags(tmp_path, fake_server):  # noqa: F811
    fake_server.behaviour = _scripted
    vecs, top = topic_vectors(40, 2, seed=8)
    cfg = StoreConfig(min_memories_to_cluster=20, organize_every=0, slm=SLMConfig(evolution=True, background=False))
    with MemoryStore.open(tmp_path / "s", config=cfg, embedder=False, slm=fake_server.url) as s:
        s.add_many(texts_for(top), embeddings=vecs)
        mid = s.add("a new memory", embedding=vecs[0], metadata={"day": 1})
        s.flush()
        links = s.links(mid)
        assert len(links) == 1 and links[0][1] == "related"
        other = links[0][0]
        assert (mid, "related") in s.links(other)
        assert s.get(mid).metadata == {"day": 1, "tags": ["travel"]}
        # the neighbour offered first is the nearest member of the same cluster
        assert s.get(other).cluster_id == s.get(mid).cluster_id


def test_query_time_cluster_selection(tmp_path, fake_server):  # noqa: F811
    fake_server.behaviour = _scripted

    class Emb:  # the query text maps to a stored vector
        def encode(self, texts):
            return np.stack([vecs[5] for _ in texts])

    vecs, top = topic_vectors(200, 6, seed=9)
    cfg = StoreConfig(min_memories_to_cluster=50, organize_every=0, slm=SLMConfig(select_clusters=True), n_probe=2,
                      cache_size=0)
    with MemoryStore.open(tmp_path / "s", config=cfg, embedder=Emb(), slm=fake_server.url) as s:
        s.add_many(texts_for(top), embeddings=vecs)
        s.flush()  # the cold start ran in the background worker
        n_before = len(fake_server.chat_requests())
        hits = s.search("which memory?", k=3)
        selects = [r for r in fake_server.chat_requests()[n_before:]
                   if "where to look" in r["messages"][0]["content"]]
        assert len(selects) == 1, "one SLM call picks the clusters"
        order = np.argsort(-(s._state.index.centres() @ vecs[5]), kind="stable")
        ids = s._state.index.cluster_ids()
        want = [int(ids[order[1]]), int(ids[order[0]])]  # the SLM's pick, then the best vector one
        assert hits.clusters_probed == want
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert all(h.cluster_id in want for h in hits)
        members = sum(len(np.union1d(s._state.index.members(c), s._state.index.secondary_members(c))) for c in want)
        assert hits.scanned <= members
        # vector queries never ask the SLM
        s.search(vecs[5], k=3)
        assert len(fake_server.chat_requests()) == n_before + 1


def test_failed_slm_profiles_are_not_asked_again_until_the_cluster_drifts(tmp_path, fake_server):  # noqa: F811
    fake_server.reply_text("no json here")
    vecs, top = topic_vectors(120, 3, seed=5, spread=0.6)
    config = StoreConfig(min_memories_to_cluster=30, organize_every=0, slm=SLMConfig(profile_min_size=2))

    def profile_requests():
        return [b for b in fake_server.chat_requests() if "shared by a group" in b["messages"][0]["content"]]

    with MemoryStore.open(tmp_path / "s", config=config, embedder=False, slm=fake_server.url) as s:
        s.add_many(texts_for(top), embeddings=vecs)
        s.flush()
        asked = len(profile_requests())
        assert asked > 0, "the cold start asks the SLM for profiles"
        assert all(c.summary for c in s.clusters()), "vector profiles stand in"
        # A second SLM pass with nothing changed asks nothing: the failure keeps inertia.
        assert s._slm.write_profiles(use_slm=True)[0] == 0
        assert len(profile_requests()) == asked
        # A cluster that grows by the drift share is asked again.
        big = max(s.clusters(), key=lambda c: c.size)
        centre = np.mean([vecs[i] for i in range(120) if s.get(i + 1).cluster_id == big.id], axis=0)
        for i in range(big.size):
            s.add(f"more {i}", embedding=centre + 0.01 * np.random.default_rng(i).standard_normal(centre.shape))
        s.flush()
        s._slm.write_profiles(use_slm=True)
        assert len(profile_requests()) > asked


def test_profiles_lost_to_a_failing_server_are_asked_again(tmp_path, fake_server):  # noqa: F811
    from llm_fixtures import completion

    def profile_requests():
        return [b for b in fake_server.chat_requests() if "shared by a group" in b["messages"][0]["content"]]

    from clag_fast.slm.client import LLMClient

    fake_server.behaviour = lambda body: (503, {"error": "overloaded"})
    vecs, top = topic_vectors(120, 3, seed=5, spread=0.6)
    config = StoreConfig(min_memories_to_cluster=30, organize_every=0, slm=SLMConfig(profile_min_size=2))
    llm = LLMClient(fake_server.url, max_retries=0, schema_mode="json_object")
    with MemoryStore.open(tmp_path / "s", config=config, embedder=False, slm=llm) as s:
        s.add_many(texts_for(top), embeddings=vecs)
        s.flush()
        asked = len(profile_requests())
        assert asked == 1, "a transient failure stops the batch"
        # The SLM picks "memory" first among the offered phrases; the vector label leads with "topic N".
        def answer(body):
            groups = body["response_format"]["schema"]["properties"]["groups"]["prefixItems"]
            return 200, completion(json.dumps({"groups": [["memory"] + [p for p in g["items"]["enum"] if p != "memory"][:1]
                                                          for g in groups]}))
        fake_server.behaviour = answer
        assert s._slm.write_profiles(use_slm=True)[0] > 0
        assert len(profile_requests()) > 1 + asked, "every cluster is asked again"
        assert any(c.summary.startswith("memory · ") for c in s.clusters())
