"""What a reader of some namespaces may learn about clusters shared with others.

A cluster's label (summary and tags) is written from the texts of the memories it lists (the
ones its search scans: a memory's primary cluster, and a secondary one whose affinity is within
``StoreConfig.spill_margin`` of the primary's), and clusters span namespaces, so a label is
shown to a reader only when every memory the cluster lists lies in namespaces the reader may
read. A secondary affinity record further away (a memory's third-nearest cluster, perhaps at
cosine 0.01) lists nothing and writes nothing into the label."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from clag_fast.store import routing


def listed_in(memories: Sequence[Any], margin: float) -> list[list[int]]:
    """Per memory, the clusters that list it: the store's own membership rule
    (``store.routing.memberships``) applied to its affinity records, one call per batch."""
    k = max((len(m.clusters) for m in memories), default=0)
    if k == 0:
        return [[] for _ in memories]
    ids = np.full((len(memories), k), -1, np.int64)
    scores = np.full((len(memories), k), -np.inf, np.float32)
    for i, m in enumerate(memories):
        for j, (cid, affinity) in enumerate(m.clusters):
            ids[i, j], scores[i, j] = cid, affinity
    listed = routing.memberships(ids, scores, k, margin)
    return [[int(c) for c in row if c >= 0] for row in listed.tolist()]


def cluster_namespaces(store: Any) -> dict[int, frozenset[str]]:
    """cluster id -> the namespaces of every live memory it lists (one pass over the store's
    listing)."""
    margin = float(store.config.spill_margin)
    seen: dict[int, set[str]] = {}
    cursor = None
    while True:
        page = store.memories(limit=1000, cursor=cursor)
        for m, cids in zip(page.items, listed_in(page.items, margin)):
            for cid in cids:
                seen.setdefault(cid, set()).add(m.namespace)
        cursor = page.next_cursor
        if cursor is None:
            return {c: frozenset(ns) for c, ns in seen.items()}


def pure_clusters(table: dict[int, frozenset[str]], can_read: Callable[[str], bool]) -> set[int]:
    """Clusters all of whose members the reader may read."""
    return {c for c, names in table.items() if all(can_read(n) for n in names)}


def namespace_counts(store: Any, can_read: Callable[[str], bool]) -> dict[str, int]:
    """Live memories per namespace the reader may read."""
    out = {}
    for ns in store.namespaces():
        if can_read(ns):
            n, cursor = 0, None
            while True:
                page = store.memories(namespace=ns, limit=1000, cursor=cursor)
                n += len(page.items)
                cursor = page.next_cursor
                if cursor is None:
                    break
            out[ns] = n
    return out
