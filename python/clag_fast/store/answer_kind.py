"""What kind of answer a question asks for, and whether a memory's text can hold one.

"When does the user leave?" wants a date, "What is the total budget?" a number, "Which hotel
...?" a name; the turn that answers ("Could we leave April 10 instead?", "We agreed to bump the
total to 10,500", "Booked: Kamogawa Residence Sanjo") holds one, while the turns that only talk
about the subject often do not. Hybrid search adds ``RankingConfig.date_boost`` /
``number_boost`` / ``name_boost`` to its best candidates that hold what the query asks for
(``store.context``; BENCHMARKS.md, "Retrieval quality").

A text's kinds are read off its words: cheap, but not free at ingest rates of vectors brought
by the user, so the row table learns them when a search first needs them (``RowTable.holds``).
"""

from __future__ import annotations

import re

DATE, NUMBER, NAME = 1, 2, 4

_DATE_WORDS = frozenset("""
january february march april may june july august september october november december
jan feb mar apr jun jul aug sep sept oct nov dec
monday tuesday wednesday thursday friday saturday sunday weekend
yesterday today tomorrow tonight ago week month year morning evening afternoon
""".split())
_NUMBER_WORDS = frozenset("one two three four five six seven eight nine ten twelve hundred thousand dozen half".split())
_WORD = re.compile(r"[^\W\d_]+")
_DIGIT = re.compile(r"\d")

# One pattern, its alternatives tried in order at the start: a date before a number ("how long
# ago" is a date, "how long" a number) before a name ("which day" is a date). A query that asks
# for none costs one match, not three.
_ASKS = re.compile(r"^\s*(?:(?P<date>when\b|what (?:date|time|day|year|month)\b|which (?:date|day|year|month)\b"
                   r"|how long ago\b)"
                   r"|(?P<number>how (?:much|many|long|old|far|often)\b"
                   r"|what (?:is|was) the (?:total|price|cost|budget|number)\b)"
                   r"|(?P<name>(?:which|who|whom|whose|where|what (?:kind|type|sort) of|what is the name)\b))", re.I)
_KINDS = {"date": DATE, "number": NUMBER, "name": NAME}
# A capitalised word that starts neither the text nor a sentence, nor follows a label
# ("Caroline: Hey ..."): there a capital says little; elsewhere it marks a name.
_CAPITALISED = re.compile(r"(?<![.!?:]\s)(?<!^)\b[A-Z][\w'’]*")


def asked(query: str) -> int:
    """``DATE``, ``NUMBER`` or ``NAME`` when the question asks for one, else 0."""
    m = _ASKS.match(query)
    return _KINDS[m.lastgroup] if m is not None else 0


def _named(words: set[str], vocabulary: frozenset[str]) -> bool:
    """Whether a word, or its plural ("weeks", "mondays"), is in ``vocabulary``."""
    return any(w in vocabulary or (w.endswith("s") and w[:-1] in vocabulary) for w in words)


def _has_name(text: str, speakers: frozenset[str]) -> bool:
    """Whether ``text`` holds a capitalised word (two letters or more, not "I'm") that is not
    one of the ``speakers``' names: those appear everywhere in a conversation ("Hey Mel!")."""
    return any(len(w) > 1 and not w.startswith(("I'", "I’")) and w not in speakers
               for w in _CAPITALISED.findall(text))


def holds(text: str, speakers: frozenset[str] = frozenset()) -> int:
    """Bit flags of the kinds ``text`` can answer with (a digit is both a date and a number);
    ``speakers``: the words of the store's speaker names, which do not count as names."""
    name = NAME if _has_name(text, speakers) else 0
    if _DIGIT.search(text):
        return DATE | NUMBER | name
    words = set(_WORD.findall(text.lower()))
    return (DATE if _named(words, _DATE_WORDS) else 0) | (NUMBER if _named(words, _NUMBER_WORDS) else 0) | name
