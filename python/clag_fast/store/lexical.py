"""The lexical half of hybrid search: the BM25 postings index kept with the memories, and
the fusion of lexical and vector scores.

The index (native ``Lexical``, ``rust/lexical/``) is derived state like ``clusters.bin``:
fed by every add and update under the store's write lock after the SQLite transaction
committed, saved as ``index/lexical.bin`` at flush and close, and on open loaded and brought
up to date from the database (``store/recovery.open_lexical``: the rows after the file's
watermark are indexed, rows that died since leave the statistics; a missing or damaged file
is rebuilt). So a memory whose ``add`` returned is found lexically after any crash.

Deletes, archives and replaced texts only kill rows in the row table; ``sync`` takes the dead
rows out of the term statistics, which are kept per namespace in the core, so a query neither
scans postings nor counts rows to get them. Why postings in the core rather than SQLite FTS5,
and how the fusion was chosen: BENCHMARKS.md ("Hybrid retrieval"), ``benches/bench_hybrid.py``
and ``benches/eval_hybrid.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clag_fast import _clag_fast as _native

__all__ = ["LexicalIndex", "Matches", "fuse", "tokenize"]


def tokenize(text: str) -> list[str]:
    """The words the index keeps for ``text``: lower-cased Unicode words, one per character
    in scripts written without spaces, a small English stopword list dropped, ASCII words
    lightly stemmed (plural, -ing, -ed, final e: "hikes", "hiking", "hiked" are one term;
    measured better on LoCoMo and on the docstrings set, BENCHMARKS.md). Nothing is an
    operator (quotes, ``*``, ``-``, ``AND``, ``NEAR`` are separators or plain words)."""
    return _native.tokenize(text)


class Matches:
    """A query's best BM25 rows (``rows``/``scores``, best first), the scores of the rows it
    was asked to look up (``looked``, 0 = no shared word), ``terms``: query words found in
    scope (0 = fall back to vectors), and ``scored``: rows whose score was computed."""

    __slots__ = ("rows", "scores", "looked", "terms", "max_possible", "scored")

    def __init__(self, rows: np.ndarray, scores: np.ndarray, looked: np.ndarray, terms: int,
                 max_possible: float, scored: int = 0) -> None:
        self.rows, self.scores, self.looked = rows, scores, looked
        self.terms, self.max_possible, self.scored = terms, max_possible, scored


class LexicalIndex:
    """The store's BM25 index over vector rows. Adds, ``sync`` and ``save`` happen under the
    store's write lock (``sync`` also from searches under the read lock: it is idempotent);
    scoring is thread-safe (the native index has its own lock and releases the GIL)."""

    K1 = 1.2
    B = 0.75

    def __init__(self, native: _native.Lexical | None = None) -> None:
        self._native = native if native is not None else _native.Lexical()
        self._synced = -1  # the row-table version the statistics match
        # the native change counter at the last save or load (-1: never saved)
        self._saved = -1 if native is None else native.changes()

    @classmethod
    def load(cls, path: Path) -> "LexicalIndex":
        """The index saved at ``path`` (OSError when missing, damaged or foreign)."""
        return cls(_native.Lexical.load(str(path)))

    def save(self, path: Path) -> bool:
        """Write the index atomically to ``path`` if it changed since the last save or load;
        returns whether it wrote."""
        changes = self._native.changes()
        if changes == self._saved and path.exists():
            return False
        self._native.save(str(path))
        self._saved = changes
        return True

    def __len__(self) -> int:
        """Rows covered: one past the highest row indexed (a saved file's watermark)."""
        return len(self._native)

    def sizes(self) -> tuple[int, int]:
        """(distinct terms, postings) held."""
        return self._native.sizes()

    def add(self, rows: np.ndarray | list[int], texts: list[str], namespaces: list[str]) -> None:
        """Index new memories (rows above every indexed row, as appended vector rows are), one
        namespace per text or one for all. They count in the statistics at once."""
        self._native.add([int(r) for r in rows], list(texts), list(namespaces))

    def build(self, rows: np.ndarray, texts: list[str], namespaces: list[str], batch: int = 50_000) -> None:
        """Index (row, text, namespace) triples, rows above every indexed row, in any order
        (an open-time rebuild or catch-up)."""
        rows = np.asarray(rows, np.int64)
        if len(rows) > 1 and not bool(np.all(rows[1:] > rows[:-1])):
            order = np.argsort(rows, kind="stable")
            rows = rows[order]
            texts = [texts[j] for j in order.tolist()]
            namespaces = [namespaces[j] for j in order.tolist()]
        for i in range(0, len(rows), batch):
            self._native.add(rows[i:i + batch].tolist(), texts[i:i + batch], namespaces[i:i + batch])

    def sync(self, live: np.ndarray, version: int | None = None) -> tuple[int, int, int]:
        """Count exactly the rows set in ``live`` (the row table's live column at ``version``);
        a no-op when already synced at that version (None: always sync, record nothing).
        Returns (died, revived, missing: live rows below ``len(self)`` holding no document)."""
        if version is not None and version == self._synced:
            return (0, 0, 0)
        out = self._native.sync(np.ascontiguousarray(live, dtype=bool))
        if version is not None:
            self._synced = version
        return out

    def mark_synced(self, before: int, after: int) -> None:
        """A write that only added rows moved the row table from ``before`` to ``after``:
        still in sync if it was before."""
        if self._synced == before:
            self._synced = after

    def compact(self, live: np.ndarray) -> int:
        """Drop the postings of rows outside ``live``; returns how many went."""
        return self._native.compact(np.ascontiguousarray(live, dtype=bool))

    def score(self, query: str, namespace: str | None, eligible: np.ndarray | None, top_n: int,
              lookup: np.ndarray) -> Matches:
        """The ``top_n`` best BM25 rows and the scores of ``lookup`` rows, with term statistics
        from ``namespace``'s live memories (None = every namespace). ``eligible``: the rows
        the caller's other filters allow (inside the namespace), None = all of the scope."""
        rows, scores, looked, terms, maxp, scored = self._native.score_top(
            query, namespace, eligible, top_n, np.ascontiguousarray(lookup, np.int64), self.K1, self.B)
        return Matches(rows, scores, looked, terms, maxp, scored)


def _minmax(x: np.ndarray) -> np.ndarray:
    lo, hi = float(x.min()), float(x.max())
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


def _z(x: np.ndarray) -> np.ndarray:
    sd = float(x.std())
    return (x - float(x.mean())) / sd if sd > 0 else np.zeros_like(x)


def fuse(cos: np.ndarray, bm25: np.ndarray, weight: float, method: str = "minmax",
         max_possible: float = 1.0) -> np.ndarray:
    """One score per candidate from its cosine and its BM25 (0 = no shared word).

    Normalisations are taken over the candidate set (the vector top hits plus the lexical top
    hits), which flat and two-stage search both have, so both rank alike:
      minmax:  (1 - w) minmax(cos) + w minmax(bm25)
      zscore:  (1 - w) z(cos) + w z(bm25)
      bound:   (1 - w) cos + w bm25 / max_possible (no dependence on the candidate set)
      rrf:     (1 - w) / (60 + vector rank) + w / (60 + lexical rank)
    """
    cos = np.asarray(cos, np.float32)
    bm25 = np.asarray(bm25, np.float32)
    if method == "minmax":
        return (1 - weight) * _minmax(cos) + weight * _minmax(bm25)
    if method == "zscore":
        return (1 - weight) * _z(cos) + weight * _z(bm25)
    if method == "bound":
        return (1 - weight) * cos + weight * bm25 / max(max_possible, 1e-9)
    if method == "rrf":
        rv = np.empty(len(cos)); rv[np.argsort(-cos, kind="stable")] = np.arange(len(cos))
        rl = np.empty(len(bm25)); rl[np.argsort(-bm25, kind="stable")] = np.arange(len(bm25))
        rl[bm25 <= 0] = np.inf
        return ((1 - weight) / (60 + rv) + weight / (60 + rl)).astype(np.float32)
    raise ValueError(f"unknown fusion method {method!r}")
