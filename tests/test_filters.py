"""``where=`` metadata filters, checked against a plain-Python evaluation of the same filter
(hypothesis generates the filters and, in the second test, the writes), in flat and two-stage
search, search_many, hybrid search and listing; plus the errors for malformed filters."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clag_fast import FilterError, MemoryStore, StoreConfig
from clag_fast.eval.runner import HashingEmbedder
from clag_fast.store import filters as filters_mod
from store_helpers import topic_vectors

CFG = StoreConfig(min_memories_to_cluster=40, organize_every=0, slm="off")
FIELDS = ["a", "b", "c", "d"]
STRINGS = ["", "a", "ab", "b", "B", "z\x00"]


# -- the reference: the grammar's semantics in plain Python ----------------------------------
def cls(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "num"
    if isinstance(v, str):
        return "str"
    return "other"


def equal(meta: dict, field: str, v) -> bool:
    return field in meta and cls(meta[field]) == cls(v) and cls(v) != "other" and meta[field] == v


def holds(meta: dict, field: str, op: str, v) -> bool:
    if op == "$eq":
        return equal(meta, field, v)
    if op == "$ne":
        return not equal(meta, field, v)
    if op == "$in":
        return any(equal(meta, field, x) for x in v)
    if op == "$nin":
        return not any(equal(meta, field, x) for x in v)
    if field not in meta or cls(meta[field]) != cls(v) or cls(v) not in ("num", "str"):
        return False
    s = meta[field]
    return {"$gt": s > v, "$gte": s >= v, "$lt": s < v, "$lte": s <= v}[op]


def ref(meta: dict | None, where: dict) -> bool:
    meta = meta or {}
    for key, cond in where.items():
        if key == "$and":
            ok = all(ref(meta, f) for f in cond)
        elif key == "$or":
            ok = any(ref(meta, f) for f in cond)
        elif isinstance(cond, dict):
            ok = all(holds(meta, key, op, v) for op, v in cond.items())
        else:
            ok = equal(meta, key, cond)
        if not ok:
            return False
    return True


# -- generated data and filters ----------------------------------------------------------
def random_metadata(rng: random.Random) -> dict | None:
    if rng.random() < 0.1:
        return None
    out = {}
    for f in FIELDS:
        r = rng.random()
        if r < 0.25:
            continue  # missing
        out[f] = rng.choice([None, True, False, 0, 1, 2, -3, 1.5, 2.0, "a", "ab", "b", "B", "", "z\x00", [1, "a"],
                             {"x": 1}])
    return out


scalars = st.one_of(st.none(), st.booleans(), st.integers(-4, 4), st.sampled_from([1.5, 2.0, -0.5]),
                    st.sampled_from(STRINGS))
ordered = st.one_of(st.integers(-4, 4), st.sampled_from([1.5, -0.5]), st.sampled_from(STRINGS))
fields = st.sampled_from(FIELDS + ["missing"])
condition = st.one_of(
    scalars,
    st.dictionaries(st.sampled_from(["$eq", "$ne"]), scalars, min_size=1, max_size=1),
    st.dictionaries(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), ordered, min_size=1, max_size=2),
    st.dictionaries(st.sampled_from(["$in", "$nin"]), st.lists(scalars, max_size=4), min_size=1, max_size=1),
)
leaf = st.dictionaries(fields, condition, min_size=1, max_size=2)
filters = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.builds(lambda fs: {"$and": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda fs: {"$or": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda a, b: {**a, **b}, inner, leaf),
    ),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    rng = random.Random(5)
    vecs, _ = topic_vectors(400, 8, seed=12)
    metas = [random_metadata(rng) for _ in range(400)]
    s = MemoryStore.open(tmp_path_factory.mktemp("f") / "s", config=CFG, embedder=False, slm=False)
    ids = s.add_many([f"m{i}" for i in range(400)], embeddings=vecs, metadata=metas)
    s.organize()
    assert s.clusters()
    yield s, dict(zip(ids, metas)), dict(zip(ids, vecs))
    s.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=filters, q=st.integers(0, 399))
def test_filters_match_the_reference(filled, where, q):
    s, metas, vecs = filled
    expected = {m for m, meta in metas.items() if ref(meta, where)}
    listed = s.memories(where=where, limit=1000).items
    assert [m.memory_id for m in listed] == sorted(expected), where
    query = list(vecs.values())[q]
    flat = s.search(query, k=400, mode="flat", where=where)
    assert {h.memory_id for h in flat} == expected
    assert flat.candidates == len(expected)
    # Two-stage: k hits whenever k memories match, each of them matching, best first, and
    # the same top k as an exact search over the matching vectors alone.
    for k in (1, 5):
        hits = s.search(query, k=k, where=where)
        assert len(hits) == min(k, len(expected))
        assert {h.memory_id for h in hits} <= expected
        if expected and hits.mode == "flat":
            ids = sorted(expected)
            scores = np.stack([vecs[m] for m in ids]) @ query
            top = [ids[i] for i in np.argsort(-scores, kind="stable")[:k]]
            assert [h.memory_id for h in hits] == top


def test_search_many_and_hybrid_apply_where(tmp_path):
    with MemoryStore.open(tmp_path / "h", config=CFG, embedder=HashingEmbedder(), slm=False) as s:
        texts = [f"note {i} about {'cats' if i % 2 else 'dogs'} and walks" for i in range(60)]
        s.add_many(texts, metadata=[{"n": i, "pet": "cat" if i % 2 else "dog"} for i in range(60)])
        for hits in s.search_many(["cats walks", "dogs"], k=10, where={"pet": "cat", "n": {"$lt": 20}}):
            assert len(hits) == 10
            assert all(h.metadata["pet"] == "cat" and h.metadata["n"] < 20 for h in hits)
        hits = s.search("dogs and walks", k=3, where={"n": {"$in": [1, 3, 4]}})
        assert sorted(h.metadata["n"] for h in hits) == [1, 3, 4]
        vec = s.search_many(np.stack([HashingEmbedder().encode(["cats"])[0]]), k=4, where={"pet": {"$ne": "cat"}})
        assert len(vec[0]) == 4 and all(h.metadata["pet"] == "dog" for h in vec[0])


def test_missing_fields_match_only_negations(filled):
    s, metas, vecs = filled
    q = next(iter(vecs.values()))
    assert len(s.search(q, k=5, where={"nope": 1})) == 0
    assert len(s.search(q, k=5, where={"nope": {"$gt": 0}})) == 0
    assert len(s.search(q, k=5, where={"nope": {"$in": [1, None]}})) == 0
    assert s.search(q, k=3, where={"nope": {"$ne": 1}}).candidates == len(metas)
    assert s.search(q, k=3, where={"nope": {"$nin": [1]}}).candidates == len(metas)
    assert s.search(q, k=3, where={}).candidates == len(metas)


@settings(max_examples=30, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "upsert", "meta", "text", "delete"]),
                              st.integers(0, 4), st.integers(0, 2**31)), min_size=1, max_size=25),
       where=filters)
def test_writes_keep_the_filter_columns_in_step(tmp_path_factory, ops, where):
    """Every write path (add, upsert by key, update of metadata or text, delete, reopen)
    leaves the filter answering as the reference does on the stored metadata."""
    vecs, _ = topic_vectors(64, 4, seed=3)
    path = tmp_path_factory.mktemp("w") / "s"
    s = MemoryStore.open(path, config=CFG, embedder=False, slm=False)
    try:
        s.search(vecs[0], k=1, where={"a": 1, "b": 1, "c": 1})  # these columns are built before the
        # writes, which must keep them in step; "d" is built after them, from the database
        for op, slot, seed in ops:
            rng = random.Random(seed)
            meta, key = random_metadata(rng), f"k{slot}"
            present = s.get_many(keys=[key])
            if op in ("add", "upsert") or not present:
                s.add(f"t{seed}", key=key if op != "add" else None, metadata=meta, embedding=vecs[seed % 64])
            elif op == "meta":
                s.update(key=key, metadata=meta or {})
            elif op == "text":
                s.update(key=key, text=f"t{seed}", embedding=vecs[seed % 64])
            else:
                s.delete(key=key)
        for reopen in (False, True):
            if reopen:
                s.close()
                s = MemoryStore.open(path, config=CFG, embedder=False, slm=False)
            stored = {m.memory_id: m.metadata for m in s.memories(limit=1000).items}
            expected = sorted(m for m, meta in stored.items() if ref(meta, where))
            assert [m.memory_id for m in s.memories(where=where, limit=1000).items] == expected
            for f in FIELDS:  # every value of every field, whatever the generated filter reads
                every = {f: {"$in": [None, True, False, 0, 1, 2, -3, 1.5, *STRINGS]}}
                assert [m.memory_id for m in s.memories(where=every, limit=1000).items] == sorted(
                    m for m, meta in stored.items() if ref(meta, every))
            assert sorted(h.memory_id for h in s.search(vecs[1], k=100, mode="flat", where=where)) == expected
    finally:
        s.close()


def test_a_changed_memory_leaves_a_cached_filter(tmp_path):
    vecs, _ = topic_vectors(10, 2, seed=1)
    with MemoryStore.open(tmp_path / "c", config=CFG, embedder=False, slm=False) as s:
        ids = s.add_many([f"t{i}" for i in range(10)], embeddings=vecs, metadata=[{"on": True}] * 10)
        assert len(s.search(vecs[0], k=10, where={"on": True})) == 10
        s.update(ids[0], metadata={"on": False})
        s.update(ids[2], metadata={"other": True})  # the field is gone, not kept from before
        s.delete(ids[1])
        s.add("new", key="k", metadata={"on": True}, embedding=vecs[0])
        s.add("new", key="k", metadata={"on": 1}, embedding=vecs[0])  # 1 is not True
        hits = s.search(vecs[0], k=10, where={"on": True})
        assert sorted(h.memory_id for h in hits) == sorted(ids[3:])


@pytest.mark.parametrize("where, match", [
    ({"a": {"$regex": "x"}}, r"unknown operator '\$regex' on field 'a'"),
    ({"$nor": [{"a": 1}]}, r"unknown operator '\$nor'"),
    ({"a": {"$not": {"$eq": 1}}}, r"unknown operator '\$not'"),
    ({"$and": []}, r"\$and needs a non-empty list"),
    ({"$or": {"a": 1}}, r"\$or needs a non-empty list"),
    ({"a": {}}, r"field 'a' has an empty condition"),
    ({"a": [1, 2]}, r"values must be str, int, float, bool or None, got list"),
    ({"a": {"$in": "ab"}}, r"\$in on field 'a' needs a list"),
    ({"a": {"$gt": None}}, r"\$gt on field 'a' needs a number or a string"),
    ({"a": {"$lte": True}}, r"\$lte on field 'a' needs a number or a string"),
    ({"a": math.nan}, r"non-finite"),
    ({"a": {"$in": [{"x": 1}]}}, r"got dict"),
    ({1: 2}, r"field names must be strings"),
    ({"": 2}, r"empty field name"),
    ({"$and": [{"a": {"$bad": 1}}]}, r"where.\$and\[0\]: unknown operator '\$bad'"),
    ([("a", 1)], r"where must be a dict"),
])
def test_malformed_filters_are_refused(filled, where, match):
    s, _, vecs = filled
    q = next(iter(vecs.values()))
    with pytest.raises(FilterError, match=match):
        s.search(q, k=3, where=where)
    with pytest.raises(ValueError, match=match):
        s.memories(where=where)
    with pytest.raises(ValueError, match=match):
        s.search_many(np.stack([q]), k=3, where=where)


def test_a_read_only_reader_sees_new_metadata_after_refresh(tmp_path):
    vecs, _ = topic_vectors(6, 2, seed=2)
    path = tmp_path / "r"
    with MemoryStore.open(path, config=CFG, embedder=False, slm=False) as w:
        ids = w.add_many([f"t{i}" for i in range(6)], embeddings=vecs, metadata=[{"g": i % 2} for i in range(6)])
        w.flush()
        with MemoryStore.open(path, config=CFG, embedder=False, slm=False, read_only=True) as r:
            assert [m.memory_id for m in r.memories(where={"g": 1}).items] == ids[1::2]
            w.update(ids[0], metadata={"g": 1})
            w.flush()
            r.refresh()
            assert [m.memory_id for m in r.memories(where={"g": 1}).items] == [ids[0], *ids[1::2]]


def test_filtered_search_scores_are_cosines_for_unnormalised_queries(tmp_path):
    # the small-subset path (exact scan of the eligible rows) must score like the native one
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = 3.7 * x[11] + 0.1 * rng.standard_normal(384).astype(np.float32)
    with MemoryStore.open(tmp_path / "s", config=StoreConfig(slm="off"), embedder=False, slm=False) as s:
        s.add_many([f"t{i}" for i in range(300)], embeddings=x,
                   metadata=[{"even": i % 2 == 0} for i in range(300)])
        hits = s.search(q, k=3, mode="flat", where={"even": False})
        want = x @ (q / np.linalg.norm(q))
        assert hits[0].memory_id == s.search(q, k=1, mode="flat")[0].memory_id
        for h in hits:
            i = int(h.text[1:])
            assert i % 2 == 1
            assert h.score == pytest.approx(float(want[i]), abs=1e-5)


def test_mutating_a_hits_metadata_never_changes_the_store(tmp_path):
    # hit details are cached; the metadata a caller gets is its own copy
    x = np.eye(4, 384, dtype=np.float32)
    with MemoryStore.open(tmp_path / "s", config=StoreConfig(slm="off"), embedder=False, slm=False) as s:
        s.add_many(["a", "b", "c", "d"], embeddings=x,
                   metadata=[{"n": 1}, {"n": 2, "deep": {"x": [1]}}, None, {"n": 4}])
        for _ in range(2):
            for h in s.search(x[0] + x[1], k=4, mode="flat"):
                if h.metadata is not None:
                    h.metadata["n"] = 99
                    h.metadata.get("deep", {}).get("x", []).append(2)
        got = {h.text: h.metadata for h in s.search(x[0] + x[1], k=4, mode="flat")}
        assert got["a"] == {"n": 1} and got["b"] == {"n": 2, "deep": {"x": [1]}} and got["c"] is None
        assert s.get(s.search(x[1], k=1, mode="flat")[0].memory_id).metadata == {"n": 2, "deep": {"x": [1]}}


@pytest.mark.parametrize("value", [7, 7.0, True, False, 1, 0, 1.5, -0.0, "", "a", None, 2**70, np.int64(3),
                                   np.float32(0.5), np.bool_(True)])
def test_a_one_field_filter_parses_like_its_eq_form(value):
    # {"f": v} has a fast path in parse(); {"f": {"$eq": v}} takes the general one
    fast, general = filters_mod.parse({"f": value}), filters_mod.parse({"f": {"$eq": value}})
    assert fast == general
    assert type(fast[3][1]) is type(general[3][1])


def test_remembered_one_field_filters_keep_their_types():
    # parse() remembers one-field filters by (field, type, value): True, 1 and 1.0 are equal
    # and hash alike in Python but are different filters here
    values = [1, True, 1.0, 0, False, 0.0, "1", 2**64, float(2**64)]
    for _ in range(2):
        for v in values:
            assert filters_mod.parse({"f": v}) == filters_mod.parse({"f": {"$eq": v}}), v
            assert filters_mod.parse({"g": v}) != filters_mod.parse({"f": v})
    assert len({filters_mod.parse({"f": v}) for v in (1, True, "1")}) == 3
    for bad in (math.nan, math.inf):
        for _ in range(2):
            with pytest.raises(FilterError, match="non-finite"):
                filters_mod.parse({"f": bad})


def test_one_field_filters_keep_bools_and_numbers_apart(filled):
    s, metas, vecs = filled
    q = next(iter(vecs.values()))
    for value in (True, 1, 1.0, False, 0, "a", None):
        got = {h.memory_id for h in s.search(q, k=400, mode="flat", where={"a": value})}
        assert got == {m for m, meta in metas.items() if ref(meta, {"a": value})}, value
    for where in ({"a": math.inf}, {"a": -math.nan}, {"$x": 1}, {"": 1}, {"a": [1]}):
        with pytest.raises(FilterError):
            s.search(q, k=3, where=where)


def test_filtered_searches_stay_exact_while_the_subset_cache_evicts(tmp_path, monkeypatch):
    # small filters are searched from gathered copies of their rows, cached per filter and
    # write within a byte budget: evictions, more than 64 filters, and writes (a moved vector,
    # a delete, changed metadata) must never serve a stale copy
    from clag_fast.store import search as search_mod

    rng = np.random.default_rng(11)
    x = rng.standard_normal((300, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    monkeypatch.setattr(search_mod, "SUBSET_CACHE_BYTES", 3 * 10 * 384 * 4)  # three groups' copies
    with MemoryStore.open(tmp_path / "e", config=StoreConfig(slm="off", organize_every=0), embedder=False,
                          slm=False) as s:
        ids = s.add_many([f"t{i}" for i in range(300)], embeddings=x, metadata=[{"g": i % 30} for i in range(300)])
        live = {m: (x[i], i % 30) for i, m in enumerate(ids)}

        def check(where, groups, q):
            hits = s.search(q, k=5, mode="flat", where=where)
            cand = [(float(v @ q), m) for m, (v, g) in live.items() if g in groups]
            assert [h.memory_id for h in hits] == [m for _, m in sorted(cand, reverse=True)[:5]], where
            assert all(h.score == pytest.approx(sc, abs=1e-5) for h, (sc, _) in zip(hits, sorted(cand, reverse=True)))

        for rnd in range(3):
            for g in list(range(30)) * 2:
                check({"g": g}, {g}, x[(7 * g + rnd) % 300])
            for a in range(70):  # more distinct filters than the cache keeps
                check({"g": {"$in": [a % 30, (a * 7 + 1) % 30]}}, {a % 30, (a * 7 + 1) % 30}, x[a])
            # writes: a new vector for one memory, one deleted, one moved to another group
            m0, m1, m2 = ids[rnd * 3], ids[rnd * 3 + 1], ids[rnd * 3 + 2]
            v = rng.standard_normal(384).astype(np.float32)
            v /= np.linalg.norm(v)
            s.update(m0, text=f"moved{rnd}", embedding=v)
            live[m0] = (v, live[m0][1])
            s.delete(m1)
            del live[m1]
            s.update(m2, metadata={"g": 29})
            live[m2] = (live[m2][0], 29)
            check({"g": live[m0][1]}, {live[m0][1]}, v)  # the moved vector is found where it is now
