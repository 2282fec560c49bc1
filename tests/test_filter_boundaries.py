"""Every ``where=`` operator at its boundaries, with the exact memories each must match: the
value itself (``$gte`` holds there, ``$gt`` does not), its neighbours, another type holding
the same "value" (``"2"``, ``True``), null, a missing field, no metadata at all, and a list.
Checked through listing, flat and two-stage search, ``search_many`` and hybrid text search,
so an operator read as its neighbour fails whichever path it breaks."""

from __future__ import annotations

import numpy as np
import pytest

from clag_fast import FilterError, MemoryStore, StoreConfig
from clag_fast.eval.embedders import HashingEmbedder
from clag_fast.store import filters as filters_mod

# name -> metadata; the names are the memories' keys.
ROWS = {
    "n1": {"n": 1, "s": "a"},
    "n1.5": {"n": 1.5, "s": "ab"},
    "n2": {"n": 2, "s": "b"},
    "n2.0": {"n": 2.0, "s": "B"},  # "B" sorts before "a" (code points)
    "n3": {"n": 3, "s": "c"},
    "neg": {"n": -2, "s": ""},
    "str2": {"n": "2", "s": 2},  # the types swapped
    "true": {"n": True, "s": True},
    "false": {"n": False, "s": False},
    "null": {"n": None, "s": None},
    "list": {"n": [2], "s": ["b"]},
    "missing": {"other": 2},
    "nometa": None,
}
EVERY = set(ROWS)
NUMBERS = {"n1", "n1.5", "n2", "n2.0", "n3", "neg"}

CASES = [
    # $eq (and the bare value): numbers equal across int and float, never across types
    ({"n": 2}, {"n2", "n2.0"}),
    ({"n": {"$eq": 2.0}}, {"n2", "n2.0"}),
    ({"n": {"$eq": 1}}, {"n1"}),
    ({"n": True}, {"true"}),
    ({"n": {"$eq": False}}, {"false"}),
    ({"n": {"$eq": "2"}}, {"str2"}),
    ({"n": None}, {"null"}),
    ({"n": {"$eq": 4}}, set()),
    # $ne: everything else, a missing field and no metadata included
    ({"n": {"$ne": 2}}, EVERY - {"n2", "n2.0"}),
    ({"n": {"$ne": None}}, EVERY - {"null"}),
    ({"n": {"$ne": True}}, EVERY - {"true"}),
    # ranges on numbers: at, just below and just above the boundary
    ({"n": {"$gt": 2}}, {"n3"}),
    ({"n": {"$gte": 2}}, {"n2", "n2.0", "n3"}),
    ({"n": {"$lt": 2}}, {"n1", "n1.5", "neg"}),
    ({"n": {"$lte": 2}}, {"n1", "n1.5", "n2", "n2.0", "neg"}),
    ({"n": {"$gt": 1.5}}, {"n2", "n2.0", "n3"}),
    ({"n": {"$gte": 1.5}}, {"n1.5", "n2", "n2.0", "n3"}),
    ({"n": {"$lt": 1.5}}, {"n1", "neg"}),
    ({"n": {"$lte": 1.5}}, {"n1", "n1.5", "neg"}),
    ({"n": {"$gt": 3}}, set()),
    ({"n": {"$gte": 3}}, {"n3"}),
    ({"n": {"$lt": -2}}, set()),
    ({"n": {"$lte": -2}}, {"neg"}),
    ({"n": {"$gte": -1e300}}, NUMBERS),
    # ranges on strings (code-point order); a number never compares with a string
    ({"s": {"$gt": "b"}}, {"n3"}),
    ({"s": {"$gte": "b"}}, {"n2", "n3"}),
    ({"s": {"$lt": "b"}}, {"n1", "n1.5", "n2.0", "neg"}),
    ({"s": {"$lte": "b"}}, {"n1", "n1.5", "n2", "n2.0", "neg"}),
    ({"s": {"$gt": "a"}}, {"n1.5", "n2", "n3"}),
    ({"s": {"$gte": "a"}}, {"n1", "n1.5", "n2", "n3"}),
    ({"s": {"$gte": ""}}, {"n1", "n1.5", "n2", "n2.0", "n3", "neg"}),
    ({"s": {"$gt": ""}}, {"n1", "n1.5", "n2", "n2.0", "n3"}),
    ({"n": {"$gt": "1"}}, {"str2"}),
    ({"n": {"$gte": "2"}}, {"str2"}),
    ({"n": {"$gt": "2"}}, set()),
    # $in / $nin
    ({"n": {"$in": [2, 3]}}, {"n2", "n2.0", "n3"}),
    ({"n": {"$in": [1.5]}}, {"n1.5"}),
    ({"n": {"$in": ["2", None]}}, {"str2", "null"}),
    ({"n": {"$in": [True]}}, {"true"}),
    ({"n": {"$in": [1]}}, {"n1"}),
    ({"n": {"$in": []}}, set()),
    ({"n": {"$nin": [2, 3]}}, EVERY - {"n2", "n2.0", "n3"}),
    ({"n": {"$nin": [None, False]}}, EVERY - {"null", "false"}),
    ({"n": {"$nin": []}}, EVERY),
    # several operators on one field, several fields, $and / $or
    ({"n": {"$gte": 2, "$lte": 2}}, {"n2", "n2.0"}),
    ({"n": {"$gt": 1, "$lt": 3}}, {"n1.5", "n2", "n2.0"}),
    ({"n": {"$gte": 1, "$ne": 2}}, {"n1", "n1.5", "n3"}),
    ({"n": {"$lte": 2}, "s": {"$gte": "b"}}, {"n2"}),
    ({"$or": [{"n": {"$lt": 1.5}}, {"n": {"$gte": 3}}]}, {"n1", "neg", "n3"}),
    ({"$and": [{"n": {"$gte": 1}}, {"s": {"$lte": "b"}}]}, {"n1", "n1.5", "n2", "n2.0"}),
    ({"$or": [{"n": None}, {"other": {"$gte": 2}}]}, {"null", "missing"}),
    ({}, EVERY),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    cfg = StoreConfig(min_memories_to_cluster=20, organize_every=0, slm="off", cache_size=0)
    s = MemoryStore.open(tmp_path_factory.mktemp("b") / "s", config=cfg, embedder=HashingEmbedder(), slm=False)
    names = list(ROWS)
    # Each row three times, so the store is clustered; the key names the row and its copy.
    texts = [f"boundary note {name} copy {c}" for c in range(3) for name in names]
    keys = [f"{name}#{c}" for c in range(3) for name in names]
    s.add_many(texts, metadata=[ROWS[name] for c in range(3) for name in names], keys=keys)
    s.organize()
    assert len(s.clusters()) > 1
    yield s
    s.close()


def names(found) -> set[str]:
    return {x.key.split("#")[0] for x in found}


@pytest.mark.parametrize("where, expected", CASES, ids=[str(w) for w, _ in CASES])
def test_each_operator_at_its_boundary(store, where, expected):
    copies = 3 * len(expected)
    page = store.memories(where=where, limit=1000)
    assert names(page.items) == expected and len(page.items) == copies
    qvec = HashingEmbedder().encode(["boundary note n2 copy 0"])[0]
    for mode in ("flat", "two_stage"):
        hits = store.search(qvec, k=100, mode=mode, where=where)
        assert names(hits) == expected and len(hits) == copies
        assert hits.candidates == copies
        hits = store.search("boundary note n2", k=100, mode=mode, where=where)  # hybrid
        assert names(hits) == expected and len(hits) == copies
        for hits in store.search_many(np.stack([qvec, qvec[::-1]]), k=100, mode=mode, where=where):
            assert names(hits) == expected and len(hits) == copies
        for hits in store.search_many(["boundary note n1", "copy 2"], k=2, mode=mode, where=where):
            assert names(hits) <= expected and len(hits) == min(2, copies)
        hits = store.search(qvec, k=2, mode=mode, where=where)
        assert names(hits) <= expected and len(hits) == min(2, copies)


def test_the_mask_itself_at_the_boundaries(store):
    """The compiled mask, row by row, against the expected rows (the layer under every path)."""
    state = store._state
    with state.lock.read():
        n = state.rows.n
        key_of = {m.memory_id: m.key for m in store.memories(limit=1000).items}
        row_key = [key_of.get(int(mid)) for mid in state.rows.memory_id[:n].tolist()]
        for where, expected in CASES:
            node = filters_mod.parse(where)
            if node is None:
                continue
            table = state.field_table(filters_mod.fields_of(node))
            mask = filters_mod.mask(node, table, n)
            got = {row_key[r].split("#")[0] for r in np.flatnonzero(mask) if row_key[r] is not None}
            assert got == expected, where


@pytest.mark.parametrize("where", [
    {"n": {"$exists": True}},  # not in the grammar: refused by name, never read as something else
    {"n": {"$gte": [1, 2]}},
    {"n": {"$in": 2}},
    {"n": {"$gt": None}},
    {"n": {"$lt": True}},
    {"n": {"$gte": float("nan")}},
])
def test_operators_outside_the_grammar_are_refused(store, where):
    with pytest.raises(FilterError):
        store.search(HashingEmbedder().encode(["x"])[0], k=3, where=where)
    with pytest.raises(FilterError):
        store.memories(where=where)
