"""Retrieval and QA metrics for the evaluation (``clag-fast eval``).

Retrieval metrics use binary relevance over evidence ids (LoCoMo ``dia_id`` strings): a
retrieved item is relevant when its id is in the question's evidence set. Each relevant id is
counted once even if it is retrieved twice, so recall never exceeds 1.

QA metrics follow the evaluation code the CLAG paper builds on (A-MEM's ``utils.py``, itself
built on LoCoMo's ``task_eval/evaluation.py``):

* answers are normalised as LoCoMo/SQuAD do (lower-case, drop punctuation, drop the articles
  a/an/the, split on whitespace);
* token F1 is computed over token *multisets* (``Counter`` intersection), as LoCoMo's
  ``f1_score`` does. LoCoMo additionally Porter-stems tokens; we do not, to avoid an nltk
  dependency, so plural/tense variants count as different tokens (a slightly stricter F1);
* BLEU-1 is nltk's ``sentence_bleu(weights=(1, 0, 0, 0),
  smoothing_function=SmoothingFunction().method1)`` reimplemented without nltk: clipped
  unigram precision times the brevity penalty. Smoothing ``method1`` only replaces zero
  higher-order precisions, which carry weight 0 for BLEU-1, and nltk returns 0 outright when
  no unigram matches, so the smoothing never changes a BLEU-1 value; it is named here so the
  numbers can be compared with papers that report "BLEU-1 with smoothing".
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Hashable

__all__ = [
    "answer_containment",
    "normalize_answer",
    "answer_tokens",
    "token_f1",
    "bleu1",
    "recall_at_k",
    "precision_at_k",
    "ndcg_at_k",
    "percentile",
]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)


def normalize_answer(text: object) -> str:
    """Normalise an answer the LoCoMo/SQuAD way: lower-case, no punctuation, no articles.

    Non-string answers (LoCoMo has integer answers such as years) are converted with ``str``.
    Whitespace is collapsed to single spaces.
    """
    s = str(text).lower()
    # Punctuation is removed before articles so that "the," still loses "the".
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def answer_tokens(text: object) -> list[str]:
    """Tokens of :func:`normalize_answer` (whitespace split)."""
    return normalize_answer(text).split()


#: Words an answer shares with almost any context: left out of ``answer_containment``.
_FUNCTION_WORDS = frozenset(
    "and or but of in on at to for from by with as is are was were be been it its this that "
    "these those he she they them his her their we our you your i my me not no yes do did does "
    "so than then there here about into over after before".split())


def answer_containment(gold: object, context: str) -> float | None:
    """The share of the gold answer's distinct content words (normalised as for F1, function
    words left out) found among the context's words: how much of the answer the retrieved
    memories put in front of the model, whatever the model then makes of it. None when the
    answer has no content word."""
    want = {t for t in answer_tokens(gold) if t not in _FUNCTION_WORDS}
    if not want:
        return None
    have = set(answer_tokens(context))
    return len(want & have) / len(want)


def token_f1(prediction: object, reference: object) -> float:
    """Token-level F1 over multisets of normalised tokens, in [0, 1].

    0.0 when either side has no tokens after normalisation or nothing overlaps.
    """
    pred = answer_tokens(prediction)
    ref = answer_tokens(reference)
    if not pred or not ref:
        return 0.0
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision = same / len(pred)
    recall = same / len(ref)
    return 2.0 * precision * recall / (precision + recall)


def bleu1(prediction: object, reference: object) -> float:
    """Sentence BLEU-1 of ``prediction`` against one ``reference``, in [0, 1].

    Equals nltk ``sentence_bleu([ref], pred, weights=(1, 0, 0, 0),
    smoothing_function=SmoothingFunction().method1)`` on the normalised tokens:
    ``BP * clipped_unigram_matches / len(pred)`` with ``BP = 1`` if the prediction is longer
    than the reference, else ``exp(1 - len(ref) / len(pred))``.
    """
    pred = answer_tokens(prediction)
    ref = answer_tokens(reference)
    if not pred or not ref:
        return 0.0
    matches = sum((Counter(pred) & Counter(ref)).values())
    if matches == 0:
        return 0.0
    c, r = len(pred), len(ref)
    bp = 1.0 if c > r else math.exp(1.0 - r / c)
    return bp * matches / c


def _relevant_hits(retrieved: Sequence[Hashable], relevant: Collection[Hashable], k: int) -> list[bool]:
    """Relevance flags of the first ``k`` retrieved ids; a relevant id counts only once."""
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    seen: set[Hashable] = set()
    flags = []
    for item in list(retrieved)[:k]:
        hit = item in relevant and item not in seen
        if hit:
            seen.add(item)
        flags.append(hit)
    return flags


def recall_at_k(retrieved: Sequence[Hashable], relevant: Collection[Hashable], k: int) -> float:
    """Fraction of the relevant ids found in the first ``k`` retrieved ids.

    Raises ValueError when ``relevant`` is empty (recall is undefined; the caller should skip
    such questions rather than count them as 0 or 1).
    """
    rel = set(relevant)
    if not rel:
        raise ValueError("recall is undefined for a question without relevant ids")
    return sum(_relevant_hits(retrieved, rel, k)) / len(rel)


def precision_at_k(retrieved: Sequence[Hashable], relevant: Collection[Hashable], k: int) -> float:
    """Relevant ids among the first ``k`` retrieved, divided by ``k``.

    The denominator is ``k`` even when fewer than ``k`` items were retrieved (the usual IR
    convention: missing slots count as non-relevant).
    """
    return sum(_relevant_hits(retrieved, set(relevant), k)) / k


def ndcg_at_k(retrieved: Sequence[Hashable], relevant: Collection[Hashable], k: int) -> float:
    """Binary-relevance nDCG@k: DCG = sum 1/log2(rank+1) over relevant ranks (1-based).

    The ideal DCG puts ``min(len(relevant), k)`` relevant items first. Raises ValueError when
    ``relevant`` is empty.
    """
    rel = set(relevant)
    if not rel:
        raise ValueError("nDCG is undefined for a question without relevant ids")
    flags = _relevant_hits(retrieved, rel, k)
    dcg = sum(1.0 / math.log2(i + 2) for i, hit in enumerate(flags) if hit)
    idcg = sum(1.0 / math.log2(i + 2) for i in range(min(len(rel), k)))
    return dcg / idcg


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation (numpy's default).

    Returns NaN for an empty sequence so that reports show a missing value, not a fake 0.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(float(v) for v in values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
