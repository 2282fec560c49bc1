"""Routing against many clusters goes through a coarse layer of centre groups (rust/coarse.rs):
approximate, so it is checked against exact numpy routing here, and it must never return a
dropped cluster or a score the centre does not have."""

from __future__ import annotations

import numpy as np
import pytest

from clag_fast.index import VectorIndex

DIM = 48


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture()
def many_clusters(tmp_path):
    rng = np.random.default_rng(3)
    topics = _unit(rng.standard_normal((300, DIM)))
    # several centres per topic, as splits leave them; rows at cos ~0.7 from their topic
    centres = _unit(topics[rng.integers(0, 300, 1500)] + 0.5 * rng.standard_normal((1500, DIM)) / np.sqrt(DIM))
    idx = VectorIndex.open(tmp_path / "ix", dim=DIM)
    ids = [idx.new_cluster(centre=c) for c in centres]
    rows = _unit(topics[rng.integers(0, 300, 3000)] + 1.0 * rng.standard_normal((3000, DIM)) / np.sqrt(DIM))
    return idx, np.asarray(ids), rows


def test_coarse_routing_agrees_with_exact(many_clusters):
    idx, ids, rows = many_clusters
    got, scores = idx.soft_assign(rows, k=3)
    exact = rows @ idx.centres().T
    best = exact.max(axis=1)
    cid = idx.cluster_ids()
    # near-equal centres make the very top ambiguous: count a hit within 0.01 of the best
    assert np.mean(scores[:, 0] >= best - 0.01) >= 0.97
    assert np.mean(got[:, 0] == cid[np.argmax(exact, axis=1)]) >= 0.95
    # every returned score is the true cosine with that centre, best first
    slot = {c: i for i, c in enumerate(cid.tolist())}
    true = np.take_along_axis(exact, np.vectorize(slot.get)(got), axis=1)
    np.testing.assert_allclose(scores, true, atol=1e-4)
    assert np.all(np.diff(scores, axis=1) <= 1e-6)


def test_coarse_routing_skips_dropped_and_sees_new_clusters(many_clusters):
    idx, ids, rows = many_clusters
    first, _ = idx.soft_assign(rows[:200], k=1)
    victims = np.unique(first[:, 0])[:20]
    for c in victims.tolist():
        idx.drop_cluster(c)
    # a new cluster placed exactly on a row must win that row
    new = idx.new_cluster(centre=rows[7])
    got, scores = idx.soft_assign(rows[:200], k=2)
    assert not np.isin(got, victims).any()
    assert got[7, 0] == new and scores[7, 0] == pytest.approx(1.0, abs=1e-5)
