"""Store invariants under random sequences of add_many / update / delete / organize / reopen.

Small stores (embedder=False, slm=False, small clusters and frequent periodic organisation) so
the split, merge, drop and re-route paths all run within a few dozen memories. After every
step the index's cluster state and the database must agree:

* every live row is in exactly one primary cluster once the store is clustered (none before);
* deleted and replaced rows are in no cluster, primary or secondary;
* cluster sizes equal their member counts, and no row points at a dropped cluster;
* each centre is the normalised sum of its primary members (no anchors without an SLM);
* the assignment records' rank-0 cluster is the index's primary cluster of every live memory.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clag_fast.config import StoreConfig
from clag_fast.store import MemoryStore
from store_helpers import DIM, topic_vectors

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 40), st.integers(0, 2**16)),
        st.tuples(st.just("update"), st.integers(0, 10**6), st.integers(0, 2**16)),
        st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 5)),
        st.tuples(st.just("organize"), st.just(0), st.just(0)),
        st.tuples(st.just("reopen"), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=14,
)

configs = st.builds(
    lambda min_n, target, extra, every: StoreConfig(
        min_memories_to_cluster=min_n, target_cluster_size=target, max_cluster_size=target + extra,
        organize_every=every, slm="off"),
    st.integers(2, 30), st.integers(2, 4), st.integers(1, 6), st.sampled_from([0, 5, 17]),
)


def check_invariants(store: MemoryStore) -> None:
    state = store._state
    idx, rows = state.index, state.rows
    n = len(idx)
    ids = idx.cluster_ids()
    sizes = idx.cluster_sizes()
    alive = set(ids.tolist())
    primary = idx.cluster_of(np.arange(n, dtype=np.int64)) if n else np.zeros(0, np.int64)
    live = np.zeros(n, bool)
    live[: rows.n] = rows.live[: min(rows.n, n)]
    # No row points at a dropped cluster.
    assert set(np.unique(primary[primary >= 0]).tolist()) <= alive
    if alive:
        assert (primary[live] >= 0).all(), "a live row outside every cluster of a clustered store"
    assert (primary[~live] == -1).all(), "a deleted row still has a primary cluster"
    vecs = idx.vectors()
    seen = np.zeros(n, np.int64)
    centres = idx.centres()
    for slot, (cid, size) in enumerate(zip(ids.tolist(), sizes.tolist())):
        members = idx.members(cid)
        assert len(members) == size
        assert (primary[members] == cid).all()
        seen[members] += 1
        assert live[idx.secondary_members(cid)].all(), "a deleted row is a secondary member"
        if size:
            s = vecs[members].astype(np.float64).sum(axis=0)
            np.testing.assert_allclose(centres[slot], s / np.linalg.norm(s), atol=2e-4)
    # Exactly one primary cluster per assigned row.
    assert (seen == (primary >= 0)).all()
    # The assignment record's rank-0 cluster is the index's primary.
    live_rows = np.flatnonzero(live)
    rank0 = state.assignments.read(live_rows)[0][:, 0]
    for row, first in zip(live_rows.tolist(), rank0.tolist()):
        if primary[row] >= 0:
            assert first == int(primary[row]), (row, first, int(primary[row]))
        else:
            assert first not in alive
    assert len(store) == int(live.sum())


@SETTINGS
@given(configs, ops, st.integers(0, 2**16))
def test_invariants_hold_after_random_operations(tmp_path_factory, config, steps, seed):
    path = tmp_path_factory.mktemp("inv") / "s"
    store = MemoryStore.open(path, config=config, embedder=False, slm=False)
    live_ids: list[int] = []
    rng = np.random.default_rng(seed)
    centres_seed = int(rng.integers(0, 2**16))
    try:
        for op, a, b in steps:
            if op == "add":
                vecs, topics = topic_vectors(a, 4, seed=centres_seed, spread=0.3 + 0.1 * (b % 5))
                vecs = vecs[np.random.default_rng(b).permutation(a)]
                live_ids += store.add_many([f"memory {b}-{i}" for i in range(a)], embeddings=vecs)
            elif op == "update" and live_ids:
                mid = live_ids[a % len(live_ids)]
                v = np.random.default_rng(b).standard_normal(DIM).astype(np.float32)
                store.update(mid, text=f"updated {b}", embedding=v)
            elif op == "delete" and live_ids:
                for _ in range(min(b, len(live_ids))):
                    store.delete(live_ids.pop(a % len(live_ids)))
            elif op == "organize" and len(live_ids) >= 2:
                store.organize()
            elif op == "reopen":
                store.close()
                store = MemoryStore.open(path, config=config, embedder=False, slm=False)
            check_invariants(store)
    finally:
        store.close()
