"""The lexical index: tokenisation (any script, no operators), BM25 against a numpy
reference, namespace-scoped statistics, deletes/updates/archives, rebuild on open, and crash
safety with a real SIGKILL."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from clag_fast import _clag_fast as native
from clag_fast.config import StoreConfig
from clag_fast.eval.runner import HashingEmbedder
from clag_fast.store import MemoryStore
from clag_fast.store.lexical import LexicalIndex, fuse, tokenize

CFG = StoreConfig(slm="off", cache_size=0, min_memories_to_cluster=20)


def _store(path: Path, **changes) -> MemoryStore:
    return MemoryStore.open(path, config=CFG.replace(**changes), embedder=HashingEmbedder(), llm=False)


# -- tokenisation ---------------------------------------------------------------------------
def test_tokenize_words_lowercase_stopwords():
    assert tokenize("The quick, BROWN fox's den!") == ["quick", "brown", "fox", "den"]


@pytest.mark.parametrize("text, expected", [
    ("Ünïcode STRASSE Straße", ["ünïcode", "strasse", "straße"]),
    ("Ελληνικά κείμενα", ["ελληνικά", "κείμενα"]),
    ("Русский текст", ["русский", "текст"]),
    ("مرحبا بالعالم", ["مرحبا", "بالعالم"]),
    ("हिन्दी पाठ", ["हिन्दी", "पाठ"]),
    ("東京タワー", ["東", "京", "タ", "ワ", "ー"]),
    ("café2024 v1.2", ["café2024", "v1", "2"]),
])
def test_tokenize_any_script(text, expected):
    assert tokenize(text) == expected


@pytest.mark.parametrize("text", ["!!! ???", "🎉🎉", "the", "...", " - * \" ' ", "and or not"])
def test_no_indexable_words(text):
    assert tokenize(text) == []


def test_operators_are_plain_words():
    assert tokenize('"red NEAR blue" AND -green* OR NOT') == ["red", "near", "blue", "green"]


def test_very_long_text_and_token():
    words = tokenize("word " * 200_000 + "x" * 10_000)
    assert len(words) == 200_001 and len(words[-1]) == 40
    lex = native.Lexical()
    lex.add([0, 1], ["word " * 200_000, "other"])  # tf saturates, nothing overflows
    rows, scores, terms, _ = lex.score("word", None, None, *lex.stats())
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
        rows, scores, _, _ = lex.score(q, None, None, *lex.stats())
        ref = _bm25_ref(docs, tokenize(q))
        assert rows.tolist() == np.flatnonzero(ref).tolist()
        np.testing.assert_allclose(scores, ref[rows], rtol=1e-4)


def test_rows_are_append_only():
    lex = LexicalIndex()
    lex.add([0, 5], ["a b", "c d"])
    with pytest.raises(ValueError):
        lex.add([3], ["late"])


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
                             embedder=HashingEmbedder(), llm=False)
    i = 0
    while True:
        mid = store.add(f"note uniqueword{{i}} about lexical crash safety")
        print(mid, i, flush=True)   # printed only after add returned
        i += 1
    """
)


def test_sigkill_keeps_every_returned_add_lexically(tmp_path):
    path = tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-c", WRITER.format(path=str(path))], stdout=subprocess.PIPE,
                            text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while len(lines) < 60 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.join(5)
    acked = [tuple(map(int, ln.split())) for ln in lines if ln.strip()]
    assert len(acked) >= 60
    store = _store(path)
    try:
        for mid, i in acked[-40:]:
            hits = store.search(f"uniqueword{i}", k=1, mode="flat", lexical_weight=1.0)
            assert hits[0].memory_id == mid
    finally:
        store.close()
