"""Conversation structure over vector rows: each live memory's neighbours in its thread.

A thread is a conversation (or a session of one) inside a namespace: the memories added with
the same ``thread=`` (or, without one, every memory of the namespace), in the order of their
``turn=`` (or of their ids: insertion order). Retrieval reads the neighbours (``RowTable.prev``
and ``RowTable.next``): a turn that asks a question passes score to the turns that answer it,
and a hit can carry its adjacent turns as context (``store.context``).

The links are derived state, rebuilt from the database's columns at open (``link_all``) and
kept by the row table's writes: appended turns join their thread's tail in O(1); a memory that
dies is unlinked; a replaced memory's new row takes its old row's place; anything else (a turn
given out of order, a large deletion) relinks the threads it touched from the columns.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Links(Protocol):
    """The columns the links live in and are derived from: ``store.rowtable.RowTable`` holds
    them, one entry per vector row, and calls this module from its writes (so this module
    names the columns, not the table)."""

    n: int
    live: np.ndarray
    group: np.ndarray
    order: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    tails: dict[int, int]

#: Dying rows past which their threads are relinked from the columns instead of unlinked one
#: by one (a Python step per row).
_UNLINK_ONE_BY_ONE = 1024


def group_key(namespace: str, thread: str | None) -> str:
    """The row table's key of a (namespace, thread) pair; no thread = the namespace's own."""
    return namespace + "\x1f" + (thread or "")


def link_all(t: Links) -> None:
    """Link every live row to its thread neighbours from the group and order columns."""
    n = t.n
    t.prev[:n] = -1
    t.next[:n] = -1
    t.tails = {}
    rows = np.flatnonzero(t.live[:n] & (t.group[:n] >= 0))
    if len(rows):
        _chain(t, rows, set_tails=True)


def link_new(t: Links, rows: np.ndarray) -> None:
    """Link rows whose group and order were just set (new memories, in any order)."""
    rows = np.asarray(rows, np.int64)
    rows = rows[t.live[rows] & (t.group[rows] >= 0)]
    if not len(rows):
        return
    g = t.group[rows]
    order = np.lexsort((rows, t.order[rows], g))
    r, g = rows[order], g[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    ends = np.r_[starts[1:], len(r)]
    stale = set()
    for s, e in zip(starts.tolist(), ends.tolist()):
        grp, first, last = int(g[s]), int(r[s]), int(r[e - 1])
        tail = t.tails.get(grp)
        if tail is not None and (t.order[tail], tail) > (t.order[first], first):
            stale.add(grp)  # a turn given before the thread's last one: relink from the columns
            continue
        _chain(t, r[s:e], set_tails=False)
        if tail is not None:
            t.next[tail] = first
            t.prev[first] = tail
        t.tails[grp] = last
    for grp in stale:
        relink(t, grp)


def unlink(t: Links, rows: np.ndarray) -> None:
    """Take dying rows (still marked live) out of their threads."""
    rows = np.asarray(rows, np.int64)
    rows = np.unique(rows[t.live[rows] & (t.group[rows] >= 0)])
    if len(rows) > _UNLINK_ONE_BY_ONE:
        groups = np.unique(t.group[rows]).tolist()
        t.live[rows] = False  # relink reads the live column: the caller kills them anyway
        for grp in groups:
            relink(t, grp)
        t.prev[rows] = -1
        t.next[rows] = -1
        return
    prev, nxt = t.prev, t.next
    for r in rows.tolist():
        p, n = int(prev[r]), int(nxt[r])
        if p >= 0:
            nxt[p] = n
        if n >= 0:
            prev[n] = p
        grp = int(t.group[r])
        if t.tails.get(grp) == r:
            if p >= 0:
                t.tails[grp] = p
            else:
                del t.tails[grp]
        prev[r] = nxt[r] = -1


def take_place(t: Links, old_rows: np.ndarray, new_rows: np.ndarray) -> None:
    """New rows of the same memories (a replaced text or vector) take their old rows' places
    in their threads; the old rows leave them. Where the thread or the turn changed, or the
    old row was not linked (archived), the thread is relinked from the columns."""
    redo = set()
    for o, n in zip(np.asarray(old_rows, np.int64).tolist(), np.asarray(new_rows, np.int64).tolist()):
        grp = int(t.group[n])
        linked = t.live[o] and t.group[o] >= 0
        if not linked or t.group[o] != grp or t.order[o] != t.order[n]:
            redo.add(grp)
            if linked:
                redo.add(int(t.group[o]))
            continue
        p, x = int(t.prev[o]), int(t.next[o])
        t.prev[n], t.next[n] = p, x
        if p >= 0:
            t.next[p] = n
        if x >= 0:
            t.prev[x] = n
        if t.tails.get(grp) == o:
            t.tails[grp] = n
        t.prev[o] = t.next[o] = -1
    if redo:
        dying = np.asarray(old_rows, np.int64)
        was = t.live[dying].copy()
        t.live[dying] = False  # the old rows are about to die: keep them out of the relink
        for grp in redo:
            if grp >= 0:
                relink(t, grp)
        t.live[dying] = was
        t.prev[dying] = -1  # out of every thread: their unlink when they die finds nothing
        t.next[dying] = -1


def relink(t: Links, grp: int) -> None:
    """Link one thread's live rows from the group and order columns."""
    n = t.n
    rows = np.flatnonzero((t.group[:n] == grp) & t.live[:n])
    if not len(rows):
        t.tails.pop(grp, None)
        return
    r = rows[np.lexsort((rows, t.order[rows]))]
    t.prev[r] = np.r_[-1, r[:-1]]
    t.next[r] = np.r_[r[1:], -1]
    t.tails[grp] = int(r[-1])


def _chain(t: Links, rows: np.ndarray, *, set_tails: bool) -> None:
    """Link ``rows`` (any order, several threads) to each other, thread by thread in turn
    order; the first and last row of each thread get no outer neighbour."""
    g = t.group[rows]
    order = np.lexsort((rows, t.order[rows], g))
    r, g = rows[order], g[order]
    same = g[1:] == g[:-1]
    t.prev[r] = -1
    t.next[r] = -1
    t.prev[r[1:][same]] = r[:-1][same]
    t.next[r[:-1][same]] = r[1:][same]
    if set_tails:
        last = np.flatnonzero(np.r_[~same, True])
        t.tails.update(zip(g[last].tolist(), r[last].tolist()))


def before(t: Links, rows: np.ndarray, hops: int) -> np.ndarray:
    """(hops, len(rows)): per row of ``rows`` its turn ``d`` turns before it (-1: none), for
    d = 1..hops."""
    out = np.empty((hops, len(rows)), np.int64)
    back = np.asarray(rows, np.int64)
    for d in range(hops):
        back = np.where(back >= 0, t.prev[np.maximum(back, 0)], -1)
        out[d] = back
    return out


def neighbours(t: Links, rows: np.ndarray, hops: int) -> list[np.ndarray]:
    """``[prev_1, next_1, prev_2, next_2, ...]``: per row of ``rows`` its neighbour ``d`` turns
    before and after (-1: none), for d = 1..hops."""
    out = []
    back, ahead = np.asarray(rows, np.int64), np.asarray(rows, np.int64)
    for _ in range(hops):
        back = np.where(back >= 0, t.prev[np.maximum(back, 0)], -1)
        ahead = np.where(ahead >= 0, t.next[np.maximum(ahead, 0)], -1)
        out += [back, ahead]
    return out
