"""Keyphrases: the one-to-three word phrases that set a cluster apart, and the labels made of them.

A cluster's candidates are phrases that many of its members contain and few other memories of
its namespace do (class-based TF-IDF on document counts: coverage in the cluster times the
phrase's inverse document frequency in the namespace). Phrases keep the form the members write
them in ("Kyoto", "JR Pass", "April 19"); counting is case-insensitive. Words are Unicode
words, so members in another script give phrases in that script; scripts written without
spaces (Chinese, Japanese) give runs of two or three characters.

A label names a topic: it is made of **topic phrases** (``topic_phrase``: a noun phrase holding
a word that is neither among the most frequent English words nor a verb, adverb, greeting or
time word, ``labels.wordclass``) whenever the cluster has one. Document counts find what
members share; the embedder says which of those phrases point at *this* cluster rather than a
neighbour (``by_distinctness``: candidates re-ranked by the margin of their embedding's cosine
to the cluster's centre over the best other centre, and the one- to three-phrase label with the
best margin chosen among the combinations of the best six topic phrases, the promising ones
found by an estimate from the phrases' own embeddings). Where no topic phrase points at the
cluster ("help", "keep" in a chat), phrases of its most typical members are tried too, then
those of more members, then every phrase of the members read (the wide look). A cluster where
none of these looks finds a topic phrase (thanks, greetings, "Ready", "Back to work") is small
talk and says so (``NEUTRAL_SMALL_TALK``); clause openings ("No worries", "Ready to") are never
labels.

A vector profile is made of these phrases only (``label``), so it is grounded in the members by
construction and can never copy one: at most ``LABEL_WORDS`` words joined by " · ". A cluster
whose members share no content word (greetings, "ok", emoji) gets a neutral label.

Cost: extracting a memory's phrases is a regular expression and its n-grams (about 0.1 ms);
``PhraseCache`` keeps them per text, so a re-organisation only extracts the memories it has not
seen (``store.cluster_phrases`` bounds what one pass reads). The re-rank embeds about a dozen short phrases per cluster, each once (5.5 s for those 325 clusters
on 2 busy cores, against 75 s to embed the memories); only new and drifted clusters are
re-ranked.

Pure Python with no dependency on the rest of the package: texts and vectors in, phrases and
labels out. The store gathers a cluster's members and its namespace's sample and ranks them
here (``store.cluster_phrases``).
"""

from __future__ import annotations

import functools
import math
import re
import threading
import unicodedata
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from clag_fast.labels import wordclass

__all__ = ["Keyphrase", "ClusterPhrases", "PhraseCache", "extract", "openings", "rank", "label", "phrases_label", "texts_label",
           "by_distinctness", "margins", "content_words", "topic_phrase", "NEUTRAL_LABEL", "NEUTRAL_MIXED",
           "NEUTRAL_SMALL_TALK", "NEUTRAL_LABELS", "STOPWORDS"]

# Words that carry no topic. Fillers of chat ("sounds", "yeah", "haha") are here because
# conversations are what agents store most; they made the tags "tim, sounds, fun".
STOPWORDS = frozenset(
    "a about above after again against all also am an and any are aren't as at be because been "
    "before being below between both but by can can't cannot could couldn't did didn't do does "
    "doesn't doing don't down during each either else ever every few for from further get gets "
    "getting got had hadn't has hasn't have haven't having he he'd he'll he's her here here's "
    "hers herself him himself his how how's i i'd i'll i'm i've if in into is isn't it it's its "
    "itself just let let's me might more most must mustn't my myself no nor not now of off on "
    "once only or other others ought our ours ourselves out over own per same shan't she she'd "
    "she'll she's should shouldn't so some such than that that's the their theirs them "
    "themselves then there there's these they they'd they'll they're they've this those "
    "through to too under until up upon us very was wasn't we we'd we'll we're we've were "
    "weren't what what's when when's where where's which while who who's whom why why's will "
    "with won't would wouldn't you you'd you'll you're you've your yours yourself yourselves "
    "yeah yes yep oh ok okay ooh oof hey hi hello wow lol haha hmm um uh ah sure thanks thank "
    "really actually maybe definitely totally pretty quite still even though already yet "
    "going go goes gone went come came coming know knew think thought like liked want wanted "
    "need needed make made take took see saw seen look looks looking say said tell told "
    "much many lot lots well great good nice cool awesome amazing fun glad sounds sound "
    "thing things stuff something anything everything way one ones two also just right "
    "kind sort bit little lot new old first last next back around again always never "
    "sometimes often usually today tomorrow yesterday time times day days "
    "three four five six seven eight nine ten everyone everybody someone somebody anyone anybody "
    "nobody wants makes keeps gets gonna wanna gotta recently lately probably honestly "
    "anyway anyways absolutely agree agreed keep keeps kept keeping feel feels felt hoping "
    "noticed seeing try trying must've could've should've would've".split()
)

# The only stopwords a three-word phrase may hold in its middle.
_JOINERS = frozenset("of for in on at to de la du del von van".split())

NEUTRAL_LABEL = "misc: short replies"
NEUTRAL_MIXED = "misc: mixed notes"
# Members that share words but hold no topic phrase: thanks, plans to talk later, "Ready".
NEUTRAL_SMALL_TALK = "misc: small talk"
#: Labels that make no claim about their members' topic.
NEUTRAL_LABELS = frozenset({NEUTRAL_LABEL, NEUTRAL_MIXED, NEUTRAL_SMALL_TALK})
# A vector label holds at most this many words: fewer than the eight-word run that makes a
# copy, so no label made of phrases can be a copied member sentence.
LABEL_WORDS = 6
MAX_LABEL_PHRASES = 3
MAX_TAGS = 3
MIN_MEMBERS = 2
# Typical members whose own phrases (held by no other member) a cluster without a label
# pointing at it may try, and how many of each: 8 x 2 fixed 0.02 more of self@1 on LoCoMo
# than 3 x 2 at one more embedding per phrase, for those clusters only.
TYPICAL_MEMBERS = 8
TYPICAL_PHRASES = 2

# A word: letters/digits, inner apostrophes, dots, colons, hyphens, slashes kept
# ("don't", "13:10", "HK-220931", "U.S"); underscores split ("flight_search").
_WORD_RE = re.compile(r"[^\W_]+(?:(?:['’.:/\-]|(?<=\d),(?=\d{3}))[^\W_]+)*")
# Each word with everything between it and the word before (a word starts and ends with a
# letter or digit, so the gap is exactly the non-word run before it): the words of a text in
# one ``findall``, and two words join when their gap is spaces only.
_GAP_WORD_RE = re.compile(r"([\W_]*)(" + _WORD_RE.pattern + ")")
# The non-word run at the end of a text, matched on the reversed text. ``_GAP_WORD_RE`` must
# not see it: from each of its positions the gap would run to the end and find no word, so a
# run of n characters cost n^2 steps (10k trailing dashes: 2.9 s).
_TAIL_RE = re.compile(r"[\W_]*")
# "User: ...", "Caroline: ..." at the start of a memory: who spoke, not what about.
_SPEAKER_RE = re.compile(r"^\s*[^\W\d_][\w.'-]{0,24}(?: [^\W\d_][\w.'-]{0,24})?:\s+")
# "[tool: flight_search]" -> "[flight_search]"; "[reflection]" -> "": markers, not content.
_MARKER_HEAD_RE = re.compile(r"\[[^\W\d_]\w{0,15}:\s*")
_MARKER_RE = re.compile(r"\[[^\W\d_]\w{0,15}\]")


# Any character ``_spaceless`` accepts (one regex search per token instead of a call per
# character: tokenising is most of a label's cost).
_SPACELESS_RE = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u0e00-\u0e7f]")


def _spaceless(ch: str) -> bool:
    """Characters of scripts written without spaces between words (CJK, Thai)."""
    o = ord(ch)
    return (0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x4DBF or 0x4E00 <= o <= 0x9FFF
            or 0xF900 <= o <= 0xFAFF or 0x0E00 <= o <= 0x0E7F)




def _script(ch: str) -> int:
    """0 for spaced scripts; else which spaceless script (a phrase stays inside one)."""
    o = ord(ch)
    if 0x3040 <= o <= 0x309F:
        return 1  # hiragana
    if 0x30A0 <= o <= 0x30FF:
        return 2  # katakana
    if 0x3400 <= o <= 0x4DBF or 0x4E00 <= o <= 0x9FFF or 0xF900 <= o <= 0xFAFF:
        return 3  # Han
    if 0x0E00 <= o <= 0x0E7F:
        return 4  # Thai
    return 0


def _tokens(text: str) -> list[tuple[str, int, bool]]:
    """(token as written, script, joins the previous token) for the words of ``text``, with
    markers and the speaker removed. Tokens join when only spaces separate them (a phrase
    never spans a comma, a full stop or "->"); spaceless-script characters are one token each
    and join within their script."""
    text = _clean(text)
    if _SPACELESS_RE.search(text) is None:  # most texts: every word a token, found in C
        end = len(text) - _TAIL_RE.match(text[::-1]).end()
        return [(w, 0, i > 0 and gap.isspace()) for i, (gap, w) in enumerate(_GAP_WORD_RE.findall(text, 0, end))]
    return _scan(text)


def _clean(text: str) -> str:
    """``text`` in NFC without its speaker and markers, underscores as spaces."""
    text = str(text)
    if not text.isascii():  # ASCII is already NFC
        text = unicodedata.normalize("NFC", text)
    text = _SPEAKER_RE.sub("", text, count=1)
    if "[" in text:
        text = _MARKER_HEAD_RE.sub("[", _MARKER_RE.sub(" ", text))
    return text.replace("_", " ")


def _scan(text: str) -> list[tuple[str, int, bool]]:
    """``_tokens`` of a cleaned text, word by word: the general path, for spaceless scripts."""
    out: list[tuple[str, int, bool]] = []
    append = out.append
    last_end = -1
    for m in _WORD_RE.finditer(text):
        w = m.group(0)  # starts and ends with a letter or digit: nothing to strip
        start = m.start()
        joins = last_end >= 0 and start > last_end and text[last_end:start].isspace()
        last_end = m.end()
        if _SPACELESS_RE.search(w) is None:
            append((w, 0, joins))
            continue
        run, prev = "", -1
        for c in w:
            sc = _script(c)
            if sc:
                if run:
                    append((run, 0, joins))
                    run = ""
                append((c, sc, prev == sc))
                joins = False
            else:
                run += c
            prev = sc
        if run:
            append((run, 0, False))
    return out


# Pure functions of a token, asked millions of times for a few thousand distinct words while
# labelling: memoised.
@functools.lru_cache(maxsize=1 << 16)
def _is_number(w: str) -> bool:
    return not any(c.isalpha() for c in w)


@functools.lru_cache(maxsize=1 << 16)
def _content(tok: str, script: int) -> bool:
    """A token that may start or end a phrase."""
    if script:
        return script != 1  # hiragana: particles and endings
    low = tok.casefold()
    if low in STOPWORDS:
        return False
    if _is_number(tok):
        return True  # allowed at an edge ("April 19"), never alone (see extract)
    # Two letters only as a written abbreviation ("JR", "AI"): lower-case ones are mostly
    # function words, in any language ("мы", "de").
    return len(low) >= 3 or (len(low) == 2 and tok != low)


def extract(text: str) -> dict[str, str]:
    """The distinct candidate phrases of ``text``: casefolded key -> the phrase as written.

    One to three consecutive words, separated by spaces only, that neither start nor end with
    a stopword and hold at least one word with a letter; for spaceless scripts, runs of two or
    three characters of one script.
    """
    toks = _tokens(text)
    out: dict[str, str] = {}
    n = len(toks)
    # Per token once (a token is looked at by up to three phrases): labelling reads tens of
    # thousands of member texts per bulk ingest, and this was most of that cost.
    content = [_content(w, sc) for w, sc, _ in toks]
    number = [not sc and _is_number(w) for w, sc, _ in toks]
    for i in range(n):
        if not content[i]:
            continue
        w0, s0, _ = toks[i]
        if s0:
            # Runs of two or three characters (one CJK character is rarely a word on its own).
            for j in range(i + 1, min(i + 3, n)):
                wj, sj, joins = toks[j]
                if not joins or sj != s0:
                    break
                if content[j]:
                    phrase = "".join(t for t, _, _ in toks[i:j + 1])
                    out.setdefault(phrase.casefold(), phrase)
            continue
        if not number[i]:
            out.setdefault(w0.casefold(), w0)
        if i + 1 >= n:
            continue
        w1, s1, joins1 = toks[i + 1]
        if not joins1 or s1:
            continue
        if content[i + 1] and not (number[i] and number[i + 1]):
            phrase = w0 + " " + w1
            out.setdefault(phrase.casefold(), phrase)
        if i + 2 >= n:
            continue
        w2, s2, joins2 = toks[i + 2]
        if not joins2 or s2 or not content[i + 2]:
            continue
        if not content[i + 1] and (w1.casefold() not in _JOINERS or number[i] or number[i + 2]):
            # "Bank of Japan", "visa for Japan"; not "vendors and hide", "19 at Kyoto".
            continue
        if number[i] and number[i + 1] and number[i + 2]:
            continue
        phrase = w0 + " " + w1 + " " + w2
        out.setdefault(phrase.casefold(), phrase)
    return out


# An opening does not start with these: read from a conjunction, article or preposition it is a
# clause's tail ("and the food", "of you means"), not how one begins.
_OPENING_NOT_FIRST = _JOINERS | frozenset("a an the and or but so as with by from than that which".split())
OPENING_WORDS = 4


def openings(text: str) -> dict[str, str]:
    """The clause openings of ``text`` that ``extract`` cannot give: two to ``OPENING_WORDS``
    words from a clause's start (the text's start, or after punctuation) that begin with a
    stopword and end with a content word: "No worries", "Can't wait to hear", "You rock",
    "Let's keep movin". Casefolded key -> as written; spaced scripts only.

    A chat cluster is often set apart by how its members say things more than by a topic
    word (thanks, encouragement, goodbyes between the same two people): where these point at
    a cluster and no topic phrase does, the cluster is small talk (``by_distinctness``). They
    are never labels."""
    toks = _tokens(text)
    out: dict[str, str] = {}
    n = len(toks)
    for i in range(n):
        w0, s0, joins0 = toks[i]
        if joins0 or s0 or _content(w0, 0) or w0.casefold() in _OPENING_NOT_FIRST:
            continue
        for j in range(i + 1, min(i + OPENING_WORDS, n)):
            wj, sj, joins = toks[j]
            if not joins or sj:
                break
            if _content(wj, 0) and not _is_number(wj):
                phrase = " ".join(t for t, _, _ in toks[i:j + 1])
                out.setdefault(phrase.casefold(), phrase)
    return out


def content_words(text: str) -> list[str]:
    """Casefolded content words of ``text`` (the unit of the groundedness measure); for
    spaceless scripts, single characters that are not kana."""
    out = []
    for tok, sc, _ in _tokens(text):
        if _content(tok, sc) and not (not sc and _is_number(tok)):
            out.append(tok.casefold())
    return out


@functools.lru_cache(maxsize=1 << 16)
def topic_phrase(text: str) -> bool:
    """``text`` is a noun phrase about something in particular (``labels.wordclass``): it does
    not open a clause (no function word or verb first), it ends on a word that may head a noun phrase
    or on a number ("Nozomi 14:10"), and one of its words is specific (a noun outside the most
    frequent English words, or a code). "Kamogawa Residence", "JR Pass", "vegetarian kaiseki"
    are; "bring", "Perfect", "morning", "presenting remotely", "options saved" are not. Phrases
    in a script written without spaces are taken as topics (no word list judges them)."""
    words = text.split()
    if not words:
        return False
    if _spaceless(text[0]):
        return True
    if words[0].casefold() in STOPWORDS or not wordclass.opens_noun_phrase(words[0]):
        return False
    last = words[-1]
    if not (wordclass.noun_like(last) or any(c.isdigit() for c in last)):
        return False
    return any(wordclass.specific_word(w) for w in words if w.casefold() not in _JOINERS)


@dataclass(frozen=True)
class Keyphrase:
    """A candidate phrase: as written, its score, members containing it, and their share."""

    text: str
    score: float
    count: int
    coverage: float

    @property
    def topical(self) -> bool:
        """The phrase names a topic (``topic_phrase``)."""
        return topic_phrase(self.text)


@dataclass
class ClusterPhrases:
    """A cluster's ranked candidates and, when they share no content words, its neutral label."""

    candidates: list[Keyphrase] = field(default_factory=list)
    neutral: str | None = None
    head: list[str] | None = None  # the label's phrases when chosen (``by_distinctness``)
    # The head came from the wide look (``by_distinctness``): no topic phrase pointed at the
    # cluster, and the label is the best of hundreds of combinations embedded.
    wide: bool = False
    members: int = 0  # the cluster's live members (``rank``: those it read; the wide look serves bigger clusters first)
    # The document counts came from the namespace's whole sample (not only the part of it a
    # bounded pass read so far: ``BackgroundCounts.counts``'s ``limit``).
    complete: bool = True
    # Each embedded phrase's margin alone (``by_distinctness``): > 0 when it points at this
    # cluster's centre rather than another.
    margins: dict[str, float] = field(default_factory=dict)
    # The best margin of a label holding common words or clause openings (``by_distinctness``):
    # how well the members' talk, rather than a topic, points at the cluster.
    talk: float = -math.inf
    # Finds typical members' phrases when first asked (``rank`` sets it; arguments: how many
    # members, how many phrases each): only clusters no label points at need them, and
    # finding them for every cluster cost a fifth more than ranking.
    find_typical: Callable[[int, int], list[Keyphrase]] | None = field(default=None, repr=False, compare=False)
    # Finds every phrase of the members read (``rank`` sets it; argument: at most how many,
    # best document-count score first): for the wide look only.
    find_every: Callable[[int], list[Keyphrase]] | None = field(default=None, repr=False, compare=False)
    # Finds the clause openings of the members read (``rank`` sets it when given their texts;
    # argument: at most how many): to tell small talk only.
    find_openings: Callable[[int], list[Keyphrase]] | None = field(default=None, repr=False, compare=False)
    _typical: list[Keyphrase] | None = field(default=None, init=False, repr=False, compare=False)

    def phrases(self, n: int | None = None) -> list[str]:
        return [k.text for k in self.candidates[:n]]

    def tag_phrases(self) -> list[str]:
        """The topic phrases among the candidates, in rank order: what labels and tags are made
        of."""
        return [k.text for k in self.candidates if k.topical]

    def pointing(self, n: int | None = None) -> list[str]:
        """The first ``n`` topic phrases whose embedding alone points at this cluster (margin >
        0, ``by_distinctness``), in rank order; every topic phrase when none was embedded. What
        an SLM may choose the label from."""
        if not self.margins:
            return self.tag_phrases()[:n]
        return [k.text for k in self.candidates if k.topical and self.margins.get(k.text, 0.0) > 0][:n]

    @property
    def typical(self) -> list[Keyphrase]:
        """Phrases of the ``TYPICAL_MEMBERS`` most typical members that no other member holds
        (``rank``), at most ``TYPICAL_PHRASES`` each."""
        if self._typical is None:
            self._typical = self.typical_phrases(TYPICAL_MEMBERS, TYPICAL_PHRASES)
        return self._typical

    def typical_phrases(self, members: int, each: int) -> list[Keyphrase]:
        """Phrases of the ``members`` most typical members that no other member holds, at most
        ``each`` per member, one per idea (none repeats a word of the candidates or of an
        earlier one); empty for a cluster ranked without them."""
        return self.find_typical(members, each) if self.find_typical is not None else []

    def every_phrase(self, limit: int) -> list[Keyphrase]:
        """Every topic phrase of the members read, shared or one member's own, at most
        ``limit`` (best document-count score first); empty for a cluster ranked without them."""
        return self.find_every(limit) if self.find_every is not None else []

    def opening_phrases(self, limit: int) -> list[Keyphrase]:
        """The members' clause openings (``openings``), at most ``limit``: those more members
        say first, then those of the more typical members; empty for a cluster ranked without
        its members' texts."""
        return self.find_openings(limit) if self.find_openings is not None else []


class PhraseCache:
    """Phrases per memory text, kept across re-organisations (bounded, oldest dropped first),
    and each namespace's background document counts (``background``)."""

    def __init__(self, max_items: int = 100_000) -> None:
        self.max_items = max_items
        self._items: OrderedDict[str, dict[str, str]] = OrderedDict()
        self.misses = 0
        self.background = BackgroundCounts()

    def get(self, text: str) -> dict[str, str]:
        got = self._items.get(text)
        if got is None:
            self.misses += 1
            got = extract(text)
            self._items[text] = got
            if len(self._items) > self.max_items:
                self._items.popitem(last=False)
        return got

    def __len__(self) -> int:
        return len(self._items)


class BackgroundCounts:
    """In how many rows of each namespace's background sample every phrase key occurs, kept
    across re-organisations and updated by the rows that entered or left the sample. The
    sample (every stride-th live row) barely changes between two periodic passes, and
    counting it afresh read ~4,000 rows' phrases (and fetched their texts) at every pass:
    most of the labelling cost of a bulk ingest of short texts in small batches. Rows are
    never reused and their text never changes (an edit writes a new row), so the counts
    equal a fresh count of the same sample."""

    def __init__(self, max_namespaces: int = 64) -> None:
        # Least recently counted namespaces are dropped first (a store of many small tenants
        # would otherwise keep every tenant's sample).
        self.max_namespaces = max_namespaces
        self._by_ns: OrderedDict[int, tuple[dict[int, tuple[str, ...]], Counter[str]]] = OrderedDict()
        self._lock = threading.Lock()
        #: Whether the last ``counts`` call counted every row of its sample.
        self.last_complete = True

    def counts(self, ns: int, take: list[int], phrases_of: Callable[[list[int]], dict[int, dict[str, str]]],
               scale: float = 1.0, limit: int | None = None) -> Counter[str] | None:
        """Counts over the rows ``take``, each times ``scale`` (rounded: the sample stands for
        ``scale`` times as many rows); ``phrases_of(rows)`` gives the phrases of rows not
        counted yet (a row it leaves out counts as having none, as before). ``limit``: read at
        most that many rows not counted yet (spread evenly over them); the counts then stand
        for the whole sample from the rows counted so far, and the rest are read by later
        calls. None when no row of the sample is counted."""
        with self._lock:
            held, df = self._by_ns.get(ns, ({}, Counter()))
            wanted = set(take)
            gone = [r for r in held if r not in wanted]
            new = [r for r in take if r not in held]
            if len(gone) + len(new) >= len(take):  # mostly a new sample: count afresh
                held, df, gone, new = {}, Counter(), [], list(take)
            for r in gone:
                df.subtract(held.pop(r))
            if limit is not None and len(new) > limit:
                new = new[::-(-len(new) // max(1, limit))][:limit] if limit > 0 else []
            got = phrases_of(new) if new else {}
            for r in new:
                keys = tuple(got.get(r, {}))
                held[r] = keys
                df.update(keys)
            self._by_ns[ns] = (held, df)
            self._by_ns.move_to_end(ns)
            while len(self._by_ns) > self.max_namespaces:
                self._by_ns.popitem(last=False)
            self.last_complete = len(held) == len(take)
            if not held:
                return None
            scale *= len(take) / len(held)
            # A copy: the ranking keeps the counts in closures used after this returns, and
            # the next pass updates the held ones in place.
            if scale == 1.0:
                return Counter(df)
            return Counter({k: int(round(v * scale)) for k, v in df.items()})


@functools.lru_cache(maxsize=1 << 16)
def _named(phrase: str) -> bool:
    """Every word with a letter starts with a capital ("Kamogawa Residence", "JR Pass")."""
    words = [w for w in phrase.split() if any(c.isalpha() for c in w) and w.casefold() not in _JOINERS]
    return bool(words) and all(w[0].isupper() for w in words)


def _surface(forms: dict[str, int]) -> str:
    """The most frequent written form; ties go to the one with capitals (names)."""
    if len(forms) == 1:  # the usual case: no choice to make
        return next(iter(forms))
    return max(forms.items(), key=lambda kv: (kv[1], sum(c.isupper() for c in kv[0]), kv[0]))[0]


def _phrase_score(key: str, c: int, n: int, forms: dict[str, dict[str, int]], background_df: Counter | None,
                  N: int) -> float:
    """Coverage in the cluster (``c`` of ``n`` members) times rarity in the namespace."""
    if _spaceless(key[0]):
        nwords = max(1, len(key) - 1)
    else:  # content words: "Residence in Kyoto" is no longer than "Kamogawa Residence"
        nwords = sum(w not in _JOINERS for w in key.split())
    if background_df is not None:
        bg = max(background_df.get(key, 0), c)
        idf = math.log((N + 1) / (bg + 0.5))
    else:
        # No namespace to compare with (a new cluster's first member): names, written with
        # capitals, say more than common words.
        idf = 1.5 if _named(_surface(forms[key])) else 1.0
    # Longer phrases read better and say more; a small bonus breaks near-ties their way.
    return (c / n) * idf * (1.0 + 0.15 * (min(nwords, 3) - 1))


def rank(members: Sequence[dict[str, str]], background_df: Counter | None = None, n_background: int = 0,
         limit: int = 12, texts: Sequence[str] | None = None) -> ClusterPhrases:
    """Rank the phrases of one cluster's ``members`` (each ``extract``'s output).

    ``background_df``: in how many memories of the namespace each phrase key occurs (the
    cluster's members included), out of ``n_background``; without it, phrases are ranked by
    how many members hold them, longer first. A phrase must occur in two members when the
    cluster has two or more: one member's phrase says nothing about the rest. Topic phrases
    (``topic_phrase``) come first, so a common word ("card") never takes the idea of a topic
    phrase that holds it ("Suica card"); the other phrases follow, for clusters that have none.
    ``texts``: the members' texts in the same order, for their clause openings
    (``opening_phrases``).
    """
    if texts is not None and len(texts) != len(members):
        raise ValueError(f"{len(texts)} texts for {len(members)} members")
    n = len(members)
    if n == 0:
        return ClusterPhrases()
    df, forms = _counts(members)
    need = min(n, MIN_MEMBERS)
    N = max(n_background, n)
    scored: list[tuple[float, str]] = []
    single: dict[str, float] = {}  # scores of phrases one member holds (reused for ``typical``)
    for key, c in df.items():
        if c < need:
            continue
        score = _phrase_score(key, c, n, forms, background_df, N)
        if c == 1:
            single[key] = score
        if score > 0:
            scored.append((score, key))
    scored.sort(key=lambda x: (not topic_phrase(x[1]), -x[0], x[1]))
    chosen, _ = _one_per_idea(scored, forms, df, n, limit)
    if not chosen:  # the members share no content word: say so rather than guess
        short = np.median([len(m) for m in members]) <= 3
        return ClusterPhrases(chosen, NEUTRAL_LABEL if short else NEUTRAL_MIXED)
    used = set().union(*(_idea_words(k.text.casefold()) for k in chosen if k.topical))
    more = _MoreLooks(members, texts, df, forms, single, used, n, N, background_df)
    return ClusterPhrases(chosen, None, members=n, find_typical=more.typical, find_every=more.every,
                          find_openings=more.openings if texts is not None else None)


def _counts(members: Sequence[dict[str, str]]) -> tuple[Counter[str], dict[str, dict[str, int]]]:
    """In how many members each phrase key occurs, and how often each written form of it."""
    df: Counter[str] = Counter()
    # Written forms per key, counted in plain dicts (a Counter per phrase cost more than the
    # ranking itself).
    forms: dict[str, dict[str, int]] = {}
    for m in members:
        df.update(m.keys())
        for key, form in m.items():
            f = forms.get(key)
            if f is None:
                forms[key] = {form: 1}
            else:
                f[form] = f.get(form, 0) + 1
    return df, forms


def _idea_words(key: str) -> set[str]:
    """The words that make a phrase's idea, nouns in their singular ("hotels" and "Hotel" are
    one idea); the phrase itself in a script without spaces."""
    if _spaceless(key[0]):
        return {key}
    return {wordclass.singular(w) for w in key.split() if w not in STOPWORDS}


def _one_per_idea(scored: list[tuple[float, str]], forms: dict[str, dict[str, int]], df: Counter[str], n: int,
                  limit: int) -> tuple[list[Keyphrase], set[str]]:
    """The best ``limit`` phrases of ``scored`` (best first), one per idea, and the words
    they used."""
    chosen: list[Keyphrase] = []
    used: set[str] = set()
    for score, key in scored:
        words = _idea_words(key)
        # One phrase per idea: "Kyoto" after "Kyoto hotels" (or before it) would repeat it.
        if any(w in used for w in words) or any(key in u or u in key for u in used if _spaceless(key[0])):
            continue
        chosen.append(Keyphrase(_surface(forms[key]), round(score, 4), df[key], round(df[key] / n, 3)))
        used |= words
        if len(chosen) >= limit:
            break
    return chosen, used


@dataclass
class _MoreLooks:
    """What one ranking counted, kept for the further looks ``by_distinctness`` may take at a
    cluster whose shared phrases are too common to point at it ("help", "keep" in a chat)."""

    members: Sequence[dict[str, str]]  # nearest the centre first
    texts: Sequence[str] | None
    df: Counter[str]
    forms: dict[str, dict[str, int]]
    single: dict[str, float]  # scores of the phrases one member holds
    used: set[str]  # the words of the chosen topic phrases
    n: int
    n_background: int
    background_df: Counter | None

    def _score(self, key: str, c: int) -> float:
        return self.single[key] if key in self.single else _phrase_score(
            key, c, self.n, self.forms, self.background_df, self.n_background)

    def typical(self, n_members: int, each: int) -> list[Keyphrase]:
        """Up to ``each`` topic phrases of each of the ``n_members`` most typical members that
        no other member holds, one per idea."""
        typical: list[Keyphrase] = []
        taken_words = set(self.used)
        for m in self.members[:n_members]:
            scores = {k: self._score(k, 1) for k in m if self.df[k] == 1 and topic_phrase(k)}
            taken = 0
            for key in sorted(scores, key=lambda k: (-scores[k], k)):
                words = _idea_words(key)
                if scores[key] <= 0 or any(w in taken_words for w in words):
                    continue
                typical.append(Keyphrase(_surface(self.forms[key]), round(scores[key], 4), 1, round(1 / self.n, 3)))
                taken_words |= words
                taken += 1
                if taken == each:
                    break
        return typical

    def every(self, limit: int) -> list[Keyphrase]:
        """The best ``limit`` of every topic phrase the members hold."""
        scores = {k: self._score(k, c) for k, c in self.df.items() if topic_phrase(k)}
        keys = sorted((k for k in scores if scores[k] > 0), key=lambda k: (-scores[k], k))[:limit]
        return [Keyphrase(_surface(self.forms[k]), round(scores[k], 4), self.df[k], round(self.df[k] / self.n, 3))
                for k in keys]

    def openings(self, limit: int) -> list[Keyphrase]:
        """The members' most said clause openings."""
        said: Counter[str] = Counter()
        form: dict[str, str] = {}
        first: dict[str, int] = {}
        for r, t in enumerate(self.texts or ()):
            for key, phrase in openings(t).items():
                said[key] += 1
                form.setdefault(key, phrase)
                first.setdefault(key, r)
        # Members come nearest the centre first: a tie goes to the more typical member's.
        keys = sorted(said, key=lambda k: (-said[k], first[k], k))[:limit]
        n = self.n
        return [Keyphrase(form[k], round(said[k] / n, 4), said[k], round(said[k] / n, 3)) for k in keys]


def label(candidates: Sequence[str], picked: Sequence[str] | None = None,
          neutral: str | None = None) -> tuple[str, list[str]]:
    """(summary, tags) from a cluster's ranked ``candidates``: ``picked`` (an SLM's choice, in
    its order) or the top-ranked ones, joined by " · " up to ``LABEL_WORDS`` words; the tags
    are the next candidates. ``neutral`` (or ``NEUTRAL_LABEL``) when there are none."""
    if not candidates and not picked:
        return (neutral or NEUTRAL_LABEL), []
    order = list(picked) if picked else list(candidates)
    head: list[str] = []
    words = 0
    for p in order:
        w = len(p.split())
        if head and (words + w > LABEL_WORDS or len(head) >= MAX_LABEL_PHRASES):
            break
        head.append(p)
        words += w
    tags = [p for p in candidates if p not in head][:MAX_TAGS]
    return " · ".join(head), tags


def phrases_label(phrases: ClusterPhrases) -> tuple[str, list[str]]:
    """A cluster's vector profile: its chosen ``head`` (or its top topic phrases) as the label,
    the next topic phrases as tags; the neutral label (candidates as tags) when it has one, and
    ``NEUTRAL_SMALL_TALK`` when no candidate is a topic phrase."""
    if phrases.neutral is not None:
        return phrases.neutral, phrases.phrases(MAX_TAGS)
    topics = phrases.tag_phrases()
    if not phrases.head and not topics:
        return NEUTRAL_SMALL_TALK, phrases.phrases(MAX_TAGS)
    return label(topics, phrases.head)


def texts_label(texts: Sequence[str]) -> tuple[str, list[str]]:
    """A label from texts alone (no namespace statistics): a new cluster's first member."""
    return phrases_label(rank([extract(t) for t in texts if str(t).strip()] or [{}]))


def margins(vecs: np.ndarray, own: Sequence[int], centres: np.ndarray) -> np.ndarray:
    """For each row of ``vecs`` (unit), its cosine to centre ``own[i]`` minus its best cosine
    to any other centre: > 0 when the text is nearest its own cluster."""
    sims = np.asarray(vecs, np.float32) @ np.asarray(centres, np.float32).T
    own = np.asarray(own, np.int64)
    mine = sims[np.arange(len(own)), own]
    sims[np.arange(len(own)), own] = -np.inf
    other = sims.max(axis=1) if sims.shape[1] > 1 else np.full(len(own), -1.0, np.float32)
    return mine - other


# Label variants embedded for real per cluster, beyond its single phrases: the best by the
# estimate (``_estimate``). Four costs what embedding the three pairs and the triple of the
# top three phrases would; the estimate makes them the four most promising of all pairs and
# triples of the best ``SHORTLIST`` phrases. Clusters no label points at get
# a wider look (``WEAK_*``): on ten LoCoMo conversations self@1 0.954 with it, 0.933 with
# the first look's settings (every cluster's label recomputed on the final clusters).
TRIES = 4
SHORTLIST = 6
WEAK_SHORTLIST = 10
WEAK_TRIES = 16
# The last look, for clusters even the second leaves without a label pointing at them: the own
# phrases of this many typical members, this many each, combined as in the second look. On the
# ten LoCoMo conversations (every cluster relabelled on the final clusters) self@1 0.954 ->
# 0.976 for 9.6% more texts embedded (7,676 -> 8,410), 18 of 643 labels changed; 16 members
# did as well as 32, 2 phrases each 0.971.
LAST_MEMBERS = 32
LAST_PHRASES = 4
# The wide look, for clusters even the last look leaves without a label pointing at them
# (chat clusters whose centres lie close together): every phrase of the members read, at most
# ``WIDE_PHRASES`` of them (best document-count score first), each embedded; the
# ``WIDE_SHORTLIST`` that point best at the cluster, one per idea, are combined and every pair
# and triple of them embedded (``WIDE_TRIES``: the estimate ranks chat phrases' combinations
# poorly, correlation 0.4-0.6 with the real margins). The earlier looks offer only the top
# shared phrases and the typical members' own; a phrase two members share below the top
# twelve ("Maria", "virtual support group", "music") was in none of them. Relabelling ten
# LoCoMo conversations' stores (643 labels, 8,502 texts embedded without the wide look, self@1
# 0.972): shortlist 12, 16 combinations by the estimate 0.984 (+5.4% texts); 8, all 0.988
# (+19%); 10, all 0.991 (+36%); 12, all 0.994 (+59%).
WIDE_PHRASES = 160
WIDE_SHORTLIST = 10
# The members' most said clause openings embedded for a cluster no topic label points at: if
# they point at it better than its topic phrases, the cluster is small talk (thanks,
# encouragement, goodbyes).
SMALL_TALK_OPENINGS = 16
# Talk phrases (common words, openings) a wide look combines, every pair and triple (28 + 56).
WIDE_TALK = 8
# Every pair and triple of the shortlist (45 + 120).
WIDE_TRIES = WIDE_SHORTLIST * (WIDE_SHORTLIST - 1) // 2 + WIDE_SHORTLIST * (WIDE_SHORTLIST - 1) * (WIDE_SHORTLIST - 2) // 6
# At most this many clusters get the wide look per call, the largest first: each costs up to
# WIDE_PHRASES + WIDE_TRIES embeddings of short texts (325), so a big store's first labelling
# stays bounded (on a LoCoMo conversation 2-6 clusters need it; later passes relabel only new,
# drifted and stale clusters).
WIDE_CLUSTERS = 32


def _combos(n: int) -> list[tuple[int, ...]]:
    """Pairs and triples of ``range(n)``, in order."""
    return ([(a, b) for a in range(n) for b in range(a + 1, n)]
            + [(a, b, c) for a in range(n) for b in range(a + 1, n) for c in range(b + 1, n)])


class _Vectors:
    """Embeddings of short texts, each embedded once per ``by_distinctness`` call; batches
    go to ``embed`` whole (one call per round, not per cluster)."""

    def __init__(self, embed: Callable[[list[str]], np.ndarray]) -> None:
        self.embed = embed
        self.known: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        new = [t for t in dict.fromkeys(texts) if t not in self.known]
        if new:
            got = np.asarray(self.embed(new), np.float32)
            if got.shape[0] != len(new):
                raise ValueError(f"the embedder returned {got.shape[0]} vectors for {len(new)} texts")
            self.known.update(zip(new, got))
        return np.stack([self.known[t] for t in texts]) if texts else np.zeros((0, 0), np.float32)


def _estimate(vecs: np.ndarray, weights: np.ndarray, combos: list[tuple[int, ...]]) -> np.ndarray:
    """The embedding of "a · b · c" estimated from those of its phrases: their mean weighted
    by word count, normalised (mean pooling over the label's tokens is close to that). Used
    only to choose which variants to embed; the chosen label's margin is always measured."""
    idx = np.array([(*cb, cb[-1]) if len(cb) == 2 else cb for cb in combos], np.int64)
    w = weights[idx] * np.array([[1.0, 1.0, float(len(cb) == 3)] for cb in combos], np.float32)
    out = np.einsum("ck,ckd->cd", w, vecs[idx])
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def _choose(found: dict[int, ClusterPhrases], pools: dict[int, list[Keyphrase]], slot: dict[int, int],
            centres: np.ndarray, vectors: _Vectors, shortlist: int | None = None,
            tries: int | None = None, talk: bool = False) -> dict[int, float]:
    """For each cluster: order its ``pools`` phrases by margin (``margins``) into its
    candidates and choose as ``head`` the label with the best margin among its single phrases
    and the ``tries`` pairs and triples of its ``shortlist`` best phrases whose estimated
    margin (``_estimate``) is best. A pool holding topic phrases offers only those (``_topics``),
    unless ``talk``: then common words and clause openings compete too, only to measure how well
    the cluster's talk points at it (``ClusterPhrases.talk``); the head stays the best label of
    topic phrases where there is one. Returns the head's margin per cluster."""
    shortlist = SHORTLIST if shortlist is None else shortlist
    tries = TRIES if tries is None else tries
    pools = {c: pool if talk else _topics(pool) for c, pool in pools.items()}
    todo = [c for c in pools if pools[c]]
    texts = [k.text for c in todo for k in pools[c]]
    if not texts:
        return {}
    vecs = vectors(texts)
    m = margins(vecs, [slot[c] for c in todo for _ in pools[c]], centres)
    # Per cluster: its phrases ranked, and the estimated pair/triple embeddings, all clusters'
    # estimates then scored in one product with the centres (small products one cluster at a
    # time cost more in call overhead than in arithmetic).
    ranked: dict[int, tuple[list[int], dict[str, float]]] = {}
    est_vecs: list[np.ndarray] = []
    est_own: list[int] = []
    est_of: list[tuple[int, tuple[int, ...]]] = []  # (cluster, combo of pool positions)
    at = 0
    for c in todo:
        pool = pools[c]
        mine = m[at:at + len(pool)].tolist()
        # Rank by margin, the document-count rank breaking near-ties (within 0.02).
        order = sorted(range(len(pool)), key=lambda j: (-round(mine[j] / 0.02), j))
        ranked[c] = (order, {k.text: x for k, x in zip(pool, mine)})
        found[c].margins.update(ranked[c][1])
        short = order[:shortlist]
        combos = _combos(len(short))
        if combos:
            weights = np.array([len(pool[j].text.split()) for j in short], np.float32)
            est_vecs.append(_estimate(vecs[at:at + len(pool)][short], weights, combos))
            est_own += [slot[c]] * len(combos)
            est_of += [(c, tuple(short[j] for j in cb)) for cb in combos]
        at += len(pool)
    est = margins(np.concatenate(est_vecs), est_own, centres) if est_vecs else np.zeros(0)
    by_cluster: dict[int, list[tuple[float, tuple[int, ...]]]] = {}
    for (c, cb), x in zip(est_of, est.tolist()):
        by_cluster.setdefault(c, []).append((x, cb))
    variants: list[tuple[int, list[str], float | None]] = []
    for c in todo:
        pool = pools[c]
        order, single = ranked[c]
        ranked_pool = [pool[j] for j in order]
        rest = [k for k in found[c].candidates if k not in ranked_pool]
        # Clause openings measure the talk; they never become candidates (tags, SLM choices).
        found[c].candidates = [k for k in ranked_pool if k.topical or k in rest or k in found[c].candidates] + rest
        phrases = found[c].phrases()
        tried: list[list[str]] = [[k.text] for k in ranked_pool]
        taken = 0
        for _, cb in sorted(by_cluster.get(c, []), key=lambda e: -e[0]):
            if taken >= tries:
                break
            head = label(phrases, [pool[j].text for j in cb])[0].split(" · ")
            if head not in tried:
                tried.append(head)
                taken += 1
        for head in tried:
            variants.append((c, head, single.get(head[0]) if len(head) == 1 else None))
    need = [j for j, v in enumerate(variants) if v[2] is None]
    vm = margins(vectors([" · ".join(variants[j][1]) for j in need]), [slot[variants[j][0]] for j in need],
                 centres).tolist() if need else []
    got = dict(zip(need, vm))
    best: dict[int, tuple[tuple[bool, bool, float], float, int]] = {}
    for j, (c, h, single_m) in enumerate(variants):
        margin = single_m if single_m is not None else got[j]
        topical = all(map(topic_phrase, h))
        if not topical:
            found[c].talk = max(found[c].talk, margin)
        # A label of topic phrases beats one with talk in it; then a label that points at its
        # cluster beats one that does not; among those, longer labels say more: one more
        # phrase wins unless it blurs the label (margin -0.01).
        score = (topical, margin > 0, margin + 0.01 * len(h))
        if c not in best or score > best[c][0]:
            best[c] = (score, margin, j)
    for c, (_, _, j) in best.items():
        found[c].head = variants[j][1]
    return {c: margin for c, (_, margin, _) in best.items()}


def _topics(pool: list[Keyphrase]) -> list[Keyphrase]:
    """The topic phrases of ``pool``; the whole pool when it holds none (the cluster is then
    looked at again, and named small talk when no look finds one)."""
    topics = [k for k in pool if k.topical]
    return topics or pool


def _topical(ph: ClusterPhrases) -> bool:
    """The cluster's chosen label is made of topic phrases."""
    return bool(ph.head) and all(topic_phrase(p) for p in ph.head)


def by_distinctness(found: dict[int, ClusterPhrases], ids: Sequence[int], centres: np.ndarray,
                    embed: Callable[[list[str]], np.ndarray], top: int = 8) -> dict[int, float]:
    """Re-rank each cluster's ``top`` candidates in place by how clearly their embedding points
    at the cluster's centre rather than another (``margins``), and choose as ``head`` the
    one-, two- or three-phrase label whose embedding does so most clearly.

    Document counts find the phrases a cluster's members share; the embedding says which of
    them a reader (and the answer prompt) would take for *this* cluster: "deer" and "bow" say
    Nara, "works" says nothing. Which pairs and triples are worth embedding is estimated from
    the phrases' own embeddings (``_estimate``), so the label is chosen among all combinations
    of the best phrases, not only those of the top three. Only topic phrases are offered while
    a cluster has any (``topic_phrase``). A cluster whose label still points elsewhere ("help",
    "keep" in a chat), or holds no topic phrase, gets a second look: its remaining candidates
    and its typical members' own topic phrases, a ``WEAK_SHORTLIST`` of them combined and
    ``WEAK_TRIES`` combinations embedded; one still without gets a last look, the same with the
    phrases of ``LAST_MEMBERS`` members; one still without gets a wide look at every topic
    phrase of its members (``WIDE_PHRASES``, ``_wide_pools``; at most ``WIDE_CLUSTERS`` per
    call, the largest first). A later look's label replaces an earlier one only when it is
    better: made of topic phrases where the earlier was not, else a better margin (``wide``
    marks the clusters the wide look named). A cluster that no look finds a topic phrase
    pointing at it for is small talk (``neutral`` becomes ``NEUTRAL_SMALL_TALK``) when it has
    no topic phrase at all or its common words point at it (``_small_talk``); else it keeps its
    best topic label, pointing elsewhere. Costs one embedding per
    candidate and ``TRIES`` per label, about 30 more for each cluster that needs a second or
    last look, and up to ``WIDE_PHRASES + WIDE_TRIES`` for one that needs the wide look (each
    text embedded once per call). Returns the chosen label's margin per cluster (<= 0: even the
    best label points elsewhere).
    """
    slot = {int(c): i for i, c in enumerate(ids)}
    live = {c: ph for c, ph in found.items() if c in slot and ph.candidates and ph.neutral is None}
    vectors = _Vectors(embed)
    got = _choose(live, {c: ph.candidates[:top] for c, ph in live.items()}, slot, centres, vectors)

    def settled(c: int) -> bool:
        return got[c] > 0 and _topical(live[c])

    weak = [c for c in got if not settled(c)]
    if weak:
        # Only the clusters still without a topic label that points at them; phrases embedded
        # in the first round are not embedded again.
        pools = {c: live[c].candidates + [k for k in live[c].typical if k not in live[c].candidates] for c in weak}
        _look_again(live, got, pools, slot, centres, vectors, WEAK_SHORTLIST, WEAK_TRIES)
        still = [c for c in weak if not settled(c)]
        if still and LAST_MEMBERS > TYPICAL_MEMBERS:
            # The last look, for the few still without one: the own phrases of many more
            # members (a chat cluster's centre is the mean of many one-off remarks).
            pools = {c: pools[c] + [k for k in live[c].typical_phrases(LAST_MEMBERS, LAST_PHRASES)
                                    if k not in pools[c]] for c in still}
            _look_again(live, got, pools, slot, centres, vectors, WEAK_SHORTLIST, WEAK_TRIES)
            still = [c for c in still if not settled(c)]
        # The wide look does not depend on the last one having run.
        still = sorted(still, key=lambda c: -live[c].members)[:WIDE_CLUSTERS]
        if still and WIDE_PHRASES:
            pools = _wide_pools({c: live[c] for c in still}, slot, centres, vectors)
            before = {c: (_topical(live[c]), got[c]) for c in pools}
            _look_again(live, got, pools, slot, centres, vectors, WIDE_SHORTLIST, WIDE_TRIES)
            for c in pools:
                live[c].wide = (_topical(live[c]), got[c]) > before[c]
        still = [c for c in still if not settled(c)]
        if still and WIDE_TALK:
            _measure_talk(live, _talk_pools({c: live[c] for c in still}, top, slot, centres, vectors), slot,
                          centres, vectors)
    _small_talk(live, got, [c for c in got if not settled(c)], top, slot, centres, vectors)
    return got


def _talk_phrases(ph: ClusterPhrases, top: int) -> list[Keyphrase]:
    """How a cluster's members talk: its common-word candidates and their clause openings."""
    return [k for k in ph.candidates[:top] if not k.topical] + ph.opening_phrases(SMALL_TALK_OPENINGS)


def _talk_pools(found: dict[int, ClusterPhrases], top: int, slot: dict[int, int], centres: np.ndarray,
                vectors: "_Vectors") -> dict[int, list[Keyphrase]]:
    """Per cluster: its talk phrases (``_talk_phrases``) ordered by margin, one per idea, the
    best ``WIDE_TALK``."""
    every = {c: _talk_phrases(ph, top) for c, ph in found.items()}
    got = _cluster_margins({c: [k.text for k in pool] for c, pool in every.items()}, slot, centres, vectors)
    return {c: _best_per_idea(every[c], mine, WIDE_TALK) for c, mine in got.items()}


def _cluster_margins(texts: dict[int, list[str]], slot: dict[int, int], centres: np.ndarray,
                     vectors: "_Vectors") -> dict[int, list[float]]:
    """Per cluster with texts: each text's margin towards the cluster's centre (``margins``),
    every cluster's texts embedded in one batch."""
    todo = [c for c in texts if texts[c]]
    if not todo:
        return {}
    m = margins(vectors([t for c in todo for t in texts[c]]), [slot[c] for c in todo for _ in texts[c]],
                centres).tolist()
    out, at = {}, 0
    for c in todo:
        out[c] = m[at:at + len(texts[c])]
        at += len(texts[c])
    return out


def _best_per_idea(pool: list[Keyphrase], mine: list[float], limit: int) -> list[Keyphrase]:
    """``pool`` by margin (``mine``), best first, dropping a phrase that shares a word of its
    idea with a better one; at most ``limit``."""
    taken: list[Keyphrase] = []
    used: set[str] = set()
    for j in sorted(range(len(pool)), key=lambda j: (-mine[j], j)):
        words = _idea(pool[j].text)
        if not words & used:
            taken.append(pool[j])
            used |= words
        if len(taken) >= limit:
            break
    return taken


def _measure_talk(live: dict[int, ClusterPhrases], pools: dict[int, list[Keyphrase]], slot: dict[int, int],
                  centres: np.ndarray, vectors: "_Vectors") -> None:
    """Every single, pair and triple of each cluster's talk ``pools`` embedded, for
    ``ClusterPhrases.talk`` only: the clusters' labels and candidates are left as they were."""
    kept = {c: (live[c].head, live[c].candidates) for c in pools}
    n = max((len(p) for p in pools.values()), default=0)
    _choose(live, pools, slot, centres, vectors, shortlist=n, tries=len(_combos(n)), talk=True)
    for c, (head, candidates) in kept.items():
        live[c].head, live[c].candidates = head, candidates


def _small_talk(live: dict[int, ClusterPhrases], got: dict[int, float], unsettled: list[int], top: int,
                slot: dict[int, int], centres: np.ndarray, vectors: "_Vectors") -> None:
    """Name small talk the ``unsettled`` clusters (no topic label points at them) whose label
    holds no topic phrase, or whose talk (common words, clause openings: "Thanks for the
    support", "Go Jon", alone or combined) points at them better than any label of topic
    phrases does: their members talk ("thanks", "help", "see you") more than they say what
    about, and a member's stray noun would name a neighbour's topic."""
    talk = {c: [k.text for k in _talk_phrases(live[c], top)] for c in unsettled}
    for c, mine in _cluster_margins(talk, slot, centres, vectors).items():
        live[c].talk = max(live[c].talk, max(mine))
    for c in unsettled:
        ph = live[c]
        if not _topical(ph) or ph.talk > 0 or ph.talk > got[c]:
            ph.neutral, ph.head = NEUTRAL_SMALL_TALK, None


def _idea(text: str) -> set[str]:
    """The words that make a phrase's idea ("virtual support group": virtual, support, group):
    two phrases sharing one say the same thing twice in a label."""
    return _idea_words(text.casefold())


def _wide_pools(found: dict[int, ClusterPhrases], slot: dict[int, int], centres: np.ndarray,
                vectors: "_Vectors") -> dict[int, list[Keyphrase]]:
    """Per cluster: every topic phrase of its members (``every_phrase``, at most
    ``WIDE_PHRASES``), embedded in one batch for all clusters, ordered by margin, one per idea
    (a phrase sharing a word with a better one is dropped), the best ``WIDE_SHORTLIST``."""
    every = {c: ph.every_phrase(WIDE_PHRASES) for c, ph in found.items()}
    got = _cluster_margins({c: [k.text for k in pool] for c, pool in every.items()}, slot, centres, vectors)
    return {c: _best_per_idea(every[c], mine, WIDE_SHORTLIST) for c, mine in got.items()}


def _look_again(live: dict[int, ClusterPhrases], got: dict[int, float], pools: dict[int, list[Keyphrase]],
                slot: dict[int, int], centres: np.ndarray, vectors: _Vectors, shortlist: int, tries: int) -> None:
    """``_choose`` among wider ``pools``, keeping each cluster's earlier label (head, candidate
    order and margin in ``got``) where the new best is no better: a later look embeds other
    combinations, and its best can be worse."""
    before = {c: (live[c].head, live[c].candidates, _topical(live[c])) for c in pools}
    for c, margin in _choose(live, pools, slot, centres, vectors, shortlist=shortlist, tries=tries).items():
        if (_topical(live[c]), margin) > (before[c][2], got[c]):
            got[c] = margin
        else:
            live[c].head, live[c].candidates = before[c][:2]
