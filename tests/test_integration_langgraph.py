"""clag_fast behind LangGraph's BaseStore: generated operation sequences give the same results
as LangGraph's own InMemoryStore; a graph written for InMemoryStore runs unchanged on it;
MiniLM by default; bad input.

What the comparison compares (and why):
- get: the item (namespace, key, value) or None, exactly.
- search with a query (stores with an index): the ranked items in order, with scores equal to
  1e-5. Every item's text holds its namespace and key, so the embedding (a hash-seeded random
  vector per text) gives every item a different similarity: the order is unambiguous. The
  items without vectors that fill the page come after, the same number in both, each one a
  matching unembedded item (their order is insertion order in both, but InMemoryStore groups
  it by namespace).
- search without a query: the same number of items, each of them a match (the full match set
  when the page holds all of them); InMemoryStore orders by namespace, then insertion, and
  ClagStore by insertion alone, so which items fill a truncated page may differ.
- list_namespaces: exactly InMemoryStore's answer restricted to namespaces that hold items
  (InMemoryStore also lists namespaces that were only read or emptied; ClagStore, like the
  Postgres store, does not).
Keys re-put with index=False are drawn from their own pool, and with two indexed fields every
put indexes both: InMemoryStore keeps a key's old vectors when it is re-put unembedded or with
fewer fields (only a delete clears them), which ClagStore does not copy.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import TypedDict

import numpy as np
import pytest

pytest.importorskip("langgraph")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.store.base import (  # noqa: E402
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore  # noqa: E402

from clag_fast.integrations.langgraph import ClagStore  # noqa: E402

from adapter_helpers import LG_DIMS, LG_INDEX, LG_INDEX2, hash_embed  # noqa: E402

DIMS, INDEX, INDEX2 = LG_DIMS, LG_INDEX, LG_INDEX2

# -- operation generator --------------------------------------------------------------------
NAMESPACES = [("a",), ("a", "b"), ("a", "c"), ("d",), ("a", "b", "e")]
KEYS = ["k1", "k2", "k3"]
RAW_KEYS = ["r1", "r2"]
WORDS = ["tea", "flight", "peanut", "lisbon"]
PREFIXES = [(), ("a",), ("a", "b"), ("d",), ("z",)]
FILTERS = [None, {"tag": "x"}, {"n": {"$gt": 2}}, {"n": {"$lte": 3}, "tag": "y"}, {"n": {"$ne": 1}},
           {"nested": {"z": 1}}, {"missing": "q"}, {"tag": {"$eq": "y"}}, {"n": 4}]


@st.composite
def values(draw, ns, key):
    v = {"text": f"{draw(st.sampled_from(WORDS))} {'.'.join(ns)} {key}", "n": draw(st.integers(0, 5)),
         "tag": draw(st.sampled_from(["x", "y"])),
         "alt": f"{draw(st.sampled_from(WORDS))} alt {'.'.join(ns)} {key}"}
    if draw(st.booleans()):
        v["nested"] = {"z": draw(st.integers(0, 2))}
    return v


@st.composite
def put_ops(draw):
    ns = draw(st.sampled_from(NAMESPACES))
    if draw(st.integers(0, 4)) == 0:
        key = draw(st.sampled_from(RAW_KEYS))
        return PutOp(ns, key, draw(values(ns, key)), index=False)
    key = draw(st.sampled_from(KEYS))
    if draw(st.integers(0, 3)) == 0:
        return PutOp(ns, key, None)  # delete
    return PutOp(ns, key, draw(values(ns, key)), index=draw(st.sampled_from([None, ["text"]])))


@st.composite
def search_ops(draw):
    return SearchOp(draw(st.sampled_from(PREFIXES)), draw(st.sampled_from(FILTERS)), draw(st.integers(1, 6)),
                    draw(st.integers(0, 3)), draw(st.sampled_from([None] + WORDS)))


@st.composite
def list_ops(draw):
    conds = draw(st.sampled_from([None, (MatchCondition("prefix", ("a",)),), (MatchCondition("suffix", ("b",)),),
                                  (MatchCondition("prefix", ("a", "*")),),
                                  (MatchCondition("prefix", ("a",)), MatchCondition("suffix", ("e",)))]))
    return ListNamespacesOp(conds, draw(st.sampled_from([None, 1, 2])), draw(st.integers(1, 10)),
                            draw(st.integers(0, 2)))


def get_ops():
    return st.builds(GetOp, st.sampled_from(NAMESPACES + [("nowhere",)]), st.sampled_from(KEYS + RAW_KEYS))


OPS = st.one_of(put_ops(), put_ops(), search_ops(), list_ops(), get_ops())
PROGRAMS = st.lists(st.lists(OPS, min_size=1, max_size=4), min_size=1, max_size=12)


# -- comparison -----------------------------------------------------------------------------
def ident(item) -> tuple:
    return (item.namespace, item.key, tuple(sorted((k, repr(v)) for k, v in item.value.items())))


def before(op, ref: BaseStore):
    """What the comparison needs from the reference's state before the batch (a batch reads
    the state before its own puts)."""
    if isinstance(op, ListNamespacesOp):
        return expected_namespaces(op, ref)
    if isinstance(op, SearchOp):
        return {ident(i) for i in ref.search(op.namespace_prefix, filter=op.filter, limit=10_000)}
    return None


def compare(op, got, want, context, indexed: bool) -> None:
    if isinstance(op, GetOp):
        assert (got and ident(got)) == (want and ident(want)), op
    elif isinstance(op, ListNamespacesOp):
        assert got == context, op
    elif isinstance(op, SearchOp):
        everything = context
        assert len(got) == len(want), op
        if op.query and indexed:
            ranked_got = [i for i in got if i.score is not None]
            ranked_want = [i for i in want if i.score is not None]
            assert [ident(i) for i in ranked_got] == [ident(i) for i in ranked_want], op
            assert np.allclose([i.score for i in ranked_got], [i.score for i in ranked_want], atol=1e-5)
            tail = got[len(ranked_got):]
            assert all(i.score is None and i.key in RAW_KEYS and ident(i) in everything for i in tail), op
        else:
            assert {ident(i) for i in got} <= everything, op
            if op.offset == 0 and len(everything) <= op.limit:
                assert {ident(i) for i in got} == everything, op


def expected_namespaces(op: ListNamespacesOp, ref: BaseStore) -> list[tuple[str, ...]]:
    """InMemoryStore's answer, restricted to namespaces holding items."""
    holding = {i.namespace for i in ref.search((), limit=10_000)}
    listed = ref.list_namespaces(prefix=None, limit=10_000) if not op.match_conditions else \
        ref.batch([ListNamespacesOp(op.match_conditions, None, 10_000, 0)])[0]
    names = [ns for ns in listed if ns in holding]
    names = sorted({ns[: op.max_depth] for ns in names}) if op.max_depth is not None else sorted(names)
    return names[op.offset: op.offset + op.limit]


def run_program(program, index: dict | None, use_async: bool = False) -> None:
    indexed = index is not None
    if index is INDEX2:
        program = [[op._replace(index=None) if isinstance(op, PutOp) and op.index else op for op in batch]
                   for batch in program]
    ref = InMemoryStore(index=index)
    with tempfile.TemporaryDirectory() as d:
        ours = ClagStore(index=index, path=d)
        try:
            for batch in program:
                contexts = [before(op, ref) for op in batch]
                want = ref.batch(batch)
                got = asyncio.run(ours.abatch(batch)) if use_async else ours.batch(batch)
                for op, g, w, c in zip(batch, got, want, contexts):
                    compare(op, g, w, c, indexed)
        finally:
            ours.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PROGRAMS)
def test_same_results_as_inmemorystore_with_an_index(program):
    run_program(program, INDEX)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PROGRAMS)
def test_same_results_as_inmemorystore_with_two_indexed_fields(program):
    run_program(program, INDEX2)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PROGRAMS)
def test_same_results_as_inmemorystore_without_an_index(program):
    run_program(program, None)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PROGRAMS)
def test_abatch_gives_the_same_results(program):
    run_program(program, INDEX, use_async=True)


def test_the_comparison_sees_a_wrong_answer():
    # The comparator itself must fail on a difference (guards against a vacuous pass).
    ref = InMemoryStore(index=INDEX)
    ref.put(("a",), "k1", {"text": "tea a k1", "n": 1, "tag": "x"})
    ref.put(("a",), "k2", {"text": "flight a k2", "n": 2, "tag": "x"})
    op = SearchOp(("a",), None, 2, 0, "tea")
    want = ref.batch([op])[0]
    with pytest.raises(AssertionError):
        compare(op, list(reversed(want)), want, before(op, ref), True)
    listing = ListNamespacesOp(None, None, 10, 0)
    compare(listing, [("a",)], None, before(listing, ref), True)
    with pytest.raises(AssertionError):
        compare(listing, [("a",), ("b",)], None, before(listing, ref), True)


def test_ranked_search_matches_inmemorystore_on_a_fixed_case(tmp_path):
    ref, ours = InMemoryStore(index=INDEX), ClagStore(index=INDEX, path=tmp_path / "s")
    try:
        for store in (ref, ours):
            for i, w in enumerate(WORDS):
                store.put(("docs", "u1"), f"k{i}", {"text": f"{w} docs u1 k{i}", "n": i, "tag": "x"})
            store.put(("docs", "u1"), "raw", {"text": "unembedded", "n": 9}, index=False)
        for q in WORDS:
            want = ref.search(("docs",), query=q, limit=10)
            got = ours.search(("docs",), query=q, limit=10)
            assert [(i.key, i.score is None) for i in got] == [(i.key, i.score is None) for i in want]
            assert got[-1].key == "raw" and got[-1].score is None
        assert [i.key for i in ours.search(("docs",), query="tea", filter={"n": {"$gte": 2}}, limit=10)] == \
            [i.key for i in ref.search(("docs",), query="tea", filter={"n": {"$gte": 2}}, limit=10)]
    finally:
        ours.close()


# -- a graph written for InMemoryStore, store swapped ----------------------------------------
class State(TypedDict, total=False):
    user: str
    message: str
    recalled: list[str]


def build_graph(store: BaseStore):
    def recall(state: State, *, store: BaseStore) -> State:
        items = store.search(("memories", state["user"]), query=state["message"], limit=2)
        return {"recalled": [i.value["text"] for i in items]}

    def remember(state: State, *, store: BaseStore) -> State:
        ns = ("memories", state["user"])
        n = len(store.search(ns, limit=1000))
        store.put(ns, f"m{n}", {"text": state["message"], "turn": n})
        return {}

    g = StateGraph(State)
    g.add_node("recall", recall)
    g.add_node("remember", remember)
    g.add_edge(START, "recall")
    g.add_edge("recall", "remember")
    g.add_edge("remember", END)
    return g.compile(store=store)


CONVERSATION = [("u1", "I like green tea"), ("u2", "my flight leaves Friday"), ("u1", "I am allergic to peanuts"),
                ("u1", "I like green tea"), ("u2", "book a window seat"), ("u1", "what do I like to drink?")]


def converse(store: BaseStore, use_async: bool = False) -> list[list[str]]:
    graph = build_graph(store)
    out = []
    for user, message in CONVERSATION:
        state = {"user": user, "message": message}
        result = asyncio.run(graph.ainvoke(state)) if use_async else graph.invoke(state)
        out.append(result["recalled"])
    return out


@pytest.mark.parametrize("use_async", [False, True])
def test_graph_runs_the_same_on_clagstore(tmp_path, use_async):
    want = converse(InMemoryStore(index=INDEX), use_async)
    ours = ClagStore(index=INDEX, path=tmp_path / "g")
    try:
        assert converse(ours, use_async) == want
        assert want[3][0] == "I like green tea"  # the repeated message recalls itself first
        assert ours.list_namespaces(prefix=("memories",)) == [("memories", "u1"), ("memories", "u2")]
    finally:
        ours.close()


def test_minilm_embeddings(tmp_path):
    from clag_fast.integrations.langchain import MiniLMEmbeddings

    store = ClagStore(index={"dims": 384, "embed": MiniLMEmbeddings(), "fields": ["text"]}, path=tmp_path / "m")
    try:
        store.put(("u",), "a", {"text": "The user is allergic to peanuts"})
        store.put(("u",), "b", {"text": "The user's flight leaves on Friday"})
        store.put(("u",), "c", {"text": "The user drinks green tea", "kind": "pref"}, index=["text"])
        assert store.search(("u",), query="Which food is dangerous for the user?", limit=1)[0].key == "a"
        assert [i.key for i in store.search(("u",), query="travel", filter={"kind": "pref"})] == ["c"]
    finally:
        store.close()


# -- bad input ---------------------------------------------------------------------------
@pytest.fixture()
def lg(tmp_path):
    store = ClagStore(index=INDEX, path=tmp_path / "b")
    yield store
    store.close()


def test_each_indexed_text_is_searched_and_replaced_with_its_item(tmp_path):
    index = {"dims": DIMS, "embed": hash_embed, "fields": ["title", "tags[*]"]}
    ref, ours = InMemoryStore(index=index), ClagStore(index=index, path=tmp_path / "mf")
    try:
        for store in (ref, ours):
            store.put(("d",), "a", {"title": "alpha", "tags": ["red", "green"]})
            store.put(("d",), "b", {"title": "beta", "tags": ["blue"]})
        for q in ["green", "blue", "alpha", "red"]:
            got, want = ours.search(("d",), query=q, limit=2), ref.search(("d",), query=q, limit=2)
            assert [i.key for i in got] == [i.key for i in want]
            assert np.allclose([i.score for i in got], [i.score for i in want], atol=1e-5)
        assert ours.search(("d",), query="green", limit=1)[0].key == "a"
        ours.put(("d",), "a", {"title": "alpha", "tags": []})  # its tag vectors go with the old value
        assert ours.search(("d",), query="green", limit=1)[0].score < 0.99
        ours.delete(("d",), "a")
        assert [i.key for i in ours.search(("d",), query="alpha", limit=5)] == ["b"]
        assert len(ours.store) == 2  # "b" and its one tag vector
    finally:
        ours.close()


def test_duplicate_puts_in_one_batch_keep_the_last(lg):
    lg.batch([PutOp(("a",), "k", {"text": "one", "n": 1}), PutOp(("a",), "k", {"text": "two", "n": 2})])
    assert lg.get(("a",), "k").value == {"text": "two", "n": 2}
    assert len(lg.search(("a",), limit=10)) == 1


def test_a_batch_of_gets_answers_each_get_as_inmemorystore(tmp_path):
    """Gets of one batch are read with one store call per namespace: repeated keys, missing
    keys and namespaces, and a put in the same batch (read before it) answer as in InMemoryStore."""
    ours, theirs = ClagStore(index=INDEX, path=tmp_path / "g"), InMemoryStore(index=INDEX)
    try:
        setup = [PutOp(("a",), "k1", {"text": "tea a k1"}), PutOp(("a",), "k2", {"text": "tea a k2"}),
                 PutOp(("a", "b"), "k1", {"text": "tea a.b k1"}), PutOp(("d",), "r1", {"text": "raw"}, index=False)]
        ours.batch(setup)
        theirs.batch(setup)
        ops = [GetOp(("a",), "k2"), GetOp(("a", "b"), "k1"), GetOp(("a",), "k2"), GetOp(("a",), "k3"),
               GetOp(("nowhere",), "k1"), PutOp(("a",), "k1", {"text": "changed"}), GetOp(("a",), "k1"),
               GetOp(("d",), "r1")]
        got, want = ours.batch(ops), theirs.batch(ops)
        assert [None if r is None else (r.namespace, r.key, r.value) for r in got] == \
               [None if r is None else (r.namespace, r.key, r.value) for r in want]
        assert got[6].value == {"text": "tea a k1"} and got[3] is None and got[4] is None
    finally:
        ours.close()


def test_reserved_fields_and_bad_keys_are_refused_and_nothing_is_written(lg):
    with pytest.raises(ValueError, match="__lg_ns"):
        lg.batch([PutOp(("a",), "ok", {"text": "fine"}), PutOp(("a",), "bad", {"__lg_ns": "x"})])
    with pytest.raises(InvalidNamespaceError):
        lg.put(("a.b",), "k", {"text": "dotted"})
    for bad in ["", "k" * 501, "a\x1fb"]:  # \x1f separates an item's further vectors' keys
        with pytest.raises(ValueError, match="key"):
            lg.batch([PutOp(("a",), "ok", {"text": "fine"}), PutOp(("a",), bad, {"text": "bad key"})])
    assert lg.search((), limit=10) == [] and lg.list_namespaces() == []


def test_filters_on_missing_fields_match_nothing_and_unknown_operators_raise(lg):
    lg.put(("a",), "k", {"text": "tea", "n": 1})
    assert lg.search(("a",), filter={"absent": "x"}) == []
    assert lg.search(("a",), query="tea", filter={"n": {"$gt": "many"}}) == []
    with pytest.raises(ValueError, match=r"\$regex"):
        lg.search(("a",), filter={"n": {"$regex": "1"}})


def test_mixing_dimensions_is_refused(tmp_path):
    first = ClagStore(index=INDEX, path=tmp_path / "d")
    first.put(("a",), "k", {"text": "tea"})
    first.close()
    with pytest.raises(ValueError, match="8"):
        ClagStore(index={"dims": 16, "embed": hash_embed, "fields": ["text"]}, path=tmp_path / "d")
    again = ClagStore(index=INDEX, path=tmp_path / "d")
    try:
        assert again.get(("a",), "k").value == {"text": "tea"}
    finally:
        again.close()


def test_a_missing_framework_names_the_extra(monkeypatch):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "langgraph", None)
    monkeypatch.delitem(sys.modules, "clag_fast.integrations.langgraph")
    with pytest.raises(ImportError, match=r"clag_fast\[langgraph\]"):
        importlib.import_module("clag_fast.integrations.langgraph")
