"""What a reader of some namespaces may learn about clusters shared with others.

A cluster's label (summary and tags) is written from the texts of the memories it lists (the
ones its search scans: a memory's primary cluster, and a secondary one whose affinity is within
``StoreConfig.spill_margin`` of the primary's), and clusters span namespaces, so a label is
shown to a reader only when every memory the cluster lists lies in namespaces the reader may
read. A secondary affinity record further away (a memory's third-nearest cluster, perhaps at
cosine 0.01) lists nothing and writes nothing into the label."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from clag_fast.store import routing


def listed_in(memory: Any, margin: float) -> list[int]:
    """The clusters that list ``memory``: the store's own membership rule
    (``store.routing.memberships``) applied to its affinity records."""
    if not memory.clusters:
        return []
    ids = np.asarray([[cid for cid, _ in memory.clusters]], np.int64)
    scores = np.asarray([[affinity for _, affinity in memory.clusters]], np.float32)
    return [int(c) for c in routing.memberships(ids, scores, ids.shape[1], margin)[0] if c >= 0]


def cluster_namespaces(store: Any) -> dict[int, frozenset[str]]:
    """cluster id -> the namespaces of every live memory it lists (one pass over the store's
    listing)."""
    margin = float(store.config.spill_margin)
    seen: dict[int, set[str]] = {}
    cursor = None
    while True:
        page = store.memories(limit=1000, cursor=cursor)
        for m in page.items:
            for cid in listed_in(m, margin):
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
