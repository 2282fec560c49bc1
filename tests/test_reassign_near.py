"""Re-assignment of touched clusters' members among their cluster's nearest centres
(``organize.reassign_near``): it agrees with re-assignment against every centre on clustered
data, a member stranded far from its cluster's neighbourhood still finds its best cluster,
and the assignment records follow the index."""

from __future__ import annotations

import numpy as np
import pytest

from clag_fast.config import StoreConfig
from clag_fast.store import MemoryStore
from clag_fast.store import organize as org
from store_helpers import topic_vectors

# Many small clusters (well over NEAR_CENTRES), organised only when asked.
CFG = StoreConfig(min_memories_to_cluster=50, target_cluster_size=4, max_cluster_size=16,
                  organize_every=0, slm="off")


def _store(tmp_path, n=3000, topics=150):
    vecs, _ = topic_vectors(n, topics, seed=3)
    s = MemoryStore.open(tmp_path / "s", config=CFG, embedder=False, slm=False)
    s.add_many([f"m{i}" for i in range(n)], embeddings=vecs)
    s.organize()
    return s, vecs


def _primary_and_db_agree(state):
    live = state.rows.live_rows()
    primary = state.index.cluster_of(live)
    assert (primary >= 0).all()
    assert (state.assignments.read(live)[0][:, 0] == primary).all()


def test_agrees_with_exact_reassignment_on_clustered_data(tmp_path):
    s, vecs = _store(tmp_path)
    state = s._state
    with state.lock.write():
        ids = state.index.cluster_ids()
        assert len(ids) > 2 * org.NEAR_CENTRES, "the test needs more clusters than NEAR_CENTRES"
        rows = np.concatenate([state.index.members(c) for c in ids.tolist()])
        exact_ids, _ = state.index.soft_assign(state.index.vectors()[rows], k=CFG.soft_k)
        assert org.reassign_near(state, set(ids.tolist())) == len(rows)
        got = state.index.cluster_of(rows)
        # Coarse routing (the exact path here) and the nearest-centres path may differ on a
        # border row; on topic data they agree almost everywhere.
        assert (got == exact_ids[:, 0]).mean() >= 0.99
        _primary_and_db_agree(state)
    s.close()


def test_a_member_far_from_its_cluster_falls_back_to_every_centre(tmp_path):
    s, vecs = _store(tmp_path)
    state = s._state
    with state.lock.write():
        ids = state.index.cluster_ids()
        centres = state.index.centres()
        row = 0
        best = int(state.index.cluster_of(np.array([row]))[0])
        # Put the row into the cluster whose centre is least like it: its own cluster is then
        # far outside that cluster's nearest centres.
        worst = int(ids[np.argmin(centres @ vecs[row])])
        assert worst != best
        state.index.assign(np.array([row]), np.array([[worst, -1, -1]]))
        org.reassign_near(state, {worst})
        assert int(state.index.cluster_of(np.array([row]))[0]) == best
        _primary_and_db_agree(state)
    s.close()


def test_near_assign_matches_numpy_over_each_clusters_nearest_centres(tmp_path):
    """The native kernel behind reassign_near, against the same computation in numpy: each
    member's top-k among its cluster's ``near`` nearest centres (by centre cosine)."""
    s, _ = _store(tmp_path)
    idx = s._state.index
    ids, centres, vectors = idx.cluster_ids(), idx.centres(), idx.vectors()
    want = ids[::7]
    near, k = 8, 3
    rows, got_ids, got_scores = idx.near_assign(want, near, k)
    expect_rows = np.concatenate([idx.members(c) for c in want.tolist()])
    np.testing.assert_array_equal(rows, expect_rows)
    at = 0
    for c in want.tolist():
        nb = np.argsort(-(centres @ centres[np.searchsorted(ids, c)]), kind="stable")[:near]
        members = idx.members(c)
        sims = vectors[members] @ centres[nb].T
        top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        np.testing.assert_allclose(got_scores[at:at + len(members)], np.take_along_axis(sims, top, axis=1), atol=1e-5)
        # Same ids wherever the scores are not tied.
        gap = np.take_along_axis(sims, top, axis=1)
        clear = np.ones(len(members), bool) if k == 1 else (np.abs(np.diff(gap, axis=1)) > 1e-5).all(axis=1)
        np.testing.assert_array_equal(got_ids[at:at + len(members)][clear], ids[nb][top][clear])
        at += len(members)
    assert got_ids.shape == (len(rows), k) and got_scores.dtype == np.float32
    with pytest.raises(KeyError, match="unknown cluster"):
        idx.near_assign(np.array([int(ids.max()) + 1000]), near, k)
    # More columns than near centres: padded with -1 / -inf.
    rows2, ids2, scores2 = idx.near_assign(want[:3], 2, 4)
    assert (ids2[:, 2:] == -1).all() and np.isneginf(scores2[:, 2:]).all() and (ids2[:, :2] >= 0).all()
    s.close()
