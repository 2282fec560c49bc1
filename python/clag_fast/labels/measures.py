"""How readable and faithful cluster labels are: copy rate, groundedness, self@1 and the share
of generic labels.

Four measures over the clusters with two or more members:

* **copy**: the summary is a member's text: it shares a run of ``COPY_RUN`` (8) consecutive
  words with one member. Rate = copies / clusters. Keyphrase labels hold at most six words,
  so they are never copies by construction; the measure is for SLM or other summaries.
* **grounded**: the share of the label's content words (summary and tags, words as
  ``labels.keyphrases.content_words`` splits them) that occur in the cluster's members; the
  mean over clusters.
* **self@1**: the summary, embedded, is nearer to its own cluster's centre than to any other
  centre. Rate over clusters.
* **generic**: the summary names no topic (``is_generic``): every content word of it is among
  the 1,000 most frequent English words (``wordfreq``) or cannot be a noun (a function, chat or
  time word, an adverb in -ly, a participle in -ed: ``labels.wordclass``), and a phrase of it
  that opens a clause ("No worries", "Ready to") counts for nothing. "bring · tonight",
  "Perfect · card", "morning" are generic; "vegetarian kaiseki", "JPY · journeys" are not.
  Rate over clusters. The measure reads the label alone, whatever chose it (keyphrases, an
  SLM, a topic, a template).

Clusters with a neutral label ("misc: short replies", members sharing no content word; "misc:
small talk", members holding no topic phrase) make no claim about their members: they are
counted (``neutral``) and left out of grounded, self@1 and generic. Clusters without any
summary count as not grounded, not self@1 and generic.

``measure`` is pure (texts, labels, centres and an embedding function in; numbers out), so the
same code scores a store (``MemoryStore.label_quality``) and hand-built clusters in tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from clag_fast.labels import wordclass
from clag_fast.labels.keyphrases import NEUTRAL_LABELS, content_words

__all__ = ["ClusterLabel", "measure", "self_misses", "is_copy", "groundedness", "is_generic", "COPY_RUN"]

COPY_RUN = 8
_WORD_RE = re.compile(r"\w+")


@dataclass
class ClusterLabel:
    """One cluster as the measures see it: its label and its members' texts."""

    id: int
    summary: str
    tags: list[str]
    members: list[str]


def _words(text: str) -> list[str]:
    return _WORD_RE.findall(str(text).casefold())


def _longest_run(a: list[str], b: list[str]) -> int:
    best = 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b):
            if x == y:
                cur[j + 1] = prev[j] + 1
                if cur[j + 1] > best:
                    best = cur[j + 1]
        prev = cur
    return best


def is_copy(summary: str, members: Sequence[str], run: int = COPY_RUN) -> bool:
    """True when ``summary`` shares ``run`` consecutive words with one of ``members`` (so a
    label equal to a member shorter than ``run`` words is not a copy)."""
    words = _words(summary)
    if len(words) < run:
        return False
    return any(_longest_run(words, _words(m)) >= run for m in members)


def groundedness(summary: str, tags: Sequence[str], members: Sequence[str]) -> float:
    """Share of the label's content words found among the members' content words (1.0 for
    a label without content words: it claims nothing)."""
    label_words = content_words(" ".join([summary, *tags]))
    if not label_words:
        return 1.0
    have: set[str] = set()
    for m in members:
        have.update(content_words(m))
    return sum(w in have for w in label_words) / len(label_words)


# Words that open a reply rather than name something ("Thanks so much", "Yes please").
_OPENERS = frozenset("yes yeah yep no nope ok okay oh hey hi hello thanks thank sure sorry please wow".split())


def is_generic(summary: str, common: int = wordclass.COMMON_WORDS) -> bool:
    """True when ``summary`` names no topic: none of its " · "-separated phrases holds a
    specific word (``wordclass.specific_word``: a code of letters and digits, or a word that
    may be a noun and is not among the ``common`` most frequent English words), a phrase that
    starts with a function or chat word ("No worries", "Thanks so much") counting for nothing.
    An empty summary is generic; a neutral label is not (it claims no topic)."""
    if _neutral(summary):
        return False
    for phrase in str(summary).split(" · "):
        words = phrase.split()
        if not words:
            continue
        if wordclass.function_word(words[0]) or words[0].casefold() in _OPENERS:
            continue
        if any(wordclass.specific_word(w, common) for w in content_words(phrase)):
            return False
    return True


def _neutral(summary: str) -> bool:
    return summary in NEUTRAL_LABELS


def measure(clusters: Sequence[ClusterLabel], centres: np.ndarray,
            embed: Callable[[list[str]], np.ndarray] | None) -> dict:
    """Copy rate, groundedness, self@1 and the generic labels (count ``generic``, share of the
    clusters ``generic_rate``) over ``clusters`` with two or more members.

    ``centres[i]`` is the (unit) centre of ``clusters[i]``, and self@1 compares against all
    of them; ``embed`` (texts -> unit vectors) None leaves self@1 out.
    """
    centres = np.asarray(centres, np.float32)
    if len(centres) != len(clusters):
        raise ValueError(f"{len(clusters)} clusters but {len(centres)} centres")
    scored = [i for i, c in enumerate(clusters) if len(c.members) >= 2]
    claims = [i for i in scored if not _neutral(clusters[i].summary)]
    copies = sum(is_copy(clusters[i].summary, clusters[i].members) for i in scored)
    grounded = [groundedness(clusters[i].summary, clusters[i].tags, clusters[i].members)
                if clusters[i].summary else 0.0 for i in claims]
    out = {
        "clusters": len(scored),
        "neutral": len(scored) - len(claims),
        "copies": copies,
        "copy_rate": copies / len(scored) if scored else 0.0,
        "grounded": float(np.mean(grounded)) if grounded else 1.0,
    }
    generic = sum(is_generic(clusters[i].summary) for i in claims)
    out["generic"] = generic
    out["generic_rate"] = generic / len(scored) if scored else 0.0
    if embed is not None and claims and len(centres):
        labelled = [i for i in claims if clusters[i].summary]
        hits = 0
        try:
            vecs = np.asarray(embed([clusters[i].summary for i in labelled]), np.float32) if labelled else None
        except Exception:  # noqa: BLE001 - an embedder that only knows its own texts: no self@1
            return out
        if vecs is not None:
            nearest = np.argmax(vecs @ centres.T, axis=1)
            hits = int(sum(int(n) == i for n, i in zip(nearest.tolist(), labelled)))
        out["self_at_1"] = hits / len(claims)
    return out


def self_misses(summaries: Sequence[str], centres: np.ndarray,
                embed: Callable[[list[str]], np.ndarray]) -> list[tuple[int, int, float]]:
    """The labels that fail self@1: ``(i, j, margin)`` for each ``summaries[i]`` whose
    embedding is nearest centre ``j``, not its own ``centres[i]``, ``margin`` (<= 0) the
    cosine to its own centre minus that to ``j``; worst first. Empty and neutral summaries are
    skipped. For reading which clusters' labels point elsewhere (``benches/eval_labels.py
    --misses``)."""
    centres = np.asarray(centres, np.float32)
    if len(centres) != len(summaries):
        raise ValueError(f"{len(summaries)} summaries but {len(centres)} centres")
    todo = [i for i, s in enumerate(summaries) if s and not _neutral(s)]
    if not todo or len(centres) < 2:
        return []
    sims = np.asarray(embed([summaries[i] for i in todo]), np.float32) @ centres.T
    out = []
    for row, i in zip(sims, todo):
        j = int(np.argmax(row))  # as ``measure`` decides: ties go to the first centre
        if j != i:
            out.append((i, j, float(row[i] - row[j])))
    return sorted(out, key=lambda x: x[2])
