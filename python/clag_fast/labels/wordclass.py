"""Which words name a topic: how frequent a word is in general English, and whether it can be a
noun.

A label should say what a cluster is about ("vegetarian kaiseki", "JR Pass", "passport
renewal"), not how its members talk ("bring · tonight", "Perfect · card", "Ready"). Two signals
tell the kinds apart without a model:

* **frequency**: a word among the ``COMMON_WORDS`` most frequent words of general English
  (``wordfreq``'s English list: subtitles, web text, books, news) says little about any one
  topic ("work", "plan", "food", "morning");
* **part of speech**: closed-class words (pronouns, determiners, prepositions, auxiliaries),
  chat words (greetings, thanks, interjections) and time words (weekdays, months, "tonight")
  are never the head of a noun phrase; nor is a word that English uses only as a verb,
  adjective or adverb ("confirm", "renew", "remotely": ``lemminflect``'s lexicon of 80k word
  forms with their parts of speech). Gerunds ("camping"), names and words outside the lexicon
  may be (there, adverbs in -ly and participles in -ed are told by their ending).

A word is **specific** when it may be a noun and is not common, or when it is a code written
with letters and digits ("HK-220931", "AC1"); a number alone is not. Pure functions of a word,
memoised. The word list and the lexicon are read once per process, on first use: from a
compact copy in the cache directory (``$CLAG_FAST_CACHE`` or ``~/.cache/clag_fast``, about 30 ms),
which the first process builds from the two packages (about 0.4 s with their imports, a cost
that otherwise fell on the first labels of every process: BENCHMARKS.md, "Labelling inside
add_many").
"""

from __future__ import annotations

import functools
import logging
import marshal
import os
import sys
import threading
from pathlib import Path

__all__ = ["COMMON_WORDS", "english_rank", "is_common", "noun_like", "opens_noun_phrase", "specific_word",
           "singular", "function_word", "FUNCTION_WORDS", "CHAT_WORDS", "TIME_WORDS"]

#: A word among this many most frequent English words is common: it names no topic on its own.
#: At 1,000 the list holds "work", "plan", "food", "card", "morning", "music" and stops before
#: "hotel" (1,190), "weather" (1,442) and "budget" (1,592).
COMMON_WORDS = 1000
# The rank of a word beyond this is not needed: only "among the first COMMON_WORDS" is asked,
# and a caller may ask for a stricter cut up to here.
_RANKED = 5000

# Closed-class words: never the head of a noun phrase.
FUNCTION_WORDS = frozenset(
    "a an the this that these those my your his her its our their me him us them i you he she "
    "it we they myself yourself himself herself itself ourselves themselves mine yours hers ours "
    "theirs who whom whose which what whatever whoever when where why how there here "
    "and or but nor so yet if then than as because since unless until while though although "
    "whether of in on at to for from by with without about above below under over into onto "
    "upon out off up down through across along around behind beside besides between beyond "
    "during except inside outside near past per via toward towards against among amid "
    "be am is are was were been being have has had having do does did done doing "
    "will would shall should can could may might must ought not no nor none "
    "all any both each either every few many much more most other others some such several "
    "another own same one ones anybody anyone anything everybody everyone everything nobody "
    "nothing somebody someone something "
    "i'm i've i'd i'll you're you've you'd you'll he's she's it's we're we've we'd we'll "
    "they're they've they'd they'll that's there's here's what's who's let's don't doesn't "
    "didn't won't wouldn't can't cannot couldn't shouldn't isn't aren't wasn't weren't haven't "
    "hasn't hadn't mustn't".split()
)

# How people talk rather than what about: greetings, thanks, agreement, interjections, praise.
CHAT_WORDS = frozenset(
    "yes yeah yep yup no nope nah ok okay alright oh ooh oof ow hey hi hello hiya bye goodbye "
    "wow lol haha hah hmm um uh ah aha ugh yay omg gosh geez whoa woah oops phew huh meh yikes "
    "hooray bravo thanks thank thankful cheers congrats congratulations sorry please welcome "
    "sure awesome cool great nice perfect fine wonderful fantastic amazing lovely excellent "
    "brilliant sweet glad happy excited exciting fun funny tough hard easy ready true right "
    "totally definitely absolutely really actually basically seriously honestly literally "
    "anyway anyways btw ikr imo tbh".split()
)

# When, not what about: a label of dates says when its members happened, not their topic.
TIME_WORDS = frozenset(
    "monday tuesday wednesday thursday friday saturday sunday weekday weekdays weekend weekends "
    "january february march april may june july august september october november december "
    "today tonight tomorrow yesterday morning mornings afternoon afternoons evening evenings "
    "night nights midnight noon day days week weeks month months year years hour hours minute "
    "minutes moment soon later lately recently earlier now then overnight beforehand "
    "afterwards meanwhile nowadays someday sometime sometimes always never often ever".split()
)

# Words ending in -ly that are nouns (the rest are adverbs or adjectives: "remotely", "lovely").
_LY_NOUNS = frozenset(
    "family italy july supply reply assembly rally belly jelly ally bully lily holly emily kelly "
    "sally molly polly billy dolly anomaly monopoly melancholy butterfly dragonfly firefly folly "
    "gully homily panoply fly ply shelly beverly kimberly natalie".split()
)
# Words ending in -ed that are nouns or names (the rest are participles: "committed", "covered").
_ED_NOUNS = frozenset(
    "hundred kindred hatred sled shred seabed hotbed flatbed sickbed deathbed bobsled infrared "
    "alfred ahmed mohammed mohamed jared winifred mildred fred ted ned".split()
)

_lock = threading.Lock()
# word -> (the parts of speech it may be, its first noun lemma or None), and the English ranks.
_lexicon: dict[str, frozenset[str]] | None = None
_nouns: dict[str, str] = {}  # a noun whose first lemma is another word ("hotels") -> that lemma
_ranks: dict[str, int] | None = None
# Parts of speech a noun phrase may start with (an adjective, a noun, a number, a name).
_NOUN_PHRASE_START = frozenset({"NOUN", "PROPN", "ADJ", "NUM"})
# Bump when what the cached copy holds changes.
_CACHE_FORMAT = "3"
log = logging.getLogger(__name__)


# The package files the copy is made from: it is keyed by their sizes and times, so a new
# version of either package makes a new copy.
_SOURCES = (("wordfreq", "data/small_en.msgpack.gz"), ("lemminflect", "resources/lemma_lu.csv.gz"),
            ("lemminflect", "resources/lemma_overrides.csv"))

# The copy as stored: the ranked words, then per set of parts of speech ("NOUN,VERB") its words,
# then the nouns whose first lemma differs and those lemmas; each list one string, words one a
# line. Splitting a few strings and filling a dict per set reads it in a few milliseconds where
# unmarshalling a dict of 64k tuples took 25-50.
Stored = tuple[str, dict[str, str], str, str]


def _cache_file() -> Path | None:
    """The cached copy for the installed packages and this Python (``marshal``'s format is
    Python's own), or None when a source file is not where it is looked for (then nothing is
    cached). The packages are found without importing them (their imports take most of the
    build's time)."""
    import hashlib
    import importlib.util

    from clag_fast.embed.modelfiles import cache_dir

    key = [_CACHE_FORMAT, sys.version]
    for package, name in _SOURCES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        f = Path(list(spec.submodule_search_locations)[0]) / name
        try:
            st = f.stat()
        except OSError:
            return None
        key += [str(f), str(st.st_size), str(st.st_mtime_ns)]
    return cache_dir() / f"wordclass-{hashlib.sha256(chr(0).join(key).encode()).hexdigest()[:16]}.marshal"


def _build() -> Stored:
    """From the packages: the ``_RANKED`` most frequent English words, and each lower-case word
    of ``lemminflect``'s lexicon (its overrides applied, as ``getAllLemmas`` does) with its
    parts of speech and first noun lemma."""
    try:
        from wordfreq import top_n_list
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ImportError("label specificity needs wordfreq: pip install wordfreq") from e
    try:
        from lemminflect import config as lemminflect_config
        from lemminflect.codecs.LemmaLUCodec import LemmaLUCodec
        from lemminflect.codecs.OverridesCodec import OverridesCodec
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ImportError("label specificity needs lemminflect: pip install lemminflect") from e
    # The small list: every word this module ranks is in it, and it reads in ~20 ms where the
    # large one takes seconds.
    ranked = top_n_list("en", _RANKED, wordlist="small")
    # The two files lemminflect's Lemmatizer reads, through its own codecs.
    table = LemmaLUCodec.load(lemminflect_config.lemma_lu_fn)
    overrides = OverridesCodec.load(lemminflect_config.lemma_overrides_fn)
    by_kind: dict[str, list[str]] = {}
    plurals: list[str] = []
    lemmas: list[str] = []
    # getAllLemmas looks words up lower-cased: capitalised entries are never found.
    for w in sorted(w for w in set(table) | set(overrides) if w == w.lower() and "\n" not in w):
        entry = dict(table.get(w, {}))
        entry.update(overrides.get(w, {}))
        if entry:
            by_kind.setdefault(",".join(sorted(entry)), []).append(w)
            noun = entry.get("NOUN", ())
            if noun and noun[0].lower() != w:
                plurals.append(w)
                lemmas.append(noun[0].lower())
    return ("\n".join(ranked), {k: "\n".join(ws) for k, ws in by_kind.items()}, "\n".join(plurals),
            "\n".join(lemmas))


def _valid(data: object) -> bool:
    return (isinstance(data, tuple) and len(data) == 4 and isinstance(data[0], str) and isinstance(data[1], dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in data[1].items())
            and isinstance(data[2], str) and isinstance(data[3], str)
            and data[2].count("\n") == data[3].count("\n"))


def _read_or_build() -> Stored:
    """The cached copy, or a fresh one (then written to the cache, replaced atomically). A
    cache that cannot be read or written only costs the build."""
    path = _cache_file()
    if path is not None:
        try:
            data = marshal.loads(path.read_bytes())
            if _valid(data):
                return data
            log.debug("%s: not a word-class cache, rebuilt", path)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, EOFError, TypeError) as e:
            log.debug("%s unreadable (%s: %s), rebuilt", path, type(e).__name__, e)
    data = _build()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(marshal.dumps(data))
            os.replace(tmp, path)
        except OSError as e:
            log.debug("word-class cache not written to %s (%s: %s)", path, type(e).__name__, e)
    return data


def _load() -> None:
    global _lexicon, _nouns, _ranks
    if _lexicon is None:
        with _lock:  # once, not by two threads at once
            if _lexicon is None:
                ranked, by_kind, plurals, lemmas = _read_or_build()
                _ranks = {w: i for i, w in enumerate(ranked.split("\n"))}
                _nouns = dict(zip(plurals.split("\n"), lemmas.split("\n"))) if plurals else {}
                words: dict[str, frozenset[str]] = {}
                for kind, ws in by_kind.items():
                    words.update(dict.fromkeys(ws.split("\n"), frozenset(kind.split(","))))
                _lexicon = words


def _english_ranks() -> dict[str, int]:
    """Rank (0 = most frequent) of the ``_RANKED`` most frequent English words."""
    if _ranks is None:
        _load()
    assert _ranks is not None
    return _ranks


def english_rank(word: str) -> int | None:
    """The rank of ``word`` (casefolded) among the most frequent English words, 0 = "the";
    None beyond the first 5,000."""
    return _english_ranks().get(word.casefold())


def _bare(word: str) -> str:
    """``word`` casefolded, a possessive "'s" and curly apostrophes normalised away."""
    w = word.casefold().replace("’", "'")
    return w[:-2] if w.endswith("'s") and len(w) > 3 else w


@functools.lru_cache(maxsize=1 << 16)
def is_common(word: str, n: int = COMMON_WORDS) -> bool:
    """``word`` is among the ``n`` most frequent English words (``n`` at most 5,000)."""
    if n > _RANKED:
        raise ValueError(f"only the first {_RANKED} English words are ranked, not {n}")
    r = _english_ranks().get(_bare(word))
    return r is not None and r < n


def function_word(word: str) -> bool:
    """A closed-class word (pronoun, determiner, preposition, conjunction, auxiliary)."""
    return _bare(word) in FUNCTION_WORDS


_NONE: frozenset[str] = frozenset()


def _classes(word: str) -> frozenset[str]:
    """The parts of speech (Universal POS tags) ``word`` (bare, casefolded) may be in
    ``lemminflect``'s lexicon; empty for a word it does not know (names, foreign words, codes)."""
    if _lexicon is None:
        _load()
    assert _lexicon is not None
    return _lexicon.get(word.lower(), _NONE)


def _noun_lemma(word: str) -> str | None:
    """The first noun lemma of a lower-case ``word`` ("hotels" -> "hotel"); None when the
    lexicon does not know it as a noun."""
    return _nouns.get(word, word) if "NOUN" in _classes(word) else None


@functools.lru_cache(maxsize=1 << 16)
def noun_like(word: str) -> bool:
    """``word`` may head a noun phrase: not a closed-class, chat or time word, and a noun in
    the lexicon (or a gerund: "camping"); a word the lexicon does not know may, unless it ends
    like an adverb (-ly) or a participle (-ed), nouns and names with those endings excepted."""
    w = _bare(word)
    if w in FUNCTION_WORDS or w in CHAT_WORDS or w in TIME_WORDS:
        return False
    if not any(c.isalpha() for c in w):
        return False
    classes = _classes(w)
    if classes:
        return "NOUN" in classes or "PROPN" in classes or w.endswith("ing")
    if len(w) > 4 and w.endswith("ly") and w not in _LY_NOUNS:
        return False
    if len(w) > 4 and w.endswith("ed") and not w.endswith(("eed", "bed")) and w not in _ED_NOUNS:
        return False
    return True


@functools.lru_cache(maxsize=1 << 16)
def singular(word: str) -> str:
    """``word`` casefolded, as a noun in the singular when the lexicon knows it as a plural
    ("hotels" -> "hotel"); otherwise unchanged."""
    w = word.casefold()
    if not w.endswith("s") or not w.isalpha():
        return w
    return _noun_lemma(w) or w


@functools.lru_cache(maxsize=1 << 16)
def opens_noun_phrase(word: str) -> bool:
    """``word`` may open a noun phrase: not a closed-class or chat word, nor a word the lexicon
    knows only as a verb or adverb ("heard tickets", "eaten in normal" open clauses)."""
    w = _bare(word)
    if w in FUNCTION_WORDS or w in CHAT_WORDS:
        return False
    classes = _classes(w)
    return not classes or bool(classes & _NOUN_PHRASE_START) or w.endswith("ing")


@functools.lru_cache(maxsize=1 << 16)
def specific_word(word: str, n: int = COMMON_WORDS) -> bool:
    """``word`` names something in particular: a code of letters and digits, or a word that may
    be a noun and is not among the ``n`` most frequent English words."""
    has_alpha = any(c.isalpha() for c in word)
    if not has_alpha:
        return False
    if any(c.isdigit() for c in word):
        return True
    return noun_like(word) and not is_common(word, n)
