"""Vector profiles: a cluster described without an SLM (its distinctive keyphrases as the
label, the next ones as tags; ``labels.keyphrases``), and the word lists the SLM's tags are
cleaned with.

Placement labels a new cluster with ``vector_profile``; the organiser cleans the tags SLM
evolution gives a memory with ``TAG_WORD_RE``, ``STOPWORDS`` and ``BAD_TAGS``.
"""

from __future__ import annotations

import re

from clag_fast.labels.keyphrases import texts_label

TAG_WORD_RE = re.compile(r"[a-z][a-z0-9'-]*")
# Words a small model offers as "tags" that describe the prompt rather than the notes.
BAD_TAGS = frozenset(
    "note notes tag tags topic topics group groups summary word words one two three single "
    "lowercase different json text data sentence subtitle keyword keywords shared".split()
)
STOPWORDS = frozenset(
    "a about after again all also am an and any are as at be because been before being but by "
    "can could did do does doing don't for from had has have having he her here hers him his how "
    "i i'm i've if in into is it it's its just me more most my no not now of off on once only or "
    "other our out over own same she should so some such than that that's the their them then "
    "there these they this those through to too under until up very was we we're were what when "
    "where which while who why will with would you you're your yours yeah oh really so yes "
    "thanks thank going get got like know think much many lot well great good".split()
)


def vector_profile(texts: list[str]) -> tuple[str, list[str]]:
    """A profile without an SLM or namespace statistics: the phrases the texts share (or, for
    one text, its own phrases) as the label, never a copy of a member; ("", []) for none.
    Clusters with namespace statistics get ``store.cluster_phrases`` instead."""
    if not texts:
        return "", []
    return texts_label(texts)
