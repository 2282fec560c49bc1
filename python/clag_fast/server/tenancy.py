"""What a reader of some namespaces may learn about clusters shared with others.

A cluster's label (summary and tags) is written from its members' texts, and clusters span
namespaces, so a label is shown to a reader only when every memory assigned to the cluster
(at any rank) lies in namespaces the reader may read."""

from __future__ import annotations

from typing import Any, Callable


def cluster_namespaces(store: Any) -> dict[int, frozenset[str]]:
    """cluster id -> the namespaces of every live memory assigned to it (one pass over the
    store's listing)."""
    seen: dict[int, set[str]] = {}
    cursor = None
    while True:
        page = store.memories(limit=1000, cursor=cursor)
        for m in page.items:
            for cid, _ in m.clusters:
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
