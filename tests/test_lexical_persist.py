"""index/lexical.bin: saved at flush and close, loaded on open and brought up to date from the
database (adds after the watermark indexed, rows that died leave the statistics), rebuilt with
a warning (never an error) when missing, damaged or inconsistent; read-only opens never write
it. Every check compares the reopened index with one rebuilt from the database alone."""

from __future__ import annotations

import logging
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from clag_fast.config import StoreConfig
from clag_fast.eval.runner import HashingEmbedder
from clag_fast.store import MemoryStore
from clag_fast.store.lexical import LexicalIndex
from clag_fast.store.recovery import lexical_path
from store_helpers import run_until_killed

CFG = StoreConfig(slm="off", cache_size=0, min_memories_to_cluster=20)
VOCAB = "river mountain piano guitar garden kitchen novel poem train harbour violin desert".split()
QUERIES = ["river piano", "garden poem tag7", "violin desert harbour", "tag3 kitchen", "unseenword"]


def _store(path: Path, read_only: bool = False) -> MemoryStore:
    return MemoryStore.open(path, config=CFG, embedder=HashingEmbedder(), slm=False, read_only=read_only)


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(VOCAB, int(rng.integers(2, 8)))) + f" tag{i}" for i in range(n)]


def _lexical(store: MemoryStore) -> LexicalIndex:
    return store._searcher.lexical  # noqa: SLF001 -- the index under test


def _answers(lex: LexicalIndex, namespaces=(None, "a", "b")) -> list:
    """Top rows and scores of every query in every namespace, plus the statistics."""
    out = []
    for ns in namespaces:
        out.append(lex._native.stats(ns))  # noqa: SLF001
        for q in QUERIES:
            m = lex.score(q, ns, None, 20, np.arange(5, dtype=np.int64))
            out.append((q, ns, m.rows.tolist(), m.scores.tolist(), m.looked.tolist(), m.terms))
    return out


def _rebuilt_answers(path: Path) -> list:
    """The answers of an index rebuilt from the database alone (the file moved aside)."""
    f = lexical_path(path)
    aside = f.with_name("aside.bin")
    if f.exists():
        f.rename(aside)
    try:
        s = _store(path, read_only=True)
        try:
            return _answers(_lexical(s))
        finally:
            s.close()
    finally:
        if aside.exists():
            aside.rename(f)


def _fill(path: Path) -> tuple[MemoryStore, list[int]]:
    s = _store(path)
    ids = s.add_many(_texts(120), namespaces=["a"] * 60 + ["b"] * 60)
    return s, ids


def test_saved_at_close_and_loaded_without_reading_texts(tmp_path, monkeypatch, caplog):
    path = tmp_path / "s"
    s, ids = _fill(path)
    s.delete(ids[3])
    s.update(ids[70], text="zeppelin river")
    before = _answers(_lexical(s))
    s.close()
    assert lexical_path(path).exists()
    from clag_fast.store.catalog import Catalog

    def no_texts(self):
        raise AssertionError("the whole database was read: the file was not used")

    monkeypatch.setattr(Catalog, "live_texts", no_texts)
    with caplog.at_level(logging.WARNING):
        s = _store(path)
    assert not [r for r in caplog.records if "lexical" in r.getMessage()]
    assert _answers(_lexical(s)) == before
    s.close()
    monkeypatch.undo()
    assert _rebuilt_answers(path) == before


def test_changes_after_the_last_flush_are_replayed(tmp_path):
    path = tmp_path / "s"
    s, ids = _fill(path)
    s.flush()
    saved = lexical_path(path).read_bytes()
    more = s.add_many(_texts(30, seed=1), namespaces="a")
    s.delete(ids[5])
    s.delete_namespace("b")
    s.update(more[0], text="obsidian quokka")
    expected = _answers(_lexical(s))
    s.close()
    lexical_path(path).write_bytes(saved)  # as if the process died after the flush
    s = _store(path)
    assert _answers(_lexical(s)) == expected
    assert s.search("quokka", k=1, mode="flat", lexical_weight=1.0)[0].memory_id == more[0]
    s.close()
    assert _rebuilt_answers(path) == expected


@pytest.mark.parametrize("damage", ["flip_head", "flip_middle", "flip_tail", "truncate", "empty", "garbage"])
def test_damaged_file_is_rebuilt_with_a_warning(tmp_path, caplog, damage):
    path = tmp_path / "s"
    s, _ = _fill(path)
    expected = _answers(_lexical(s))
    s.close()
    f = lexical_path(path)
    data = bytearray(f.read_bytes())
    if damage.startswith("flip"):
        at = {"flip_head": 10, "flip_middle": len(data) // 2, "flip_tail": len(data) - 3}[damage]
        data[at] ^= 0x5A
    elif damage == "truncate":
        data = data[: len(data) // 3]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(os.urandom(len(data)))
    f.write_bytes(bytes(data))
    for read_only in (True, False):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            s = _store(path, read_only=read_only)
        assert any("lexical index is rebuilt" in r.getMessage() for r in caplog.records)
        assert _answers(_lexical(s)) == expected
        s.close()
        if read_only:
            assert f.read_bytes() == bytes(data), "a read-only open wrote the file"
    # the writable close saved a good file again
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        s = _store(path, read_only=True)
    assert not [r for r in caplog.records if "lexical" in r.getMessage()]
    assert _answers(_lexical(s)) == expected
    s.close()


def test_missing_file_is_rebuilt_and_read_only_never_writes(tmp_path, caplog):
    path = tmp_path / "s"
    s, _ = _fill(path)
    expected = _answers(_lexical(s))
    s.close()
    lexical_path(path).unlink()
    with caplog.at_level(logging.WARNING):
        s = _store(path, read_only=True)
    assert any("it is missing" in r.getMessage() for r in caplog.records)
    assert _answers(_lexical(s)) == expected
    s.close()
    assert not lexical_path(path).exists()
    s = _store(path)
    assert _answers(_lexical(s)) == expected
    s.close()
    assert lexical_path(path).exists()


def test_file_covering_rows_the_vectors_lack_is_rebuilt(tmp_path, caplog):
    big, small = tmp_path / "big", tmp_path / "small"
    s, _ = _fill(big)
    s.close()
    s = _store(small)
    s.add_many(_texts(10), namespaces="a")
    expected = _answers(_lexical(s))
    s.close()
    lexical_path(small).write_bytes(lexical_path(big).read_bytes())
    with caplog.at_level(logging.WARNING):
        s = _store(small)
    assert any("vector file holds" in r.getMessage() for r in caplog.records)
    assert _answers(_lexical(s)) == expected
    s.close()


def test_new_store_opens_without_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        s = _store(tmp_path / "s")
        s.close()
        s = _store(tmp_path / "s")
    assert not [r for r in caplog.records if "lexical" in r.getMessage()]
    s.close()


# -- a real SIGKILL after adds and deletes past the last flush ---------------------------------
WRITER = textwrap.dedent(
    """
    import sys
    from clag_fast.config import StoreConfig
    from clag_fast.eval.runner import HashingEmbedder
    from clag_fast.store import MemoryStore

    store = MemoryStore.open({path!r}, config=StoreConfig(slm="off", min_memories_to_cluster=20),
                             embedder=HashingEmbedder(), slm=False)
    ids = store.add_many([f"seed note {{i}} river piano" for i in range(50)], namespaces="a")
    store.flush()
    print("flushed", flush=True)
    i = 0
    while True:
        mid = store.add(f"note uniqueword{{i}} about lexical persistence", namespace="ab"[i % 2])
        if i % 5 == 4:
            store.delete(ids[i // 5 % 50])
            print("deleted", ids[i // 5 % 50], flush=True)
        print(mid, i, flush=True)   # printed only after add (and delete) returned
        i += 1
    """
)


def test_sigkill_after_adds_past_the_last_flush(tmp_path):
    path = tmp_path / "s"
    lines = run_until_killed(WRITER.format(path=str(path)), 80)
    assert lines and lines[0].strip() == "flushed"
    acked = [tuple(map(int, ln.split())) for ln in lines[1:] if ln.strip() and not ln.startswith("deleted")
             and len(ln.split()) == 2]
    deleted = [int(ln.split()[1]) for ln in lines[1:] if ln.startswith("deleted")]
    assert len(acked) >= 40 and deleted
    assert lexical_path(path).exists()
    s = _store(path)
    try:
        for mid, i in acked[-30:]:
            hits = s.search(f"uniqueword{i}", k=1, mode="flat", lexical_weight=1.0,
                            namespace="ab"[i % 2])
            assert hits[0].memory_id == mid
        gone = set(deleted)
        hits = s.search("seed river piano", k=60, mode="flat", lexical_weight=1.0)
        assert not gone & {h.memory_id for h in hits}
        got = _answers(_lexical(s), namespaces=(None, "a", "b"))
    finally:
        s.close()
    assert got == _rebuilt_answers(path)
