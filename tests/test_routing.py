"""store.routing.leaders: the greedy leader clustering of rows that open new clusters."""

from __future__ import annotations

import numpy as np
import pytest

from clag_fast.store import routing


def leaders_one_by_one(vectors: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """The rule stated plainly: each row, in order, joins its most similar earlier leader at or
    above ``threshold`` (the first on a tie), else leads."""
    m = len(vectors)
    sims = vectors @ vectors.T
    lead = np.empty(m, np.int64)
    aff = np.ones(m, np.float32)
    is_leader = np.zeros(m, bool)
    for i in range(m):
        earlier = np.flatnonzero(is_leader[:i])
        cand = sims[i, earlier]
        if len(cand) and cand.max() >= threshold:
            j = int(earlier[int(np.argmax(cand))])
            lead[i], aff[i] = lead[j], cand.max()
        else:
            lead[i] = i
            is_leader[i] = True
    return lead, aff


@pytest.mark.parametrize("seed", range(40))
def test_leaders_follow_the_one_by_one_rule(seed):
    rng = np.random.default_rng(seed)
    m, d, k = int(rng.integers(1, 150)), int(rng.integers(2, 24)), int(rng.integers(1, 12))
    centres = rng.standard_normal((k, d))
    x = centres[rng.integers(0, k, m)] + rng.standard_normal((m, d)) * rng.uniform(0.05, 2.0)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    threshold = float(rng.uniform(-0.2, 0.95))
    lead, aff = routing.leaders(x, threshold)
    want_lead, want_aff = leaders_one_by_one(x, threshold)
    assert lead.tolist() == want_lead.tolist()
    np.testing.assert_allclose(aff, want_aff)


def test_far_apart_rows_each_lead_and_duplicates_follow_the_first():
    x = np.eye(6, dtype=np.float32)
    x = np.concatenate([x, x[[2]]])  # row 6 repeats row 2
    lead, aff = routing.leaders(x, 0.2)
    assert lead.tolist() == [0, 1, 2, 3, 4, 5, 2]
    assert aff[6] == pytest.approx(1.0)


def test_within_room_keeps_the_first_leaders_and_their_followers():
    lead = np.asarray([0, 1, 0, 3, 1, 5, 3])
    assert routing.within_room(lead, 2).tolist() == [True, True, True, False, True, False, False]
    assert routing.within_room(lead, 0).tolist() == [False] * 7
    assert routing.within_room(lead, 10).all()


def test_unstructured_vectors_stop_opening_clusters_at_the_cap(tmp_path, monkeypatch):
    """Isotropic vectors are far from every centre: past the cap, a far memory joins its
    nearest cluster instead of opening one, and every memory stays findable by its vector."""
    from clag_fast import MemoryStore, StoreConfig
    from clag_fast.store import placement

    monkeypatch.setattr(placement, "MIN_CLUSTER_ROOM", 16)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1200, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cfg = StoreConfig(dim=384, slm="off")
    with MemoryStore.open(tmp_path / "s", config=cfg, embedder=False) as store:
        for lo in range(0, len(x), 100):
            store.add_many([f"note {i}" for i in range(lo, lo + 100)], embeddings=x[lo:lo + 100])
            n = lo + 100
            target = cfg.cluster_sizes_for(n)[0]
            assert len(store.clusters()) <= max(16, int(np.ceil(placement.CLUSTERS_PER_TARGET * n / target)))
        # Most rows were far, yet far fewer opened a cluster than the rows the cold start left.
        assert 0 < store.stats()["routing"]["new"] < 200
        for i in (5, 640, 1111):
            assert store.search(x[i], k=1)[0].text == f"note {i}"


def test_far_memories_open_clusters_below_the_cap(tmp_path):
    from clag_fast import MemoryStore, StoreConfig

    rng = np.random.default_rng(4)
    x = rng.standard_normal((400, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    with MemoryStore.open(tmp_path / "s", config=StoreConfig(dim=384, slm="off"), embedder=False) as store:
        store.add_many([f"note {i}" for i in range(200)], embeddings=x[:200])
        assert store.stats()["routing"]["new"] == 0  # the cold start placed these
        store.add_many([f"note {i}" for i in range(200, 400)], embeddings=x[200:])
        # Far from every centre, and the store holds far fewer than 1,024 clusters: each
        # memory of the second call opens a cluster (or joins one its call opened).
        assert store.stats()["routing"]["new"] >= 190
