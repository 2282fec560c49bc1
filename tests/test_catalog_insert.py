"""Catalog.insert_memories writes a batch column holding one plain value as a literal in the
statement: every kind of batch (uniform or mixed, plain or with quotes, NUL-free unicode,
metadata, keys) reads back exactly as written."""

from __future__ import annotations

import numpy as np
import pytest

from clag_fast import MemoryStore, StoreConfig
from clag_fast.store.catalog import _batch_literal


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
    with MemoryStore.open(tmp_path / "s", config=StoreConfig(dim=8), embedder=False, llm=False) as s:
        ids = s.add_many(texts, embeddings=vecs, namespaces=namespaces, kinds=kinds, metadata=metadata, keys=keys)
        got = s.get_many(ids)
    ns = [namespaces] * 3 if isinstance(namespaces, str) else namespaces
    kd = [kinds] * 3 if isinstance(kinds, str) else kinds
    assert [m.text for m in got] == texts
    assert [m.namespace for m in got] == ns
    assert [m.kind for m in got] == kd
    assert [m.metadata for m in got] == (metadata or [None] * 3)
    assert [m.key for m in got] == (keys or [None] * 3)
