"""Any dimension: a store keeps the width and the embedder it was created with, refuses a
mismatch on reopen naming both, and refuses vectors of another width with nothing written."""

from __future__ import annotations

import numpy as np
import pytest

from clag_fast import DimensionMismatchError, MemoryStore, StoreConfig
from clag_fast.eval.runner import HashingEmbedder
from store_helpers import topic_vectors


class OtherEmbedder:
    """A second embedder of the same width as HashingEmbedder(96), under another name."""

    dim = 96

    def encode(self, texts):
        return HashingEmbedder(96).encode([t[::-1] for t in texts])


class NamedEmbedder(OtherEmbedder):
    name = "acme/embed-v2"


class WrongWidth:
    """Says nothing about its width and returns 10-dimensional vectors."""

    def encode(self, texts):
        return np.ones((len(texts), 10), np.float32)


def test_brought_vectors_of_any_width(tmp_path):
    path = tmp_path / "s"
    vecs, _ = topic_vectors(50, 3, seed=1, dim=64)
    with MemoryStore.open(path, config=StoreConfig(dim=64, slm="off"), embedder=False, slm=False) as s:
        ids = s.add_many([f"t{i}" for i in range(50)], embeddings=vecs)
        assert s.search(vecs[7], k=1)[0].memory_id == ids[7]
        rows = s.stats()["vector_rows"]
        with pytest.raises(DimensionMismatchError, match=r"shape \(2, 64\), got \(2, 32\)"):
            s.add_many(["a", "b"], embeddings=np.ones((2, 32), np.float32))
        with pytest.raises(DimensionMismatchError, match=r"\(64,\), got \(384,\)"):
            s.search(np.ones(384, np.float32))
        with pytest.raises(DimensionMismatchError, match=r"\(q, 64\)"):
            s.search_many(np.ones((2, 63), np.float32))
        assert len(s) == 50 and s.stats()["vector_rows"] == rows
    with MemoryStore.open(path, embedder=False, slm=False) as s:  # no config: the stored dim
        assert s.config.dim == 64 and s.search(vecs[3], k=1)[0].memory_id == ids[3]
    with pytest.raises(DimensionMismatchError, match="holds 64-dimensional vectors, config says dim=128"):
        MemoryStore.open(path, config=StoreConfig(dim=128), embedder=False, slm=False)
    with pytest.raises(ValueError):  # a ValueError, for callers that catch those
        MemoryStore.open(path, config=StoreConfig(dim=384), embedder=False, slm=False)


def test_injected_embedder_sets_the_width_and_is_recorded(tmp_path):
    path = tmp_path / "e"
    with MemoryStore.open(path, embedder=HashingEmbedder(96), slm=False, config=None) as s:
        assert s.config.dim == 96
        mid = s.add("ninety six wide vectors")
        assert s.search("wide vectors", k=1)[0].memory_id == mid
    with MemoryStore.open(path, embedder=HashingEmbedder(96), slm=False) as s:
        assert s.get(mid).text == "ninety six wide vectors"
    with pytest.raises(DimensionMismatchError, match="'HashingEmbedder', opened with 'OtherEmbedder'"):
        MemoryStore.open(path, embedder=OtherEmbedder(), slm=False)
    with pytest.raises(DimensionMismatchError, match="'HashingEmbedder', opened with 'acme/embed-v2'"):
        MemoryStore.open(path, embedder=NamedEmbedder(), slm=False)
    with pytest.raises(DimensionMismatchError, match="makes 384-dimensional vectors.*holds 96"):
        MemoryStore.open(path, embedder=HashingEmbedder(384), slm=False)
    # bringing vectors is always allowed: the caller vouches for them
    with MemoryStore.open(path, embedder=False, slm=False) as s:
        assert len(s) == 1


def test_embedder_and_config_disagree_at_creation(tmp_path):
    with pytest.raises(DimensionMismatchError, match="makes 96-dimensional.*holds 64"):
        MemoryStore.open(tmp_path / "x", config=StoreConfig(dim=64), embedder=HashingEmbedder(96), slm=False)
    # nothing was recorded: the directory can still become a 96-d store
    with MemoryStore.open(tmp_path / "x", embedder=HashingEmbedder(96), slm=False) as s:
        assert s.config.dim == 96


def test_an_embedder_of_the_wrong_width_writes_nothing(tmp_path):
    with MemoryStore.open(tmp_path / "w", config=StoreConfig(dim=12, slm="off"), embedder=WrongWidth(),
                          slm=False) as s:
        with pytest.raises(DimensionMismatchError, match=r"returned shape \(2, 10\).*12-dimensional"):
            s.add_many(["a", "b"])
        assert len(s) == 0 and s.stats()["vector_rows"] == 0


def test_default_embedder_is_recorded_by_name(tmp_path):
    path = tmp_path / "d"
    with MemoryStore.open(path, slm=False):  # the default MiniLM embedder (not loaded: nothing added)
        pass
    with pytest.raises(DimensionMismatchError, match="'minilm-l6', opened with 'HashingEmbedder'"):
        MemoryStore.open(path, embedder=HashingEmbedder(), slm=False)


def test_a_store_of_brought_vectors_accepts_an_embedder(tmp_path):
    path = tmp_path / "b"
    vecs = HashingEmbedder().encode(["red apples", "blue sky"])
    with MemoryStore.open(path, embedder=False, slm=False) as s:
        s.add_many(["red apples", "blue sky"], embeddings=vecs)
    with MemoryStore.open(path, embedder=HashingEmbedder(), slm=False) as s:
        assert s.search("apples", k=1)[0].text == "red apples"


# -- a width fixed by the first vectors ------------------------------------------------------
def test_a_new_store_takes_the_width_of_its_first_vectors(tmp_path):
    path = tmp_path / "byo"
    vecs = np.random.default_rng(0).standard_normal((2, 1536)).astype(np.float32)
    with MemoryStore.open(path, config=StoreConfig(slm="off"), embedder=False, slm=False) as s:
        assert s.config.dim is None  # pending: nothing written yet
        assert len(s.search(np.ones(7, np.float32))) == 0  # any width finds nothing yet
        assert [len(h) for h in s.search_many(np.ones((2, 5), np.float32))] == [0, 0]
        ids = s.add_many(["a", "b"], embeddings=vecs)
        assert s.config.dim == 1536
        assert s.search(vecs[1], k=1)[0].memory_id == ids[1]
        with pytest.raises(DimensionMismatchError, match=r"shape \(1, 1536\), got \(1, 384\)"):
            s.add_many(["c"], embeddings=np.ones((1, 384), np.float32))
        assert len(s) == 2
    with MemoryStore.open(path, embedder=False, slm=False) as s:  # recorded and enforced after
        assert s.config.dim == 1536 and s.get(ids[0]).text == "a"
    with pytest.raises(DimensionMismatchError, match="holds 1536-dimensional vectors, config says dim=384"):
        MemoryStore.open(path, config=StoreConfig(dim=384), embedder=False, slm=False)


def test_the_default_embedder_store_takes_brought_vectors_of_another_width(tmp_path):
    # The case: MemoryStore.open(path, slm=False), then 1536-d vectors.
    path = tmp_path / "d"
    vecs = np.random.default_rng(1).standard_normal((3, 1536)).astype(np.float32)
    with MemoryStore.open(path, slm=False) as s:
        s.add_many(["x", "y", "z"], embeddings=vecs)
        assert s.config.dim == 1536
        # Texts cannot be embedded by the 384-d default model into this store: a clear error.
        with pytest.raises(DimensionMismatchError, match="minilm-l6.*1536-dimensional"):
            s.add("a text to embed")
        assert len(s) == 3
    # The store now records brought vectors: any embedder of that width may open it.
    with MemoryStore.open(path, embedder=HashingEmbedder(1536), slm=False) as s:
        assert len(s.search("x", k=1, lexical_weight=0)) == 1


def test_an_explicit_width_and_a_stating_embedder_still_fix_it_at_creation(tmp_path):
    with MemoryStore.open(tmp_path / "c", config=StoreConfig(dim=64), embedder=False, slm=False) as s:
        assert s.config.dim == 64
        with pytest.raises(DimensionMismatchError, match=r"shape \(1, 64\), got \(1, 32\)"):
            s.add_many(["a"], embeddings=np.ones((1, 32), np.float32))
    with MemoryStore.open(tmp_path / "e", embedder=HashingEmbedder(96), slm=False) as s:
        assert s.config.dim == 96


def test_an_embedder_without_a_stated_width_fixes_it_with_its_first_output(tmp_path):
    with MemoryStore.open(tmp_path / "w", config=StoreConfig(slm="off"), embedder=WrongWidth(), slm=False) as s:
        assert s.config.dim is None
        s.add_many(["a", "b"])
        assert s.config.dim == 10 and len(s) == 2


def test_a_pending_store_reopened_stays_pending_or_takes_the_width_asked(tmp_path):
    path = tmp_path / "p"
    MemoryStore.open(path, embedder=False, slm=False).close()
    with MemoryStore.open(path, embedder=False, slm=False) as s:
        assert s.config.dim is None
    with MemoryStore.open(path, embedder=False, slm=False, read_only=True) as r:
        assert r.config.dim is None and len(r.search(np.ones(12, np.float32))) == 0
    with MemoryStore.open(path, config=StoreConfig(dim=48), embedder=False, slm=False) as s:
        assert s.config.dim == 48  # an empty store takes the width asked for
    with pytest.raises(DimensionMismatchError, match="holds 48-dimensional"):
        MemoryStore.open(path, config=StoreConfig(dim=96), embedder=False, slm=False)


def test_a_reader_follows_the_writer_fixing_the_width(tmp_path):
    path = tmp_path / "r"
    vecs = np.random.default_rng(2).standard_normal((4, 200)).astype(np.float32)
    with MemoryStore.open(path, embedder=False, slm=False) as w:
        with MemoryStore.open(path, embedder=False, slm=False, read_only=True) as r:
            assert r.config.dim is None
            ids = w.add_many(list("abcd"), embeddings=vecs)
            w.flush()
            r.refresh()
            assert r.config.dim == 200 and r.search(vecs[2], k=1)[0].memory_id == ids[2]


def test_store_handle_opens_an_existing_pending_store_at_the_first_width(tmp_path):
    from clag_fast.integrations.storehandle import StoreHandle

    path = tmp_path / "h"
    MemoryStore.open(path, embedder=False, slm=False).close()
    handle = StoreHandle(path=path)
    try:
        assert handle.dim is None
        store = handle.ensure(24)
        store.add_many(["a"], embeddings=np.ones((1, 24), np.float32))
        assert handle.dim == 24
        with pytest.raises(DimensionMismatchError, match="width 25"):
            handle.ensure(25)
    finally:
        handle.close()


def test_store_config_dim_is_checked():
    assert StoreConfig().dim is None
    for bad in (0, -3, 1.5, True, "384"):
        with pytest.raises(ValueError, match="dim must be a positive int or None"):
            StoreConfig(dim=bad)
