"""TTL on clag_fast's LangGraph store: ``put(..., ttl=)`` and ``TTLConfig`` as LangGraph's
``BaseStore`` defines them (``InMemoryStore`` has no TTL; with TTLs that never run out the
two stores give the same answers).

Time is a clock the test moves: the adapter module's ``time`` is replaced by ``Clock``, so
expiry and refresh are checked exactly, without sleeping.
"""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("langgraph")
from langgraph.store.base import GetOp, PutOp, SearchOp  # noqa: E402
from langgraph.store.memory import InMemoryStore  # noqa: E402

from clag_fast.integrations import langgraph as lg_mod  # noqa: E402
from clag_fast.integrations.langgraph import ClagStore  # noqa: E402

from adapter_helpers import LG_INDEX, LG_INDEX2  # noqa: E402

INDEX, INDEX2 = LG_INDEX, LG_INDEX2


class Clock:
    """Stands in for the ``time`` module inside the adapter: ``time()`` is what the test says."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def advance(self, minutes: float) -> None:
        self.now += 60.0 * minutes


@pytest.fixture()
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(lg_mod, "time", c)
    return c


@pytest.fixture()
def open_store(tmp_path):
    """Opens ``ClagStore(index=..., path=tmp_path / "s")`` and closes it after the test."""
    opened = []

    def open_(index=INDEX) -> ClagStore:
        opened.append(ClagStore(index=index, path=tmp_path / "s"))
        return opened[-1]

    yield open_
    for s in opened:
        s.close()


def stored(store: ClagStore, ns: str, key: str) -> dict | None:
    """The metadata the MemoryStore holds for a key (None when it holds none)."""
    found = store.store.get_many(keys=[key], namespace=ns)
    return found[0].metadata if found else None


def test_items_without_ttl_cost_no_expiry_fields_and_no_marker(open_store, clock):
    s = open_store()
    s.put(("docs",), "a", {"text": "green tea"})
    clock.advance(10_000)
    assert s.get(("docs",), "a").value == {"text": "green tea"}
    assert lg_mod.EXPIRES_FIELD not in stored(s, "docs", "a")
    assert lg_mod.MARKER_NAMESPACE not in s.store.namespaces()
    assert s.sweep_ttl() == 0


def test_an_expired_item_is_gone_from_every_read_and_swept(open_store, clock):
    s = open_store()
    s.put(("docs",), "old", {"text": "green tea"}, ttl=1)
    s.put(("docs",), "raw", {"text": "black tea"}, index=False, ttl=1)
    s.put(("docs",), "kept", {"text": "coffee"})
    s.put(("gone",), "x", {"text": "tea time"}, ttl=2)
    clock.advance(0.5)
    assert s.get(("docs",), "old") is not None
    assert {i.key for i in s.search(("docs",), query="green tea")} == {"old", "raw", "kept"}
    clock.advance(2)  # both TTLs passed (reads restarted the clocks at 0.5 min)
    assert s.get(("docs",), "old") is None
    assert [i.key for i in s.search(("docs",), query="green tea")] == ["kept"]
    assert [i.key for i in s.search(("docs",))] == ["kept"]
    assert [i.key for i in s.search((), query="tea")] == ["kept"]
    # The reads met expired items: the batch ended by deleting every expired one.
    assert stored(s, "docs", "old") is None and stored(s, "docs", "raw") is None
    assert stored(s, "gone", "x") is None
    assert s.list_namespaces() == [("docs",)]
    assert stored(s, "docs", "kept") is not None


def test_list_namespaces_drops_a_namespace_whose_items_all_expired(open_store, clock):
    s = open_store()
    s.put(("a", "b"), "k", {"text": "tea"}, ttl=1)
    s.put(("c",), "k", {"text": "tea"})
    assert s.list_namespaces() == [("a", "b"), ("c",)]
    clock.advance(1.01)
    assert s.list_namespaces() == [("c",)]
    assert s.store.namespaces() == ["c", lg_mod.MARKER_NAMESPACE]


def test_reads_restart_the_clock_of_an_item_and_its_further_vectors(open_store, clock):
    s = open_store(INDEX2)
    s.put(("docs",), "k", {"text": "green tea", "alt": "oolong"}, ttl=10)
    part = "k" + lg_mod.PART_SEP + "1"
    first = stored(s, "docs", "k")[lg_mod.EXPIRES_FIELD]
    assert stored(s, "docs", part)[lg_mod.EXPIRES_FIELD] == first
    clock.advance(5)
    s.get(("docs",), "k", refresh_ttl=False)
    assert stored(s, "docs", "k")[lg_mod.EXPIRES_FIELD] == first
    s.get(("docs",), "k")
    renewed = stored(s, "docs", "k")[lg_mod.EXPIRES_FIELD]
    assert renewed == pytest.approx(clock.now + 600.0, rel=0, abs=1e-3)
    assert stored(s, "docs", part)[lg_mod.EXPIRES_FIELD] == renewed
    assert stored(s, "docs", part)[lg_mod.OWNER_FIELD] == "k"
    # A search whose best vector of the item is its further one renews the item too.
    clock.advance(5)
    found = s.search(("docs",), query="oolong")
    assert [i.key for i in found] == ["k"] and found[0].value == {"text": "green tea", "alt": "oolong"}
    assert stored(s, "docs", "k")[lg_mod.EXPIRES_FIELD] == pytest.approx(clock.now + 600.0, rel=0, abs=1e-3)
    assert stored(s, "docs", part)[lg_mod.EXPIRES_FIELD] == pytest.approx(clock.now + 600.0, rel=0, abs=1e-3)
    # 15 minutes after the put, 10 after the last read: still there.
    clock.advance(9.9)
    assert s.get(("docs",), "k", refresh_ttl=False) is not None
    clock.advance(0.2)
    assert s.get(("docs",), "k") is None


def test_a_refresh_within_one_percent_of_the_ttl_writes_nothing(open_store, clock):
    s = open_store()
    s.put(("docs",), "k", {"text": "tea"}, ttl=100)
    first = stored(s, "docs", "k")[lg_mod.EXPIRES_FIELD]
    clock.advance(0.5)  # 0.5% of the TTL
    s.get(("docs",), "k")
    assert stored(s, "docs", "k")[lg_mod.EXPIRES_FIELD] == first
    clock.advance(1)
    s.get(("docs",), "k")
    assert stored(s, "docs", "k")[lg_mod.EXPIRES_FIELD] == pytest.approx(clock.now + 6000.0, rel=0, abs=1e-3)


def test_ttl_config_default_ttl_refresh_on_read_and_sweep_interval(tmp_path, clock):
    s = ClagStore(index=INDEX, path=tmp_path / "s",
                  ttl={"default_ttl": 2, "refresh_on_read": False, "sweep_interval_minutes": 5})
    try:
        assert s.supports_ttl
        s.put(("docs",), "a", {"text": "tea"})  # default_ttl
        s.put(("docs",), "b", {"text": "coffee"}, ttl=None)  # explicitly none
        expires = stored(s, "docs", "a")[lg_mod.EXPIRES_FIELD]
        assert expires == pytest.approx(clock.now + 120.0, rel=0, abs=1e-3)
        assert lg_mod.EXPIRES_FIELD not in stored(s, "docs", "b")
        clock.advance(1)
        s.get(("docs",), "a")  # refresh_on_read False: no refresh
        assert stored(s, "docs", "a")[lg_mod.EXPIRES_FIELD] == expires
        clock.advance(4.5)  # expired, and the sweep interval has passed since the store opened
        s.get(("docs",), "b")  # a batch that never meets "a" still sweeps it
        assert stored(s, "docs", "a") is None
        assert s.get(("docs",), "b").value == {"text": "coffee"}
    finally:
        s.close()


def test_a_reopened_store_still_knows_its_items_expire(tmp_path, clock):
    path = tmp_path / "s"
    s = ClagStore(index=INDEX, path=path)
    s.put(("docs",), "a", {"text": "tea"}, ttl=1)
    s.put(("docs",), "b", {"text": "coffee"})
    s.close()
    clock.advance(2)
    s = ClagStore(index=INDEX, path=path)
    try:
        assert s.get(("docs",), "a") is None
        assert [i.key for i in s.search(("docs",), query="tea")] == ["b"]
        assert stored(s, "docs", "a") is None
    finally:
        s.close()


def test_putting_again_without_ttl_makes_an_item_permanent(open_store, clock):
    s = open_store()
    s.put(("docs",), "a", {"text": "tea"}, ttl=1)
    s.put(("docs",), "a", {"text": "tea, again"})
    clock.advance(60)
    assert s.get(("docs",), "a").value == {"text": "tea, again"}
    assert s.sweep_ttl() == 0


def test_sweep_ttl_counts_items_not_vectors(open_store, clock):
    s = open_store(INDEX2)
    s.put(("docs",), "a", {"text": "tea", "alt": "green"}, ttl=1)
    s.put(("docs",), "b", {"text": "coffee"}, ttl=1)
    s.put(("docs",), "c", {"text": "water"}, ttl=30)
    clock.advance(2)
    assert s.sweep_ttl() == 2
    assert [m.key for m in s.store.memories(namespace="docs").items] == ["c"]


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), "5", True])
def test_a_bad_ttl_is_refused_and_nothing_is_written(open_store, ttl):
    s = open_store()
    with pytest.raises(ValueError, match="ttl"):
        s.batch([PutOp(("docs",), "ok", {"text": "tea"}), PutOp(("docs",), "bad", {"text": "x"}, ttl=ttl)])
    assert s.store.namespaces() == []
    with pytest.raises(ValueError, match="ttl"):
        ClagStore(ttl={"default_ttl": ttl})


def test_async_reads_expire_and_refresh_too(tmp_path, clock):
    s = ClagStore(index=INDEX, path=tmp_path / "s")

    async def run():
        await s.aput(("docs",), "a", {"text": "tea"}, ttl=10)
        await s.aput(("docs",), "b", {"text": "coffee"}, ttl=1)
        clock.advance(5)
        got = await s.aget(("docs",), "a")
        found = await s.asearch(("docs",), query="coffee")
        return got, found

    try:
        got, found = asyncio.run(run())
        assert got.key == "a" and [i.key for i in found] == ["a"]
        assert stored(s, "docs", "a")[lg_mod.EXPIRES_FIELD] == pytest.approx(clock.now + 600.0, rel=0, abs=1e-3)
        assert stored(s, "docs", "b") is None
    finally:
        s.close()


def test_with_ttls_that_never_run_out_it_answers_as_inmemorystore(tmp_path, clock):
    """The same batches on InMemoryStore (no TTL) and on ClagStore with a TTL on every put."""
    ours = ClagStore(index=INDEX2, path=tmp_path / "s")
    theirs = InMemoryStore(index=INDEX2)
    batches = [
        [PutOp(("a",), "k1", {"text": "tea a k1", "alt": "green", "n": 1}, ttl=60),
         PutOp(("a", "b"), "k2", {"text": "flight a.b k2", "alt": "lisbon", "n": 2}, ttl=60),
         PutOp(("a",), "r1", {"text": "peanut", "n": 3}, index=False, ttl=60)],
        [SearchOp(("a",), None, 5, 0, "green"), GetOp(("a",), "k1"), SearchOp((), {"n": {"$gte": 2}}, 5, 0, "lisbon")],
        [PutOp(("a",), "k1", {"text": "coffee a k1", "alt": "black", "n": 4}, ttl=60), GetOp(("a",), "k1")],
        [GetOp(("a",), "k1"), SearchOp(("a",), {"n": 4}, 5, 0, "coffee"), SearchOp(("a", "b"), None, 3, 0, None)],
        [PutOp(("a", "b"), "k2", None), SearchOp(("a",), None, 10, 0, "tea")],
    ]
    try:
        for ops in batches:
            clock.advance(1)
            for a, b in zip(ours.batch(ops), theirs.batch([_no_ttl(op) for op in ops])):
                assert _shape(a) == _shape(b)
    finally:
        ours.close()


def _no_ttl(op):
    return PutOp(op.namespace, op.key, op.value, op.index) if isinstance(op, PutOp) else op


def _shape(result):
    if result is None:
        return None
    if isinstance(result, list):
        return [(i.namespace, i.key, i.value, None if i.score is None else round(i.score, 5)) for i in result]
    return (result.namespace, result.key, result.value)


def test_a_refresh_never_writes_back_a_value_replaced_since_the_read(open_store, clock):
    """abatch runs reads and writes in threads: a put may land between a read and the TTL
    refresh it causes. The refresh re-reads under the write lock and changes only the expiry."""
    s = open_store()
    s.put(("docs",), "k", {"text": "old value"}, ttl=10)
    seen = stored(s, "docs", "k")  # what a read saw
    clock.advance(5)
    s.put(("docs",), "k", {"text": "new value"}, ttl=10)
    s.put(("docs",), "p", {"text": "permanent"}, ttl=10)
    permanent_seen = stored(s, "docs", "p")
    s.put(("docs",), "p", {"text": "permanent"})  # TTL dropped since the read
    clock.advance(5)
    s._refresh([("docs", "k", seen), ("docs", "p", permanent_seen)], clock.now)
    now_k = stored(s, "docs", "k")
    assert now_k["text"] == "new value"
    assert now_k[lg_mod.EXPIRES_FIELD] == pytest.approx(clock.now + 600.0, rel=0, abs=1e-3)
    assert lg_mod.EXPIRES_FIELD not in stored(s, "docs", "p")
    assert s.get(("docs",), "k").value == {"text": "new value"}
