"""Topic-level operations: a cluster's members forgotten, moved or merged by hand.

Functions here run under the store's write lock (the facade's) and keep the index, the
assignment records and the database in the store's write order: the index state is saved
before the database says what it relies on (as an organisation does), so a kill leaves what
the next open's reconciliation repairs. After a manual change the touched clusters' drift
references are their centres now: the next organisation does not undo the change as drift.
A cluster's members are its primary members (``memories(cluster=...)`` lists the same).
"""

from __future__ import annotations

import numpy as np

from clag_fast.store import placement
from clag_fast.store.forgetting import retire
from clag_fast.store.state import StoreState

ACTIONS = ("archive", "delete")


def check_cluster(state: StoreState, cid: int) -> int:
    """``cid`` as an int when the index has that cluster; KeyError otherwise."""
    if isinstance(cid, bool) or not isinstance(cid, (int, np.integer)):
        raise TypeError(f"cluster id must be an int, got {type(cid).__name__}")
    cid = int(cid)
    ids = state.index.cluster_ids()
    at = int(np.searchsorted(ids, cid))
    if at >= len(ids) or ids[at] != cid:
        raise KeyError(f"no cluster with id {cid}")
    return cid


def member_rows(state: StoreState, cid: int, namespace: str | None = None) -> np.ndarray:
    """The live primary member rows of ``cid`` (of ``namespace`` only, when given)."""
    rows = state.index.members(cid)
    rows = rows[state.rows.live[rows]]
    if namespace is not None:
        rows = rows[state.rows.namespace[rows] == state.rows.code("namespace", namespace, create=False)]
    return rows


def forget(state: StoreState, cid: int, action: str = "archive", namespace: str | None = None) -> int:
    """Archive (kept, never searched) or delete the members of ``cid`` (of ``namespace``
    only, when given). A cluster left without members goes too (archived with its profile, or
    dropped), unless it is a template label. Returns the memories forgotten."""
    if action not in ACTIONS:
        raise ValueError(f"action must be 'archive' or 'delete', got {action!r}")
    cid = check_cluster(state, cid)
    rows = member_rows(state, cid, namespace)
    if len(rows):
        retire(state, rows, action)
    if len(state.index.members(cid)) == 0 and cid not in state.catalog.template_clusters():
        state.index.drop_cluster(cid)
        state.flush_index(durable=state.config.fsync)
        if action == "archive":
            state.catalog.archive_clusters([cid])
        else:
            state.catalog.drop_clusters([cid])
        state.profiles.pop(cid, None)
    else:
        state.flush_index(durable=state.config.fsync)
    state.cache.clear()
    return int(len(rows))


def move(state: StoreState, cid: int, to: int, memory_ids: list[int] | None = None,
         namespace: str | None = None) -> int:
    """Make ``to`` the primary cluster of members of ``cid``: all of them, those of
    ``namespace``, or the memories ``memory_ids`` (each must be a member: ValueError naming
    the first that is not). ``cid`` is dropped once it has no member left (not a template
    label). Returns the memories moved."""
    cid, to = check_cluster(state, cid), check_cluster(state, to)
    if cid == to:
        raise ValueError(f"cluster {cid} cannot be moved into itself")
    rows = member_rows(state, cid, namespace)
    if memory_ids is not None:
        want = np.asarray([int(m) for m in memory_ids], np.int64)
        have = state.rows.memory_id[rows]
        missing = want[~np.isin(want, have)]
        if len(missing):
            raise ValueError(f"memory {int(missing[0])} is not a member of cluster {cid}")
        rows = rows[np.isin(have, want)]
    if len(rows):
        placement.move_rows(state, rows, [to] * len(rows))
    _drop_if_empty(state, cid)
    _rebase(state, {cid, to})
    state.flush_index(durable=state.config.fsync)
    state.cache.clear()
    return int(len(rows))


def merge(state: StoreState, keep: int, absorb: int) -> int:
    """Merge ``absorb`` into ``keep`` (its members, primary and secondary, join ``keep``,
    whose profile stays; ``absorb`` is dropped). Returns the primary members moved."""
    keep, absorb = check_cluster(state, keep), check_cluster(state, absorb)
    if keep == absorb:
        raise ValueError(f"cluster {keep} cannot be merged with itself")
    idx = state.index
    moved = idx.members(absorb)
    touched = np.union1d(moved, idx.secondary_members(absorb))
    idx.merge(keep, absorb)
    _renumber_records(state, touched, absorb, keep)
    _rebase(state, {keep})
    state.flush_index(durable=state.config.fsync)
    state.catalog.drop_clusters([absorb])
    state.profiles.pop(absorb, None)
    state.cache.clear()
    return int(len(moved))


def _drop_if_empty(state: StoreState, cid: int) -> None:
    if len(state.index.members(cid)) == 0 and cid not in state.catalog.template_clusters():
        state.index.drop_cluster(cid)
        state.flush_index(durable=state.config.fsync)
        state.catalog.drop_clusters([cid])
        state.profiles.pop(cid, None)


def _renumber_records(state: StoreState, rows: np.ndarray, old: int, new: int) -> None:
    """In the assignment records of ``rows``: ``old`` becomes ``new`` (a pair of ``new``
    already there keeps its place, the other goes), best first, -1 padding at the end."""
    if len(rows) == 0:
        return
    ids, aff = state.assignments.read(rows)
    has_new = (ids == new).any(axis=1)
    at_old = ids == old
    ids[at_old & ~has_new[:, None]] = new
    drop = at_old & has_new[:, None]
    ids[drop] = -1
    # Left-pack each row (a stable sort on "is padding" keeps the pairs' order).
    order = np.argsort(ids < 0, axis=1, kind="stable")
    ids = np.take_along_axis(ids, order, axis=1)
    aff = np.take_along_axis(aff, order, axis=1)
    state.assignments.write(rows, ids, aff)


def _rebase(state: StoreState, cids: set[int]) -> None:
    """The drift references of ``cids`` become their centres now (``organize.drifted``)."""
    if state.organized_centres is None:
        return
    before_ids, before = state.organized_centres
    ids, centres = state.index.cluster_ids(), state.index.centres()
    ref = np.zeros_like(centres)
    common, now_at, then_at = np.intersect1d(ids, before_ids, return_indices=True)
    ref[now_at] = before[then_at]
    fresh = np.isin(ids, np.fromiter(cids, np.int64, len(cids))) | ~np.isin(ids, common)
    ref[fresh] = centres[fresh]
    state.organized_centres = (ids, ref)
