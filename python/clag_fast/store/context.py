"""The last step of hybrid text search: candidates ranked by more than their fused score.

The fused lexical + vector score (``store.lexical.fuse``) ranks each memory on its own words.
In a conversation that misses the turn that answers: the query matches the turn that asked
("What's the total for both of us?"), and the answer ("We said around 9,000") shares few of
its words. So, with the store's ``RankingConfig``:

* the best first-stage hits bring their thread neighbours (``store.threads``) into the
  candidates, scored like the others;
* each candidate receives a share of its neighbours' scores, more from a turn before it that
  asks a question, and a candidate that asks a question keeps only part of its own;
* a length prior favours memories with content over acknowledgements, and a novelty bonus the
  turns that say something new over those that repeat the turns just before them;
* a query that names one speaker favours that speaker's memories;
* a question that asks for a date, a number or a name favours the best candidates that hold
  one (``store.answer_kind``);
* a memory updated by a newer eligible one (``add(supersedes=...)``) ranks below it;
* a reflection among the best candidates passes a share of its score to the turns it restates
  (``store.reflections``), which join the candidates.

Chosen on LoCoMo conversations 1-5 and checked on 6-10, the demo conversation and
standard-library docstrings (BENCHMARKS.md, "Retrieval quality").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from clag_fast import _clag_fast as _native
from clag_fast.config import RankingConfig
from clag_fast.store import answer_kind, reflections, threads
from clag_fast.store.lexical import LexicalIndex, fuse
from clag_fast.store.rowtable import RowTable


@dataclass(frozen=True)
class Query:
    """One hybrid query as its candidates were scored: the query vector and text, the
    namespace its term statistics come from, the eligible rows (``mask``; None: every live
    row), whether kind, time or metadata filters narrow the namespace (``narrowed``: lexical
    lookups then take the mask), the decay weights (None: no decay) and the fusion (``weight``,
    ``method``, BM25's ``max_possible``)."""

    vector: np.ndarray
    text: str
    namespace: str | None
    mask: np.ndarray | None
    narrowed: bool
    weights: np.ndarray | None
    weight: float
    method: str
    max_possible: float


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
#: The candidates, best first, that the novelty bonus is computed for.
NOVELTY_POOL = 30


class SpeakerNames:
    """The words of each speaker's name, so a query can name a speaker ("What did Caroline
    research?" names "Caroline"). Words match as written, capitals included: a name is
    written with its capitals, while a role spelt in lower case ("what can the user eat?")
    names nobody in particular."""

    def __init__(self) -> None:
        self._words: list[tuple[int, frozenset[str]]] = []
        self._all: frozenset[str] = frozenset()
        self._known = 0

    def _refresh(self, rows: RowTable) -> None:
        if rows.name_count("speaker") != self._known:  # codes only grow: rebuild when a speaker was added
            names = rows.names("speaker")
            self._words = [(c, frozenset(_WORD.findall(n))) for c, n in names.items()]
            self._all = frozenset().union(*(w for _, w in self._words))
            self._known = len(names)

    def named(self, rows: RowTable, query: str) -> list[int]:
        """Codes of the speakers all of whose name words appear in ``query``."""
        self._refresh(rows)
        words = set(_WORD.findall(query))
        return [c for c, name in self._words if name and name <= words]

    def words(self, rows: RowTable) -> frozenset[str]:
        """Every word of every speaker's name."""
        self._refresh(rows)
        return self._all


Texts = Callable[[Sequence[int]], dict[int, str]]


def rank(cfg: RankingConfig, rows: RowTable, vectors: np.ndarray, lexical: LexicalIndex, query: Query,
         cand: np.ndarray, cos: np.ndarray, bm: np.ndarray, speakers: SpeakerNames, texts: Texts,
         sources: reflections.Sources) -> Ranked:
    """Final scores of the candidates ``cand`` (vector rows) of one hybrid ``query``, whose
    cosines and BM25 scores (decay-weighted) are ``cos`` and ``bm``; rows may join them
    (neighbours, newer versions, the turns reflections restate). ``texts``: memory id -> text,
    for the rows whose answer kinds are not known yet; ``sources``: the searcher's cache of
    reflections' sources."""
    fused = _fuse(query, cos, bm)
    eligible = rows.live if query.mask is None else query.mask
    hops = len(cfg.neighbour_weights)
    succ = successors_in_effect(rows, cand, rows.successor_rows, eligible)
    joining: set[int] = set(succ.values())
    reflected = (rows.code("kind", cfg.reflection_kind, create=False)
                 if cfg.reflection_share and cfg.reflection_pool else -2)
    by_fused = np.argsort(-fused, kind="stable") if (cfg.expand and hops) or reflected >= 0 else None
    if cfg.expand and hops:
        for near in threads.neighbours(rows, cand[by_fused[: cfg.expand]], hops):
            joining.update(near.tolist())
    if reflected >= 0:
        top = cand[by_fused[: cfg.reflection_pool]]
        refl = top[rows.kind[top] == reflected]
        if len(refl):
            found = sources.of(rows, vectors, refl, reflected, cfg.reflection_window, cfg.reflection_sources, eligible)
            joining.update(r for got in found for r in got.tolist())
    scored = 0
    # A few dozen rows: Python sets beat numpy's set operations at this size.
    extra = sorted(r for r in joining - set(cand.tolist()) if r >= 0 and eligible[r])
    if extra:
        extra = np.asarray(extra, np.int64)
        scored = len(extra)
        e_cos = np.einsum("ij,j->i", vectors[extra], query.vector).astype(np.float32)
        e_bm = lexical.score(query.text, query.namespace, query.mask if query.narrowed else None, 0,
                             extra).looked.astype(np.float32)
        if query.weights is not None:
            e_cos *= query.weights[extra]
            e_bm *= query.weights[extra]
        cand = np.concatenate([cand, extra])
        fused = _fuse(query, np.concatenate([cos, e_cos]), np.concatenate([bm, e_bm]))
    named = speakers.named(rows, query.text) if cfg.speaker_boost else []
    n = rows.n
    scores = _native.context_scores(
        cand, np.ascontiguousarray(fused, np.float32), rows.prev[:n], rows.next[:n], rows.asks[:n], rows.words[:n],
        rows.speaker[:n], list(cfg.neighbour_weights), cfg.question_boost, cfg.question_weight, cfg.length_prior,
        cfg.length_cap, cfg.speaker_boost, named[0] if len(named) == 1 else -1)
    if cfg.novelty_bonus and cfg.novelty_turns:
        # Only the best candidates: gathering the vectors of every candidate and of the turns
        # before them made a hybrid search at 100k memories 1.26x slower (BENCHMARKS.md,
        # "Retrieval quality"), and a bonus of 0.2 rarely lifts one from further down.
        best = np.argsort(-scores, kind="stable")[:NOVELTY_POOL]
        scores[best] += cfg.novelty_bonus * novelty(rows, vectors, cand[best], cfg.novelty_turns)
    if reflected >= 0:
        _lift_sources(cfg, rows, vectors, cand, scores, reflected, sources, eligible)
    _boost_answers(cfg, rows, query.text, cand, scores, texts, speakers)
    in_effect = {}
    if succ:
        pos = {r: i for i, r in enumerate(cand.tolist())}
        for old, new_row in succ.items():
            o, new = pos.get(old), pos.get(new_row)
            if o is not None and new is not None:
                scores[new] = max(scores[new], scores[o])
                scores[o] *= cfg.superseded_weight
                in_effect[old] = int(rows.memory_id[new_row])
    return Ranked(cand, scores, scored, in_effect)


def novelty(rows: RowTable, vectors: np.ndarray, cand: np.ndarray, turns: int) -> np.ndarray:
    """Per row of ``cand``: 1 - its highest cosine with the ``turns`` turns before it in its
    thread (1 for a first turn, or one unlike those before it)."""
    back = threads.before(rows, cand, turns)
    has = back >= 0
    # One gather and one product for every turn back (a loop per turn cost twice as much).
    sims = np.einsum("ij,tij->ti", vectors[cand], vectors[np.where(has, back, 0)])
    return 1.0 - np.maximum(np.where(has, sims, 0.0), 0.0).max(axis=0)


def _lift_sources(cfg: RankingConfig, rows: RowTable, vectors: np.ndarray, cand: np.ndarray, scores: np.ndarray,
                  kind: int, sources: reflections.Sources, eligible: np.ndarray) -> None:
    """Each reflection among the best ``reflection_pool`` candidates by their scores so far
    passes ``reflection_share`` of its score to those of its sources that are candidates (the
    sources of the best reflections by fused score joined them); a source restated by several
    takes the largest share."""
    top = np.argsort(-scores, kind="stable")[: cfg.reflection_pool]
    refl = top[rows.kind[cand[top]] == kind]
    if not len(refl):
        return
    pos = {r: i for i, r in enumerate(cand.tolist())}
    add = np.zeros(len(scores), np.float32)
    found = sources.of(rows, vectors, cand[refl], kind, cfg.reflection_window, cfg.reflection_sources, eligible)
    for i, got in zip(refl.tolist(), found):
        share = cfg.reflection_share * float(scores[i])
        for r in got.tolist():
            p = pos.get(r)
            if p is not None and share > add[p]:
                add[p] = share
    scores += add


def _boost_answers(cfg: RankingConfig, rows: RowTable, query: str, cand: np.ndarray, scores: np.ndarray,
                   texts: Texts, speakers: SpeakerNames) -> None:
    """Add the date (number, name) boost to the best ``answer_pool`` candidates whose text
    holds a date (number, name), when the query asks for one. Only the best few: a boost far
    down the list changes no top hit, and each row's text is read once, when a search first
    needs it."""
    kind = answer_kind.asked(query)
    boost = {answer_kind.DATE: cfg.date_boost, answer_kind.NUMBER: cfg.number_boost,
             answer_kind.NAME: cfg.name_boost}.get(kind, 0.0)
    if not boost or not cfg.answer_pool:
        return
    top = np.argsort(-scores, kind="stable")[: cfg.answer_pool]
    learn_holds(rows, cand[top], texts, speakers)
    scores[top[(rows.holds[cand[top]] & kind) != 0]] += boost


def learn_holds(rows: RowTable, which: np.ndarray, texts: Texts, speakers: SpeakerNames) -> None:
    """Fill ``rows.holds`` for the rows of ``which`` not read yet. The speakers known now do
    not count as names; one added later may, in the rows read before it."""
    unknown = which[rows.holds[which] < 0]
    if len(unknown) == 0:
        return
    mids = rows.memory_id[unknown]
    got = texts([int(m) for m in mids if m >= 0])
    names = speakers.words(rows)
    for row, mid in zip(unknown.tolist(), mids.tolist()):
        text = got.get(int(mid))
        if text is not None and rows.memory_id[row] == mid:
            rows.holds[row] = answer_kind.holds(text, names)


def _fuse(query: Query, cos: np.ndarray, bm: np.ndarray) -> np.ndarray:
    return fuse(cos, bm, query.weight, query.method, query.max_possible)


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
