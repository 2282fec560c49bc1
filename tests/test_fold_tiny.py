"""Folding tiny clusters into their nearest larger cluster (``organize.fold_tiny``): the
targets are those of the dense product of every tiny centre with every other centre, the
folded members and secondary links land where single merges would put them, and the
assignment records are redone for the rows that named a folded cluster."""

from __future__ import annotations

import numpy as np

from clag_fast.config import StoreConfig
from clag_fast.store import MemoryStore
from clag_fast.store import organize as org

CFG = StoreConfig(min_memories_to_cluster=50, target_cluster_size=4, max_cluster_size=16,
                  organize_every=0, slm="off")


def _iso_store(tmp_path, n=600, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 48)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    s = MemoryStore.open(tmp_path / "s", config=CFG, embedder=False, slm=False)
    s.add_many([f"m{i}" for i in range(n)], embeddings=x)
    s.organize()
    return s


def _split_tiny(state):
    ids, sizes = state.index.cluster_ids(), state.index.cluster_sizes()
    tiny = sizes <= np.sort(sizes)[len(sizes) // 3]
    assert tiny.any() and not tiny.all()
    return ids[tiny], ids[~tiny]


def test_fold_targets_equal_the_dense_reference(tmp_path):
    s = _iso_store(tmp_path)
    state = s._state
    with state.lock.write():
        tiny, rest = _split_tiny(state)
        ids, centres = state.index.cluster_ids(), state.index.centres()
        at = {c: i for i, c in enumerate(ids.tolist())}
        sims = centres[[at[c] for c in tiny.tolist()]] @ centres.T
        sims[:, ~np.isin(ids, rest)] = -np.inf
        want = ids[np.argmax(sims, axis=1)]
        best = sims.max(axis=1)
        got = dict((c, t) for t, c in org.fold_targets(state, tiny, rest))
        assert sorted(got) == sorted(tiny.tolist())
        for i, c in enumerate(tiny.tolist()):
            # Equal, or a tie to float rounding between two centres.
            assert got[c] == want[i] or abs(sims[i, at[got[c]]] - best[i]) < 1e-5
        assert org.fold_targets(state, tiny, np.zeros(0, np.int64)) == []
    s.close()


def test_fold_tiny_moves_members_like_single_merges(tmp_path):
    s = _iso_store(tmp_path)
    state = s._state
    with state.lock.write():
        tiny, rest = _split_tiny(state)
        pairs = org.fold_targets(state, tiny, rest)
        expect = {c: set(state.index.members(c).tolist()) for c in rest.tolist()}
        for t, c in pairs:
            expect[t] |= set(state.index.members(c).tolist())
        linked = set().union(*(state.index.secondary_members(c).tolist() for c in tiny.tolist()))
        stray: set[int] = set()
        assert org.fold_tiny(state, tiny, rest, stray) == pairs
        assert stray == linked
        assert sorted(state.index.cluster_ids().tolist()) == sorted(rest.tolist())
        for c, rows in expect.items():
            assert set(state.index.members(c).tolist()) == rows
        live = state.rows.live_rows()
        assert (state.index.cluster_of(live) >= 0).all()
    s.close()


def test_an_organisation_after_a_fold_leaves_no_tiny_cluster_behind(tmp_path):
    s = _iso_store(tmp_path)
    report = s.organize()
    state = s._state
    sizes = state.index.cluster_sizes()
    assert (sizes >= state.config.min_cluster_size).all(), report
    live = state.rows.live_rows()
    assert (state.assignments.read(live)[0][:, 0] == state.index.cluster_of(live)).all()
    s.close()
