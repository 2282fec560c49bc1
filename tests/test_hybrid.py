"""Hybrid (BM25 + vector) search through MemoryStore: the default for text queries, vectors
only for vector queries and for texts without indexable words, namespace isolation of the
term statistics, two-stage with lexical clusters, and argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from clag_fast.config import StoreConfig
from clag_fast.eval.runner import HashingEmbedder
from clag_fast.store import MemoryStore

CFG = StoreConfig(slm="off", cache_size=0, min_memories_to_cluster=40)
VOCAB = ("river mountain piano guitar garden kitchen novel poem train harbour violin desert "
         "forest castle bridge market").split()


def _texts(n: int, seed: int = 0, prefix: str = "") -> list[str]:
    rng = np.random.default_rng(seed)
    return [prefix + " ".join(rng.choice(VOCAB, 6)) + f" code{seed}x{i}" for i in range(n)]


@pytest.fixture
def store(tmp_path):
    s = MemoryStore.open(tmp_path / "s", config=CFG, embedder=HashingEmbedder(), slm=False)
    s.add_many(_texts(300))
    s.organize()
    yield s
    s.close()


def _ids(hits) -> list[int]:
    return [h.memory_id for h in hits]


def test_text_queries_are_hybrid_by_default(store):
    assert store.config.lexical_weight > 0
    target = store.add("the zeppelin museum in friedrichshafen")
    hits = store.search("zeppelin", k=5, mode="flat")
    assert hits[0].memory_id == target
    for mode in ("flat", "two_stage"):
        assert _ids(store.search("friedrichshafen zeppelin", k=3, mode=mode))[0] == target


def test_weight_zero_and_vector_queries_are_vector_only(store):
    q = "piano by the river code0x7"
    vec = HashingEmbedder().encode([q])[0]
    for mode in ("flat", "two_stage"):
        by_vec = store.search(vec, k=10, mode=mode)
        by_text0 = store.search(q, k=10, mode=mode, lexical_weight=0)
        assert _ids(by_vec) == _ids(by_text0)
        np.testing.assert_allclose([h.score for h in by_vec], [h.score for h in by_text0], rtol=1e-6)


def test_lexical_weight_changes_ranking(store):
    q = "code0x7"
    hybrid = store.search(q, k=10, mode="flat", lexical_weight=1.0)
    assert hybrid[0].text.endswith("code0x7")


@pytest.mark.parametrize("query", ["!!!", "🎉🎉 🎊", "the", "...?", '"*" - AND', "and or not"])
def test_queries_without_words_fall_back_to_vectors(store, query):
    for mode in ("flat", "two_stage"):
        hits = store.search(query, k=5, mode=mode)
        assert _ids(hits) == _ids(store.search(query, k=5, mode=mode, lexical_weight=0))


@pytest.mark.parametrize("query", ['"river" NEAR piano', "river*", "-river AND piano", "river OR",
                                   "NEAR(river piano)", "piano\"", "'"])
def test_syntax_characters_are_not_operators(store, query):
    hits = store.search(query, k=5)
    assert len(hits) == 5


def test_any_script(tmp_path):
    s = MemoryStore.open(tmp_path / "u", config=CFG, embedder=HashingEmbedder(), slm=False)
    texts = ["東京タワーに行った", "Москва — столица России", "नमस्ते दुनिया", "مرحبا بالعالم",
             "Straße in München", "x" * 100_000 + " very long"]
    ids = s.add_many(texts)
    assert s.search("東京", k=1, mode="flat", lexical_weight=1.0)[0].memory_id == ids[0]
    assert s.search("столица", k=1, mode="flat", lexical_weight=1.0)[0].memory_id == ids[1]
    assert s.search("नमस्ते", k=1, mode="flat", lexical_weight=1.0)[0].memory_id == ids[2]
    assert s.search("MÜNCHEN", k=1, mode="flat", lexical_weight=1.0)[0].memory_id == ids[4]
    s.close()


def test_namespaces_never_change_each_others_ranking(tmp_path):
    s = MemoryStore.open(tmp_path / "n", config=CFG, embedder=HashingEmbedder(), slm=False)
    s.add_many(_texts(80, seed=1), namespaces="a")
    queries = ["river piano", "castle bridge market", "code1x5 poem", "desert violin"]
    before = [[(h.memory_id, round(h.score, 6)) for h in s.search(q, k=10, mode="flat", namespace="a")]
              for q in queries]
    # Namespace b floods the words of a's queries: with store-wide statistics their idf would
    # collapse and a's ranking would move.
    # (distinct texts: 200 identical vectors stall the organiser's splits)
    s.add_many([f"river piano castle bridge market poem desert violin n{i}" for i in range(200)],
               namespaces="b")
    after = [[(h.memory_id, round(h.score, 6)) for h in s.search(q, k=10, mode="flat", namespace="a")]
             for q in queries]
    assert before == after
    s.close()


def test_two_stage_hybrid_scans_a_share(store):
    assert len(store.clusters()) > 4
    hits = store.search("garden poem code0x12", k=10)
    assert hits.mode == "two_stage" and hits.scanned < hits.candidates
    assert len(hits.clusters_probed) > 0
    assert any(h.text.endswith("code0x12") for h in hits)


def test_filters_apply_to_lexical_hits(store):
    mid = store.add("unique walrus memory", kind="note")
    assert store.search("walrus", k=3, kind="user_input", mode="flat", lexical_weight=1.0)[0].memory_id != mid
    assert store.search("walrus", k=3, kind="note", mode="flat")[0].memory_id == mid


def test_search_many_matches_search(store):
    qs = ["river piano", "!!!", "code0x3 novel"]
    many = store.search_many(qs, k=5, mode="flat")
    for q, hits in zip(qs, many):
        assert _ids(hits) == _ids(store.search(q, k=5, mode="flat"))


def test_bad_lexical_weight(store):
    for bad in (-0.1, 1.5, "0.5", True, float("nan")):
        with pytest.raises(ValueError):
            store.search("river", lexical_weight=bad)
    with pytest.raises(ValueError):
        StoreConfig(lexical_weight=2.0)
    with pytest.raises(ValueError):
        StoreConfig(lexical_fusion="max")


def test_decay_weights_apply_to_hybrid(tmp_path):
    from clag_fast.decay import ForgettingPolicy

    cfg = CFG.replace(forgetting=ForgettingPolicy(half_life_days=1.0))
    s = MemoryStore.open(tmp_path / "d", config=cfg, embedder=HashingEmbedder(), slm=False)
    s.add_many(_texts(50))
    hits = s.search("river piano", k=5, mode="flat")
    assert len(hits) == 5 and all(np.isfinite(h.score) for h in hits)
    s.close()
