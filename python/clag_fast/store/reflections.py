"""The turns a reflection restates, so a reflection that matches a query lifts them.

An agent's reflection ("Budget updated: now CAD 10,500 for two") sums up earlier turns of its
conversation in the words a question uses, and outranks those turns: on LoCoMo with its
observations stored as reflections, the evidence turn was in the top 3 for 0.526 of the held-out
questions against 0.664 without them (BENCHMARKS.md, "Reflections"). A reflection's sources
are the earlier turns of its thread most similar to it (its vector against theirs, the
``RankingConfig.reflection_window`` turns before it); a reflection among a query's best
candidates passes a share of its score to them (``store.context``).

Sources are found once per reflection and kept until a write touches its thread (a turn given
out of order, a deletion); a search checks that they are still live and eligible.
"""

from __future__ import annotations

import numpy as np

from clag_fast.store.rowtable import RowTable


class Sources:
    """Per reflection row, the rows of the turns it restates (best first), cached."""

    def __init__(self) -> None:
        self._of: dict[int, np.ndarray] = {}  # reflection row -> source rows
        self._version = -1  # the row table's version the cache is valid at

    def of(self, rows: RowTable, vectors: np.ndarray, refl: np.ndarray, kind: int, window: int,
           count: int) -> list[np.ndarray]:
        """The sources of each row of ``refl`` (rows of kind code ``kind``): at most ``count``
        of the ``window`` turns before it in its thread that are not reflections themselves."""
        self._follow(rows)
        out = []
        for r in refl.tolist():
            got = self._of.get(r)
            if got is None:
                got = self._find(rows, vectors, r, kind, window, count)
                self._of[r] = got
            out.append(got)
        return out

    def _follow(self, rows: RowTable) -> None:
        """Drop the sources of reflections in the threads that writes changed since."""
        if self._version == rows.version:
            return
        changed = rows.changed_since(self._version) if self._version >= 0 else None
        if changed is None:
            self._of = {}
        elif len(changed) and self._of:
            groups = set(rows.group[changed].tolist())
            self._of = {r: s for r, s in self._of.items() if int(rows.group[r]) not in groups}
        self._version = rows.version

    @staticmethod
    def _find(rows: RowTable, vectors: np.ndarray, r: int, kind: int, window: int, count: int) -> np.ndarray:
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
        before = np.asarray(before, np.int64)
        sims = np.einsum("ij,j->i", vectors[before], vectors[r])
        return before[np.argsort(-sims, kind="stable")[:count]]
