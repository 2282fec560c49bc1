"""The lexical index: tokenisation (any script, no operators), BM25 against a numpy
reference, namespace-scoped statistics, deletes/updates/archives, rebuild on open, and crash
safety with a real SIGKILL."""

from __future__ import annotations

import math
import textwrap
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clag_fast import _clag_fast as native
from clag_fast.config import StoreConfig
from clag_fast.eval.runner import HashingEmbedder
from clag_fast.store import MemoryStore
from clag_fast.store.lexical import LexicalIndex, fuse, tokenize
from store_helpers import run_until_killed

CFG = StoreConfig(slm="off", cache_size=0, min_memories_to_cluster=20)


def _store(path: Path, **changes) -> MemoryStore:
    return MemoryStore.open(path, config=CFG.replace(**changes), embedder=HashingEmbedder(), slm=False)


# -- tokenisation ---------------------------------------------------------------------------
def test_tokenize_words_lowercase_stopwords():
    assert tokenize("The quick, BROWN fox's den!") == ["quick", "brown", "fox", "den"]


@pytest.mark.parametrize("text, expected", [
    ("Ünïcode STRASSE Straße", ["ünïcode", "strass", "straße"]),  # ASCII words are stemmed
    ("Ελληνικά κείμενα", ["ελληνικά", "κείμενα"]),
    ("Русский текст", ["русский", "текст"]),
    ("مرحبا بالعالم", ["مرحبا", "بالعالم"]),
    ("हिन्दी पाठ", ["हिन्दी", "पाठ"]),
    ("東京タワー", ["東", "京", "タ", "ワ", "ー"]),
    ("café2024 v1.2", ["café2024", "v1", "2"]),
])
def test_tokenize_any_script(text, expected):
    assert tokenize(text) == expected


def test_english_inflections_meet():
    # plural, -ing, -ed and a silent e reduce to one term; words outside ASCII stay as written
    assert len(set(tokenize("hike hikes hiking hiked"))) == 1
    assert tokenize("parties boxes stopped running glass") == ["party", "box", "stop", "run", "glass"]
    assert tokenize("need speed sing") == ["need", "speed", "sing"]


@pytest.mark.parametrize("text", ["!!! ???", "🎉🎉", "the", "...", " - * \" ' ", "and or not"])
def test_no_indexable_words(text):
    assert tokenize(text) == []


def test_operators_are_plain_words():
    assert tokenize('"red NEAR blue" AND -green* OR NOT') == ["red", "near", "blu", "green"]  # "blue" stemmed


def test_very_long_text_and_token():
    words = tokenize("word " * 200_000 + "x" * 10_000)
    assert len(words) == 200_001 and len(words[-1]) == 40
    lex = native.Lexical()
    lex.add([0, 1], ["word " * 200_000, "other"])  # tf saturates, nothing overflows
    rows, scores, terms, _ = lex.score("word")
    assert rows.tolist() == [0] and terms == 1 and np.isfinite(scores).all()


# -- BM25 against a reference ---------------------------------------------------------------
def _bm25_ref(docs: list[list[str]], query: list[str], k1=1.2, b=0.75) -> np.ndarray:
    n = len(docs)
    avgdl = sum(map(len, docs)) / n
    df = Counter(t for d in docs for t in set(d))
    out = np.zeros(n)
    for i, d in enumerate(docs):
        tf = Counter(d)
        for t in set(query):
            if tf[t]:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                out[i] += idf * tf[t] * (k1 + 1) / (tf[t] + k1 * (1 - b + b * len(d) / avgdl))
    return out


def test_bm25_matches_reference():
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(60)]
    texts = [" ".join(rng.choice(vocab, rng.integers(1, 20))) for _ in range(300)]
    lex = native.Lexical()
    lex.add(list(range(300)), texts)
    docs = [tokenize(t) for t in texts]
    for _ in range(20):
        q = " ".join(rng.choice(vocab, 3))
        rows, scores, _, _ = lex.score(q)
        ref = _bm25_ref(docs, tokenize(q))
        assert rows.tolist() == np.flatnonzero(ref).tolist()
        np.testing.assert_allclose(scores, ref[rows], rtol=1e-4)


def _numpy_bm25(docs: list[list[str]], in_scope: np.ndarray, query: list[str], k1=1.2, b=0.75) -> np.ndarray:
    """BM25 of every document with term statistics over the documents in ``in_scope`` only
    (numpy, float64); 0 outside the scope."""
    vocab = sorted({t for d in docs for t in d} | set(query))
    col = {t: i for i, t in enumerate(vocab)}
    tf = np.zeros((len(docs), len(vocab)))
    for i, d in enumerate(docs):
        for t in d:
            tf[i, col[t]] += 1
    tf[~in_scope] = 0
    n = in_scope.sum()
    if n == 0:
        return np.zeros(len(docs))
    dl = tf.sum(axis=1)
    avgdl = max(dl[in_scope].sum() / n, 1e-6)
    q = [col[t] for t in sorted(set(query))]
    df = (tf[:, q] > 0).sum(axis=0)
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
    t = tf[:, q]
    return (idf * t * (k1 + 1) / (t + k1 * (1 - b + b * dl[:, None] / avgdl))).sum(axis=1)


@st.composite
def _corpus(draw):
    """Documents (Zipf-like words: the min of two draws favours low ids) at increasing rows
    with gaps, each in one of three namespaces, some dead; a few queries."""
    n_vocab = draw(st.integers(2, 40))
    word = st.builds(lambda a, b: f"w{min(a, b)}", st.integers(0, n_vocab - 1), st.integers(0, n_vocab - 1))
    docs = draw(st.lists(st.lists(word, min_size=0, max_size=12), min_size=1, max_size=80))
    gaps = draw(st.lists(st.integers(1, 3), min_size=len(docs), max_size=len(docs)))
    rows = np.cumsum(gaps) - 1
    ns = draw(st.lists(st.sampled_from("abc"), min_size=len(docs), max_size=len(docs)))
    live = np.asarray(draw(st.lists(st.booleans(), min_size=len(docs), max_size=len(docs))))
    queries = draw(st.lists(st.lists(st.one_of(word, st.just("unseen")), min_size=1, max_size=6),
                            min_size=1, max_size=4))
    kind = np.asarray(draw(st.lists(st.booleans(), min_size=len(docs), max_size=len(docs))))
    return docs, rows, ns, live, queries, kind


@given(_corpus(), st.integers(1, 12))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_top_n_is_exact_scoped_bm25(corpus, top_n):
    """MaxScore's top-N and its scores equal a brute-force numpy BM25 over the scope (one
    namespace's live documents, or all live ones), after deletes, with and without a
    narrower eligible mask (a kind filter); and equal the exhaustive scoring bit for bit."""
    docs, rows, ns, live, queries, kind = corpus
    lex = native.Lexical()
    lex.add(rows.tolist(), [" ".join(d) for d in docs], ns)
    n_rows = int(rows[-1]) + 1
    live_rows = np.zeros(n_rows, bool)
    live_rows[rows] = live
    lex.sync(live_rows)
    assert lex.stats() == (int(live.sum()), int(sum(len(d) for d, lv in zip(docs, live) if lv)))
    for query in queries:
        qtext = " ".join(query)
        for scope in (None, "a", "b", "c"):
            in_scope = live & (np.asarray(ns) == scope if scope else True)
            ref = _numpy_bm25(docs, in_scope, query)
            for eligible in (None, kind & in_scope):
                elig_rows = None
                allowed = in_scope if eligible is None else eligible
                if eligible is not None:
                    elig_rows = np.zeros(n_rows, bool)
                    elig_rows[rows] = eligible
                lookup = np.asarray([rows[0], rows[-1], n_rows + 5], np.int64)
                top, scores, looked, terms, _, _ = lex.score_top(qtext, scope, elig_rows, top_n, lookup)
                full_rows, full_scores, _, _ = lex.score(qtext, scope, elig_rows)
                # the exhaustive path, bit for bit
                order = np.lexsort((full_rows, -full_scores))[:top_n]
                assert top.tolist() == full_rows[order].tolist()
                assert scores.tolist() == full_scores[order].tolist()
                # the numpy reference: same matches, same scores, same top scores
                want = np.flatnonzero((ref > 0) & allowed)
                assert sorted(full_rows.tolist()) == rows[want].tolist()
                pos = np.searchsorted(rows, top)
                np.testing.assert_allclose(scores, ref[pos], rtol=1e-4)
                best = np.sort(ref[want])[::-1][:top_n]
                np.testing.assert_allclose(scores, best, rtol=1e-4)
                for r, s in zip(lookup.tolist(), looked.tolist()):
                    i = np.searchsorted(rows, r)
                    exp = ref[i] if i < len(rows) and rows[i] == r and allowed[i] else 0.0
                    assert s == pytest.approx(exp, rel=1e-4, abs=1e-6)
                if not in_scope.any():
                    assert terms == 0 and len(top) == 0


def test_rows_are_append_only():
    lex = LexicalIndex()
    lex.add([0, 5], ["a b", "c d"], ["default"])
    with pytest.raises(ValueError):
        lex.add([3], ["late"], ["default"])


def test_fuse_methods():
    cos = np.array([0.9, 0.5, 0.1], np.float32)
    bm = np.array([0.0, 2.0, 4.0], np.float32)
    np.testing.assert_allclose(fuse(cos, bm, 0.5), [0.5, 0.5, 0.5])
    assert fuse(cos, bm, 0.0).argmax() == 0 and fuse(cos, bm, 1.0).argmax() == 2
    for m in ("zscore", "bound", "rrf"):
        assert fuse(cos, bm, 0.5, m, 8.0).shape == (3,)
    with pytest.raises(ValueError):
        fuse(cos, bm, 0.5, "nope")


# -- kept with the memories -----------------------------------------------------------------
def _texts(n: int) -> list[str]:
    rng = np.random.default_rng(1)
    vocab = "river mountain piano guitar garden kitchen novel poem train harbour".split()
    return [" ".join(rng.choice(vocab, 5)) + f" tag{i}" for i in range(n)]


def _lexical_ids(store: MemoryStore, word: str, **kw) -> list[int]:
    return [h.memory_id for h in store.search(word, k=10, mode="flat", lexical_weight=1.0, **kw)
            if word in h.text.lower().split()]


def test_add_update_delete_namespaces_archive(tmp_path):
    store = _store(tmp_path / "s")
    ids = store.add_many(_texts(60), namespaces=["a"] * 30 + ["b"] * 30)
    mid = store.add("zanzibar quokka", namespace="a")
    assert _lexical_ids(store, "quokka") == [mid]
    assert _lexical_ids(store, "quokka", namespace="b") == []
    store.update(mid, text="platypus")
    assert _lexical_ids(store, "quokka") == [] and _lexical_ids(store, "platypus") == [mid]
    store.delete(mid)
    assert _lexical_ids(store, "platypus") == []
    assert _lexical_ids(store, "tag40") == [ids[40]]
    assert store.delete_namespace("b") == 30
    assert _lexical_ids(store, "tag40") == []
    store.close()
    store = _store(tmp_path / "s")
    assert _lexical_ids(store, "tag3") == [ids[3]] and _lexical_ids(store, "tag40") == []
    assert _lexical_ids(store, "platypus") == []
    store.close()


def test_forgotten_memories_leave_the_index(tmp_path):
    from clag_fast.decay import ForgettingPolicy

    store = _store(tmp_path / "s", forgetting=ForgettingPolicy(half_life_days=1.0, prune_below=0.5,
                                                                prune_action="archive"))
    old = store.add("ancient obsidian relic")
    store.forget(now=time.time() + 30 * 86400)
    assert store.get(old).archived
    assert _lexical_ids(store, "obsidian") == []


def test_compaction_after_many_deletes(tmp_path):
    store = _store(tmp_path / "s")
    ids = store.add_many(_texts(200))
    for m in ids[:150]:
        store.delete(m)
    store._searcher.lexical.compact(np.zeros(0, bool))  # noqa: SLF001 -- nothing live: all postings go
    assert store._searcher.lexical.sizes()[1] == 0  # noqa: SLF001
    store.close()
    store = _store(tmp_path / "s")
    assert _lexical_ids(store, "tag170") == [ids[170]]
    store.close()


# -- crash safety ----------------------------------------------------------------------------
WRITER = textwrap.dedent(
    """
    import sys
    from clag_fast.config import StoreConfig
    from clag_fast.eval.runner import HashingEmbedder
    from clag_fast.store import MemoryStore

    store = MemoryStore.open({path!r}, config=StoreConfig(slm="off", min_memories_to_cluster=20),
                             embedder=HashingEmbedder(), slm=False)
    i = 0
    while True:
        mid = store.add(f"note uniqueword{{i}} about lexical crash safety")
        print(mid, i, flush=True)   # printed only after add returned
        i += 1
    """
)


def test_sigkill_keeps_every_returned_add_lexically(tmp_path):
    path = tmp_path / "s"
    lines = run_until_killed(WRITER.format(path=str(path)), 60)
    acked = [tuple(map(int, ln.split())) for ln in lines if ln.strip()]
    assert len(acked) >= 60
    store = _store(path)
    try:
        for mid, i in acked[-40:]:
            hits = store.search(f"uniqueword{i}", k=1, mode="flat", lexical_weight=1.0)
            assert hits[0].memory_id == mid
    finally:
        store.close()
