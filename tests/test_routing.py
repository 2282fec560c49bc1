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
