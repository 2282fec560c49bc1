"""The lexical half of hybrid search: the BM25 postings index kept with the memories, and
the fusion of lexical and vector scores.

The index (native ``Lexical``, ``rust/lexical.rs``) is derived state like ``clusters.bin``:
it is built from the database's live texts when a store opens, then fed by every add and
update under the store's write lock, after the SQLite transaction committed. So a memory
whose ``add`` returned is found lexically after any crash (the database has it, the next
open indexes it), and nothing has to be reconciled. Deletes, archives and replaced texts
need no call here: the index is append-only by vector row, and every query passes the live
rows in scope, which also scopes the term statistics to one namespace. Why postings in the
core rather than SQLite FTS5, and how the fusion was chosen: BENCHMARKS.md ("Hybrid
retrieval"), ``benches/bench_hybrid.py`` and ``benches/eval_hybrid.py``.
"""

from __future__ import annotations

import numpy as np

from clag_fast import _clag_fast as _native

__all__ = ["LexicalIndex", "Matches", "fuse", "tokenize"]


def tokenize(text: str) -> list[str]:
    """The words the index keeps for ``text``: lower-cased Unicode words, one per character
    in scripts written without spaces, a small English stopword list dropped. Nothing is an
    operator (quotes, ``*``, ``-``, ``AND``, ``NEAR`` are separators or plain words)."""
    return _native.tokenize(text)


class Matches:
    """A query's best BM25 rows (``rows``/``scores``, best first), the scores of the rows it
    was asked to look up (``looked``, 0 = no shared word), and ``terms``: query words found
    in scope (0 = fall back to vectors)."""

    __slots__ = ("rows", "scores", "looked", "terms", "max_possible")

    def __init__(self, rows: np.ndarray, scores: np.ndarray, looked: np.ndarray, terms: int,
                 max_possible: float) -> None:
        self.rows, self.scores, self.looked = rows, scores, looked
        self.terms, self.max_possible = terms, max_possible


class LexicalIndex:
    """The store's BM25 index over vector rows. Adds happen under the store's write lock;
    scoring is thread-safe (the native index has its own lock and releases the GIL)."""

    K1 = 1.2
    B = 0.75

    def __init__(self) -> None:
        self._native = _native.Lexical()
        self._stats: dict[tuple, tuple[int, int]] = {}
        self._stats_version = -1

    def __len__(self) -> int:
        return len(self._native)

    def sizes(self) -> tuple[int, int]:
        """(distinct terms, postings) held."""
        return self._native.sizes()

    def build(self, rows_texts: list[tuple[int, str]], batch: int = 50_000) -> None:
        """Index (vector row, text) pairs; rows ascending (the open-time rebuild)."""
        rows_texts.sort(key=lambda rt: rt[0])
        for i in range(0, len(rows_texts), batch):
            chunk = rows_texts[i:i + batch]
            self._native.add([r for r, _ in chunk], [t for _, t in chunk])

    def add(self, rows: np.ndarray | list[int], texts: list[str]) -> None:
        """Index new memories (rows above every indexed row, as appended vector rows are)."""
        self._native.add([int(r) for r in rows], list(texts))

    def compact(self, live: np.ndarray) -> int:
        """Drop the postings of rows outside ``live``; returns how many went."""
        return self._native.compact(np.ascontiguousarray(live, dtype=bool))

    def score(self, query: str, scope: np.ndarray | None, eligible: np.ndarray | None,
              scope_key: tuple, version: int, top_n: int, lookup: np.ndarray) -> Matches:
        """The ``top_n`` best BM25 rows among ``eligible`` and the scores of ``lookup`` rows,
        with term statistics from the ``scope`` rows (the live rows of the query's namespace;
        None = every indexed row). (documents, tokens) of a scope are cached per
        ``scope_key`` until ``version`` changes (any write)."""
        if version != self._stats_version:
            self._stats.clear()
            self._stats_version = version
        stats = self._stats.get(scope_key)
        if stats is None:
            stats = self._native.stats(scope)
            if len(self._stats) > 64:
                self._stats.clear()
            self._stats[scope_key] = stats
        rows, scores, looked, terms, maxp = self._native.score_top(
            query, scope, eligible, stats[0], stats[1], top_n, np.ascontiguousarray(lookup, np.int64), self.K1, self.B)
        return Matches(rows, scores, looked, terms, maxp)


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
