"""The last step of hybrid text search: candidates ranked by more than their fused score.

The fused lexical + vector score (``store.lexical.fuse``) ranks each memory on its own words.
In a conversation that misses the turn that answers: the query matches the turn that asked
("What's the total for both of us?"), and the answer ("We said around 9,000") shares few of
its words. So, with the store's ``RankingConfig``:

* the best first-stage hits bring their thread neighbours (``store.threads``) into the
  candidates, scored like the others;
* each candidate receives a share of its neighbours' scores, more from a turn before it that
  asks a question, and a candidate that asks a question keeps only part of its own;
* a length prior favours memories with content over acknowledgements;
* a query that names one speaker favours that speaker's memories;
* a memory updated by a newer eligible one (``add(supersedes=...)``) ranks below it.

Chosen on LoCoMo conversations 1-5 and checked on 6-10, the demo conversation and
standard-library docstrings (BENCHMARKS.md, "Retrieval quality").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from clag_fast.config import RankingConfig
from clag_fast.store import threads
from clag_fast.store.lexical import LexicalIndex, fuse
from clag_fast.store.rowtable import RowTable


@dataclass
class Ranked:
    """Candidates (vector rows) with their final scores, how many rows this step scored on top
    of the first stage, and the superseded candidates whose newer memory is eligible too
    (row -> the newer memory's id)."""

    rows: np.ndarray
    scores: np.ndarray
    scored: int = 0
    superseded: dict[int, int] = field(default_factory=dict)


_WORD = re.compile(r"\w+")


class SpeakerNames:
    """The words of each speaker's name, so a query can name a speaker ("What did Caroline
    research?" names "Caroline"). Words match as written, capitals included: a name is
    written with its capitals, while a role spelt in lower case ("what can the user eat?")
    names nobody in particular."""

    def __init__(self) -> None:
        self._words: list[tuple[int, frozenset[str]]] = []
        self._known = 0

    def named(self, rows: RowTable, query: str) -> list[int]:
        """Codes of the speakers all of whose name words appear in ``query``."""
        names = rows.names("speaker")
        if len(names) != self._known:  # codes only grow: rebuild when a speaker was added
            self._words = [(c, frozenset(_WORD.findall(n))) for c, n in names.items()]
            self._known = len(names)
        words = set(_WORD.findall(query))
        return [c for c, name in self._words if name and name <= words]


def rank(cfg: RankingConfig, rows: RowTable, vectors: np.ndarray, lexical: LexicalIndex, q: np.ndarray,
         text: str, namespace: str | None, mask: np.ndarray | None, narrowed: bool, cand: np.ndarray,
         cos: np.ndarray, bm: np.ndarray, weights: np.ndarray | None, weight: float, method: str,
         max_possible: float, successors: dict[int, int], speakers: SpeakerNames) -> Ranked:
    """Final scores of the candidates ``cand`` (vector rows) of one hybrid query, whose cosines
    and BM25 scores (decay-weighted) are ``cos`` and ``bm``; rows may join them (neighbours,
    newer versions). ``mask``: the eligible rows (None: every live row); ``narrowed``: kind,
    time or metadata filters narrow the namespace (the lexical lookups then take the mask);
    ``successors``: memory id -> row of the memories that supersede others."""
    fused = fuse(cos, bm, weight, method, max_possible)
    eligible = rows.live if mask is None else mask
    hops = len(cfg.neighbour_weights)
    succ = successors_in_effect(rows, cand, successors, eligible)
    joining = []
    if cfg.expand and hops:
        top = cand[np.argsort(-fused, kind="stable")[: cfg.expand]]
        joining += threads.neighbours(rows, top, hops)
    if succ:
        joining.append(np.fromiter(succ.values(), np.int64, len(succ)))
    scored = 0
    if joining:
        extra = np.unique(np.concatenate(joining))
        extra = extra[extra >= 0]
        extra = extra[eligible[extra]]
        extra = np.setdiff1d(extra, cand, assume_unique=True)
        if len(extra):
            scored = len(extra)
            e_cos = np.einsum("ij,j->i", vectors[extra], q).astype(np.float32)
            e_bm = lexical.score(text, namespace, mask if narrowed else None, 0, extra).looked.astype(np.float32)
            if weights is not None:
                e_cos *= weights[extra]
                e_bm *= weights[extra]
            cand = np.concatenate([cand, extra])
            fused = fuse(np.concatenate([cos, e_cos]), np.concatenate([bm, e_bm]), weight, method, max_possible)
    scores = _with_context(cfg, rows, cand, fused.astype(np.float64), hops)
    if cfg.speaker_boost:
        named = speakers.named(rows, text)
        if len(named) == 1:
            scores += cfg.speaker_boost * (rows.speaker[cand] == named[0])
    in_effect = {}
    if succ:
        where = _positions(cand)
        for old, new_row in succ.items():
            o, n = where(np.asarray([old, new_row]))
            if o >= 0 and n >= 0:
                scores[n] = max(scores[n], scores[o])
                scores[o] *= cfg.superseded_weight
                in_effect[old] = int(rows.memory_id[new_row])
    return Ranked(cand, scores.astype(np.float32), scored, in_effect)


def _with_context(cfg: RankingConfig, rows: RowTable, cand: np.ndarray, fused: np.ndarray, hops: int) -> np.ndarray:
    """Own score (questions discounted), neighbours' shares and the length prior."""
    asks = rows.asks
    scores = fused * np.where(asks[cand], cfg.question_weight, 1.0)
    if hops:
        where = _positions(cand)
        around = threads.neighbours(rows, cand, hops)
        for d, w in enumerate(cfg.neighbour_weights):
            if not w:
                continue
            for ahead, nb in enumerate(around[2 * d: 2 * d + 2]):
                at = where(nb)
                got = np.where(at >= 0, fused[np.maximum(at, 0)], 0.0)
                if not ahead:  # the turn before: a question passes more to what answers it
                    got *= np.where((nb >= 0) & asks[np.maximum(nb, 0)], cfg.question_boost, 1.0)
                scores += w * got
    if cfg.length_prior:
        scores += cfg.length_prior * np.log1p(np.minimum(rows.words[cand], cfg.length_cap))
    return scores


def successors_in_effect(rows: RowTable, cand: np.ndarray, successors: dict[int, int],
                         eligible: np.ndarray) -> dict[int, int]:
    """Candidate row -> the row of the newer memory that supersedes it, where that memory is
    live, still holds its row and is eligible (as of the search's time filter too)."""
    if not successors:
        return {}
    ids = rows.superseded_by[cand]
    out = {}
    for row, mid in zip(cand[ids >= 0].tolist(), ids[ids >= 0].tolist()):
        new_row = successors.get(mid)
        if new_row is not None and rows.memory_id[new_row] == mid and eligible[new_row]:
            out[row] = new_row
    return out


def _positions(cand: np.ndarray):
    """A function mapping rows to their positions in ``cand`` (-1: not a candidate)."""
    order = np.argsort(cand, kind="stable")
    ranked = cand[order]

    def where(rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        pos = np.minimum(np.searchsorted(ranked, rows), len(ranked) - 1)
        found = (ranked[pos] == rows) & (rows >= 0)
        return np.where(found, order[pos], -1)

    return where
