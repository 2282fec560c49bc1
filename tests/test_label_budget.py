"""Bounded labelling inside the write path (``store.label_budget``) and label phrases kept out
of a vector space the store's embedder does not make."""

from __future__ import annotations

import numpy as np
import pytest

from clag_fast.config import StoreConfig
from clag_fast.store import MemoryStore
from clag_fast.store import label_budget as lb
from store_helpers import DIM, texts_for, topic_vectors


class SpyEmbedder:
    """Stands in for the default MiniLM: deterministic unit vectors, and every text it embeds."""

    dim = DIM

    def __init__(self) -> None:
        self.texts: list[str] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.texts += list(texts)
        out = np.zeros((len(texts), DIM), np.float32)
        for i, t in enumerate(texts):
            rng = np.random.default_rng(abs(hash(t)) % (1 << 32))
            v = rng.standard_normal(DIM).astype(np.float32)
            out[i] = v / np.linalg.norm(v)
        return out


@pytest.fixture
def default_embedder(monkeypatch):
    """The store's default embedder (``embedder=None``), replaced by a spy."""
    spy = SpyEmbedder()
    monkeypatch.setattr(MemoryStore, "_get_embedder", lambda self: spy)
    return spy


def isotropic(n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


CONFIG = StoreConfig(min_memories_to_cluster=50, organize_every=50, slm="off")


def add_in_calls(store: MemoryStore, vectors: np.ndarray, topics: np.ndarray, batch: int = 100) -> None:
    for a in range(0, len(vectors), batch):
        store.add_many(texts_for(topics[a:a + batch], start=a), embeddings=vectors[a:a + batch])


# -- vectors from another model ----------------------------------------------------------------
def test_given_vectors_never_send_label_phrases_to_the_default_embedder(tmp_path, default_embedder):
    vecs, top = topic_vectors(600, 12, seed=1)
    with MemoryStore.open(tmp_path / "s", config=CONFIG, slm=False) as s:
        add_in_calls(s, vecs, top)
        assert s.stats()["organizations"] > 2, "periodic passes labelled clusters"
        report = s.organize(task_context="notes about topics")  # an explicit pass labels everything
        assert report["profiles"] > 0
        assert all(c.summary for c in s.clusters())
        quality = s.label_quality()
        assert "self_at_1" not in quality, "labels are not placed among centres of another model's space"
    assert default_embedder.texts == []
    with MemoryStore.open(tmp_path / "s", config=CONFIG, slm=False) as s:  # remembered across opens
        s.add_many(["one more memory about topic 3"], embeddings=vecs[:1])
        s.organize()
    assert default_embedder.texts == []


def test_texts_the_store_embeds_get_their_label_phrases_embedded_too(tmp_path, default_embedder):
    _, top = topic_vectors(200, 6, seed=2)
    texts = texts_for(top)
    with MemoryStore.open(tmp_path / "s", config=CONFIG, slm=False) as s:
        s.add_many(texts)
        s.organize()
    phrases = [t for t in default_embedder.texts if t not in set(texts)]
    assert phrases, "label phrases are embedded in the space of the store's own vectors"


def test_an_embedder_the_caller_gives_embeds_label_phrases_for_given_vectors(tmp_path):
    spy = SpyEmbedder()
    vecs, top = topic_vectors(300, 6, seed=3)
    with MemoryStore.open(tmp_path / "s", config=CONFIG, embedder=spy, slm=False) as s:
        add_in_calls(s, vecs, top)
        s.organize()
    assert spy.texts, "the caller's embedder is taken to make the vectors it is given"


# -- the label budget ----------------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["isotropic", "blobs", "uneven"])
def test_label_work_inside_add_many_stays_within_what_the_adds_earned(tmp_path, shape):
    n, batch = 3000, 100
    if shape == "isotropic":
        vecs, top = isotropic(n), np.arange(n) % 20
    elif shape == "blobs":
        vecs, top = topic_vectors(n, 40, seed=4)
    else:  # half the memories about one topic, the rest spread over 60 small ones
        small, top_small = topic_vectors(n, 60, seed=5)
        in_big = np.arange(n) % 2 == 0
        around_big = isotropic(1, seed=5)[0] + 0.3 * isotropic(n, seed=6)
        vecs = np.where(in_big[:, None], around_big / np.linalg.norm(around_big, axis=1, keepdims=True), small)
        vecs = vecs.astype(np.float32)
        top = np.where(in_big, 60, top_small)
    with MemoryStore.open(tmp_path / "s", config=CONFIG, embedder=False, slm=False) as s:
        for a in range(0, n, batch):
            s.add_many(texts_for(top[a:a + batch], start=a), embeddings=vecs[a:a + batch])
            # A pass takes a cluster only at the most it can cost and reads the namespace's
            # sample with what is left: the work charged never runs ahead of the credit.
            work = s.stats()["label_work"]
            assert work["spent"] <= work["earned"] + 1e-6, a
        st = s.stats()
        work = st["label_work"]
        calls = n // batch
        assert work["earned"] == pytest.approx(calls * lb.CALL_CREDIT + n * lb.VECTOR_CREDIT)
        # Every unit of label work the writes did was charged but the cold start's (once per
        # store): first labels and the passes' texts (no phrase is embedded: no embedder).
        assert 0 < work["spent"] < work["units"]
        # ... and over a long load the work follows the credit, not the shape.
        assert work["spent"] >= 0.5 * work["earned"]
        # An explicit organize() is not charged to the writes, and labels every cluster.
        s.organize()
        assert s.stats()["label_work"]["spent"] == pytest.approx(work["spent"])
        assert all(c.summary for c in s.clusters())


def test_clusters_the_budget_left_unlabelled_are_labelled_first_as_credit_comes(tmp_path):
    vecs = isotropic(2000, seed=7)
    top = np.arange(2000) % 20
    with MemoryStore.open(tmp_path / "s", config=CONFIG, embedder=False, slm=False) as s:
        add_in_calls(s, vecs[:1500], top[:1500], batch=500)
        unlabelled = {c.id for c in s.clusters() if not c.summary}
        assert unlabelled, "isotropic vectors open more clusters than big writes pay first labels for"
        # Many small writes later: credit per call, and the passes take unlabelled clusters first.
        for i in range(1500, 2000):
            s.add_many([f"memory {i}"], embeddings=vecs[i:i + 1])
        still = {c.id for c in s.clusters() if not c.summary}
        assert len(still & unlabelled) < len(unlabelled)


def test_a_write_earns_for_its_call_and_its_memories():
    b = lb.LabelBudget()
    b.earn(vectors=10)
    b.earn(texts=2)
    assert b.credit == pytest.approx(2 * lb.CALL_CREDIT + 10 * lb.VECTOR_CREDIT + 2 * lb.TEXT_CREDIT)
    assert b.affordable([b.credit / 2, b.credit / 2, 1.0]) == 2
    b.spend(b.credit + 5)
    assert b.credit == pytest.approx(-5) and b.affordable([0.5]) == 0
