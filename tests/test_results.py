"""The result types users receive: hits built on the search path are real, frozen ``Hit``s."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from clag_fast import MemoryStore, StoreConfig
from clag_fast.results import Hit, _HitBuilder, make_hit


def test_hit_builder_has_hits_fields_in_order():
    # make_hit relies on the builder's slot layout matching Hit's exactly.
    assert _HitBuilder.__slots__ == tuple(f.name for f in dataclasses.fields(Hit))


def test_make_hit_equals_the_constructor_and_is_frozen():
    args = (7, "text", 0.5, 3, "summary", ["t"], "note", "ns", 1.0, {"a": 1}, "k")
    h = make_hit(*args)
    assert type(h) is Hit
    assert h == Hit(*args)
    assert repr(h) == repr(Hit(*args))
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.score = 1.0  # type: ignore[misc]
    assert dataclasses.replace(h, score=0.9).score == 0.9
    assert dataclasses.asdict(h)["key"] == "k"


def test_search_hits_are_frozen_hits_and_accesses_reach_the_database(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 16)).astype(np.float32)
    found: Counter[int] = Counter()
    with MemoryStore.open(tmp_path / "s", config=StoreConfig(dim=16), slm=False, embedder=False) as store:
        ids = store.add_many([f"m{i}" for i in range(50)], embeddings=x)
        hits = store.search(x[3], k=3)
        assert all(type(h) is Hit for h in hits)
        assert hits[0].memory_id == ids[3]
        with pytest.raises(dataclasses.FrozenInstanceError):
            hits[0].text = "changed"  # type: ignore[misc]
        found.update(h.memory_id for h in hits)
        for i in (3, 4, 4, 9):
            found.update(h.memory_id for h in store.search(x[i], k=2))
        store.delete(ids[3])  # deleted before the flush: skipped, the others written
        del found[ids[3]]
        store.flush()
        got = {m: store.get(m).access_count for m in ids if m != ids[3]}
        assert got == {m: found[m] for m in got}
        assert found[ids[4]] >= 2
    with MemoryStore.open(tmp_path / "s", config=StoreConfig(dim=16), slm=False, embedder=False) as store:
        assert {m: store.get(m).access_count for m in got} == got


def test_accesses_survive_upserts_and_batching(tmp_path):
    """Accesses are applied in batches; an update that moves a memory to a new row before the
    flush carries its unwritten accesses along (by key and by id)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 16)).astype(np.float32)
    with MemoryStore.open(tmp_path / "s", config=StoreConfig(dim=16), slm=False, embedder=False) as store:
        ids = store.add_many([f"m{i}" for i in range(40)], embeddings=x, keys=[f"k{i}" for i in range(40)])
        for _ in range(300):  # more than one batch
            store.search(x[0], k=1)
        for _ in range(3):
            store.search(x[1], k=1)
        store.add("m0 again", embedding=x[0] + 0.01, key="k0")  # upsert: a new row for k0
        store.update(ids[1], text="m1 again", embedding=x[1] + 0.01)  # a new row for ids[1]
        store.search(x[1], k=1)
        store.flush()
        assert store.get(ids[0]).access_count == 300
        assert store.get(ids[1]).access_count == 4
        assert store.get(ids[2]).access_count == 0
