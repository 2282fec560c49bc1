"""Applying the forgetting policy (``clag_fast.decay.ForgettingPolicy``) to a store: prune
memories whose decayed weight fell below the threshold and archive clusters no query touched
for long. Runs under the store's write lock, only when ``MemoryStore.forget()`` is called."""

from __future__ import annotations

from typing import Any

import numpy as np

from clag_fast.decay import DAY, ForgettingPolicy  # noqa: F401 -- re-exported
from clag_fast.store.catalog import ARCHIVED
from clag_fast.store.state import StoreState


def forget(state: StoreState, now: float) -> dict[str, Any]:
    state.flush_access()  # decay must see the latest accesses
    policy = state.config.forgetting
    rows = state.rows
    report: dict[str, Any] = {"pruned": 0, "action": policy.prune_action, "archived_clusters": []}
    if policy.active:
        weights = rows.weights(policy, now)
        victims = np.flatnonzero(rows.live[: rows.n] & policy.prune_mask(weights))
        if len(victims):
            retire(state, victims, policy.prune_action)
            report["pruned"] = int(len(victims))
    if policy.archive_clusters_after_days is not None:
        stale = [c for c, last, created in state.catalog.cluster_hits()
                 if policy.cluster_is_stale(now, last, created)]
        for cid in stale:
            members = state.index.members(cid)
            retire(state, members[state.rows.live[members]], "archive")
            if len(state.index.members(cid)) == 0:
                state.index.drop_cluster(cid)
            report["archived_clusters"].append(cid)
        state.catalog.archive_clusters(stale)
    state.flush_index()
    return report


def retire(state: StoreState, rows: np.ndarray, action: str) -> None:
    """Archive (kept, never searched) or delete the memories at ``rows``."""
    mids = state.rows.memory_id[rows].tolist()
    if action == "delete":
        state.delete_rows(mids, rows)
        return
    state.catalog.set_state(mids, ARCHIVED)
    state.index.unassign(rows)
    state.rows.kill(rows)
    state.cache.clear()
