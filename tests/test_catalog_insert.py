"""Catalog.insert_memories writes a batch column holding one plain value as a literal in the
statement and the rest as one JSON document SQLite unpacks (or, without JSON support or with
a NUL in a text, bound row by row): every kind of batch (uniform or mixed, plain or with
quotes, unicode, NULs, text that reads as JSON, metadata, keys, ids and rows in any order)
reads back exactly as written, by either path."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clag_fast import MemoryStore, StoreConfig
from clag_fast.store import catalog as catalog_mod
from clag_fast.store.catalog import Catalog, _batch_literal


@pytest.mark.parametrize("values, literal", [
    (["user_input"] * 3, "'user_input'"),
    ([None, None], "NULL"),
    (["a", "b"], None),                    # mixed: bound per row
    (["o'brien"] * 2, None),               # a quote: never a literal
    (["ns é"] * 2, None),                  # outside the plain set
    (["x" * 65] * 2, None),                # too long
    (['{"a": 1}'] * 2, None),              # metadata JSON
    ([None, "k"], None),
])
def test_batch_literal(values, literal):
    assert _batch_literal(values) == literal


@pytest.mark.parametrize("namespaces, kinds, metadata, keys", [
    ("default", "user_input", None, None),
    ("o'brien); DROP TABLE memories; --", "tool'result", [{"q": "it's"}] * 3, None),
    (["a", "b", "a"], ["k1", "k2", "k1"], [None, {"x": 1}, None], ["one", None, "three"]),
    ("user:alice@example.org/1", "reflection", [{"x": 1}] * 3, ["a'1", "b", "c"]),
])
def test_every_batch_reads_back_as_written(tmp_path, namespaces, kinds, metadata, keys):
    vecs = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    texts = ["first", "sécond 'quoted'", "third"]
    with MemoryStore.open(tmp_path / "s", config=StoreConfig(dim=8), embedder=False, slm=False) as s:
        ids = s.add_many(texts, embeddings=vecs, namespaces=namespaces, kinds=kinds, metadata=metadata, keys=keys)
        got = s.get_many(ids)
    ns = [namespaces] * 3 if isinstance(namespaces, str) else namespaces
    kd = [kinds] * 3 if isinstance(kinds, str) else kinds
    assert [m.text for m in got] == texts
    assert [m.namespace for m in got] == ns
    assert [m.kind for m in got] == kd
    assert [m.metadata for m in got] == (metadata or [None] * 3)
    assert [m.key for m in got] == (keys or [None] * 3)


ODD_TEXTS = ["null", "123", '{"a": [1, 2]}', "[1]", "back\\slash \"quote\" 'single'", "line\nsep\u2028tab\t",
             "emoji \U0001F389 and \U0001D11E", "", "\x01\x7f control"]


def _read(cat: Catalog) -> list[tuple]:
    return cat.db.execute("SELECT id, text, kind, namespace, metadata, key, created_at, vector_row, state "
                          "FROM memories ORDER BY id").fetchall()


COUNTING = (list(range(1, 10)), list(range(0, 9)))  # an ordinary batch: ids and rows count up
UNIFORM = (["user_input"] * 9, ["default"] * 9, [None] * 9, None)  # only the text varies
MIXED = (["a", "b"] * 4 + ["a"], ["ns"] * 9, [None, '{"k": "v"}'] * 4 + [None],
         [f"key'{i}" if i % 3 else None for i in range(9)])


needs_json = pytest.mark.skipif(not catalog_mod._JSON_EACH, reason="this SQLite has no JSON functions")


def _statements(cat: Catalog) -> list[str]:
    seen: list[str] = []
    cat.db.set_trace_callback(seen.append)
    return seen


@pytest.mark.parametrize("json_each", [pytest.param(True, marks=needs_json), False])
@pytest.mark.parametrize("ids, rows", [
    COUNTING,
    ([3, 9, 4, 100, 5, 6, 7, 8, 2], list(range(9))),  # ids in any order
    (list(range(1, 10)), [8, 0, 7, 1, 6, 2, 5, 3, 4]),  # rows in any order
    (np.arange(11, 20), np.arange(40, 49)),            # numpy integers
    (range(21, 30), np.arange(50, 59)),                # add_many's shape: a range of fresh ids
])
@pytest.mark.parametrize("others", [UNIFORM, MIXED], ids=["uniform", "mixed"])
@pytest.mark.parametrize("texts", [ODD_TEXTS, ["with a NUL \x00 inside"] + ODD_TEXTS[1:]], ids=["odd", "nul"])
def test_insert_reads_back_by_either_path(tmp_path, monkeypatch, json_each, ids, rows, others, texts):
    monkeypatch.setattr(catalog_mod, "_JSON_EACH", json_each)
    kinds, namespaces, meta, keys = others
    cat = Catalog(tmp_path / "m.db")
    try:
        seen = _statements(cat)
        with cat.transaction():
            cat.insert_memories(ids, texts, kinds, namespaces, meta, 12.5, rows, keys)
        # The JSON document is used exactly where it can be: JSON on, only the text varying,
        # ids and rows counting up, no NUL.
        counting = all(bool(np.all(np.diff(np.asarray(v)) == 1)) for v in (ids, rows))
        expected = json_each and others is UNIFORM and counting and "\x00" not in "".join(texts)
        assert any("json_each" in q for q in seen) == expected
        want = sorted(zip([int(i) for i in ids], texts, kinds, namespaces, meta, keys or [None] * 9, [12.5] * 9,
                          [int(r) for r in rows], [0] * 9))
        assert _read(cat) == want
    finally:
        cat.close()


def _columns(ids, texts, others, rows):
    kinds, namespaces, meta, keys = others
    return {"id": ids, "text": texts, "kind": kinds, "namespace": namespaces, "metadata": meta,
            "key": keys or [None] * len(ids), "vector_row": rows}


@needs_json
def test_only_a_batch_whose_text_alone_varies_goes_through_json():
    """The JSON document carries the texts of an ordinary batch; anything else is bound."""
    def packed(ids, texts, others, rows):
        cols = _columns(ids, texts, others, rows)
        return catalog_mod._json_rows(cols, catalog_mod._literals(cols))

    got = packed(*COUNTING[:1], ODD_TEXTS, UNIFORM, COUNTING[1])
    assert got is not None
    doc, exprs = got
    assert json.loads(doc) == ODD_TEXTS
    assert exprs == {"text": "value", "id": "1 + key", "vector_row": "0 + key"}
    assert packed(COUNTING[0], ODD_TEXTS, MIXED, COUNTING[1]) is None           # metadata varies
    assert packed([1, 3, 2, 4, 5, 6, 7, 8, 9], ODD_TEXTS, UNIFORM, COUNTING[1]) is None  # ids out of order
    assert packed(COUNTING[0], ["a\x00"] + ODD_TEXTS[1:], UNIFORM, COUNTING[1]) is None  # a NUL
    assert packed(COUNTING[0], ODD_TEXTS, UNIFORM, [0, 1, 2, 3, 4, 5, 6, 8, 7]) is None  # rows out of order
    assert packed([5], ["one"], ([UNIFORM[0][0]], ["default"], [None], None), [3]) is not None  # one row


def test_a_document_over_the_limit_is_bound_instead(tmp_path, monkeypatch):
    monkeypatch.setattr(catalog_mod, "_JSON_MAX", 100)
    cat = Catalog(tmp_path / "m.db")
    try:
        seen = _statements(cat)
        texts = [f"text number {i} " * 3 for i in range(9)]
        with cat.transaction():
            cat.insert_memories(*COUNTING[:1], texts, *UNIFORM[:3], 1.0, COUNTING[1])
        assert not any("json_each" in q for q in seen)
        assert [r[1] for r in _read(cat)] == texts
    finally:
        cat.close()


def test_both_paths_write_the_same_rows(tmp_path, monkeypatch):
    batches = {}
    for json_each in (True, False):
        monkeypatch.setattr(catalog_mod, "_JSON_EACH", json_each)
        cat = Catalog(tmp_path / f"{json_each}.db")
        try:
            with cat.transaction():
                cat.insert_memories(list(range(1, 6)), [f"t{i}" for i in range(5)], ["user_input"] * 5,
                                    ["default"] * 5, [None] * 5, 3.0, list(range(5)))
                cat.insert_memories([9, 7], ["x", "y"], ["k", "k"], ["a", "b"], ['{"a":1}', None], 4.0, [6, 5], ["p", None])
            batches[json_each] = _read(cat)
        finally:
            cat.close()
    assert batches[True] == batches[False]
    assert len(batches[True]) == 7


@pytest.mark.parametrize("json_each", [pytest.param(True, marks=needs_json), False])
@pytest.mark.parametrize("conversation, via_json", [
    ({"thread": ["trip"] * 9, "speaker": ["User"] * 9}, True),      # one thread and speaker: literals
    ({"thread": ["session 1"] * 9}, False),                         # a space: bound
    ({"thread": [f"t{i % 2}" for i in range(9)], "turn": [float(i) for i in range(9)],
      "speaker": ["Ann", None, "Bob"] * 3}, False),
    ({}, True),
])
def test_conversation_columns_read_back_by_either_path(tmp_path, monkeypatch, json_each, conversation, via_json):
    monkeypatch.setattr(catalog_mod, "_JSON_EACH", json_each)
    cat = Catalog(tmp_path / "m.db")
    try:
        seen = _statements(cat)
        with cat.transaction():
            cat.insert_memories(*COUNTING[:1], ODD_TEXTS, *UNIFORM[:3], 12.5, COUNTING[1], None, conversation)
        assert any("json_each" in q for q in seen) == (json_each and via_json)
        got = cat.db.execute("SELECT thread, turn, speaker, superseded_by FROM memories ORDER BY id").fetchall()
        assert got == list(zip(conversation.get("thread", [None] * 9), conversation.get("turn", [None] * 9),
                               conversation.get("speaker", [None] * 9), [None] * 9))
    finally:
        cat.close()
