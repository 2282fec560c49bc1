"""The turns a reflection restates, so a reflection that matches a query lifts them.

An agent's reflection ("Budget updated: now CAD 10,500 for two") sums up earlier turns of its
conversation in the words a question uses, and outranks those turns: on LoCoMo with its
observations stored as reflections, held-out Recall@10 of the evidence turns fell from 0.784
to 0.696 (BENCHMARKS.md, "An agent's reflections"). A reflection's sources are the earlier
turns of its thread most similar to it (its vector against theirs, among the
``RankingConfig.reflection_window`` turns before it); a reflection among a query's best
candidates passes a share of its score to the best eligible ones (``store.context``).

The turns before a reflection are ranked once and kept until a write touches its thread (a
turn given out of order, a deletion, an update); each search takes the best of them that its
filters leave.
"""

from __future__ import annotations

import numpy as np

from clag_fast.store.rowtable import RowTable


class Sources:
    """Per reflection row, the turns before it in its thread ranked by similarity, cached."""

    def __init__(self) -> None:
        self._ranked: dict[int, np.ndarray] = {}  # reflection row -> earlier rows, most similar first
        self._version = -1  # the row table's version the cache is valid at
        self._made_with: tuple[int, int] | None = None  # (kind code, window) the cache was ranked with

    def of(self, rows: RowTable, vectors: np.ndarray, refl: np.ndarray, kind: int, window: int, count: int,
           eligible: np.ndarray) -> list[np.ndarray]:
        """The sources of each row of ``refl`` (rows of kind code ``kind``): the ``count`` most
        similar ``eligible`` turns among the ``window`` turns before it in its thread that are
        not of that kind themselves."""
        self._follow(rows, (kind, window))
        out = []
        for r in refl.tolist():
            ranked = self._ranked.get(r)
            if ranked is None:
                ranked = _rank_before(rows, vectors, r, kind, window)
                self._ranked[r] = ranked
            out.append(ranked[eligible[ranked]][:count])
        return out

    def _follow(self, rows: RowTable, made_with: tuple[int, int]) -> None:
        """Drop the rankings of reflections in the threads that writes changed since (all of
        them when the kind or the window asked for differ)."""
        if self._version == rows.version and self._made_with == made_with:
            return
        changed = rows.changed_since(self._version) if self._version >= 0 else None
        if changed is None or self._made_with != made_with:
            self._ranked = {}
        elif len(changed) and self._ranked:
            groups = set(rows.group[changed].tolist())
            # A copy of the items: concurrent searches may add to the dict meanwhile.
            self._ranked = {r: s for r, s in list(self._ranked.items()) if int(rows.group[r]) not in groups}
        self._version = rows.version
        self._made_with = made_with


def _rank_before(rows: RowTable, vectors: np.ndarray, r: int, kind: int, window: int) -> np.ndarray:
    """The ``window`` turns before row ``r`` in its thread, less those of kind ``kind``, most
    similar to ``r`` first."""
    before = []
    prev, kinds = rows.prev, rows.kind
    at = int(prev[r])
    for _ in range(window):
        if at < 0:
            break
        if kinds[at] != kind:
            before.append(at)
        at = int(prev[at])
    if not before:
        return np.empty(0, np.int64)
    ranked = np.asarray(before, np.int64)
    sims = np.einsum("ij,j->i", vectors[ranked], vectors[r])
    return ranked[np.argsort(-sims, kind="stable")]
