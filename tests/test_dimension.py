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
    with MemoryStore.open(path, config=StoreConfig(dim=64, slm="off"), embedder=False, llm=False) as s:
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
    with MemoryStore.open(path, embedder=False, llm=False) as s:  # no config: the stored dim
        assert s.config.dim == 64 and s.search(vecs[3], k=1)[0].memory_id == ids[3]
    with pytest.raises(DimensionMismatchError, match="holds 64-dimensional vectors, config says dim=128"):
        MemoryStore.open(path, config=StoreConfig(dim=128), embedder=False, llm=False)
    with pytest.raises(ValueError):  # a ValueError, for callers that catch those
        MemoryStore.open(path, config=StoreConfig(dim=384), embedder=False, llm=False)


def test_injected_embedder_sets_the_width_and_is_recorded(tmp_path):
    path = tmp_path / "e"
    with MemoryStore.open(path, embedder=HashingEmbedder(96), llm=False, config=None) as s:
        assert s.config.dim == 96
        mid = s.add("ninety six wide vectors")
        assert s.search("wide vectors", k=1)[0].memory_id == mid
    with MemoryStore.open(path, embedder=HashingEmbedder(96), llm=False) as s:
        assert s.get(mid).text == "ninety six wide vectors"
    with pytest.raises(DimensionMismatchError, match="'HashingEmbedder', opened with 'OtherEmbedder'"):
        MemoryStore.open(path, embedder=OtherEmbedder(), llm=False)
    with pytest.raises(DimensionMismatchError, match="'HashingEmbedder', opened with 'acme/embed-v2'"):
        MemoryStore.open(path, embedder=NamedEmbedder(), llm=False)
    with pytest.raises(DimensionMismatchError, match="makes 384-dimensional vectors.*holds 96"):
        MemoryStore.open(path, embedder=HashingEmbedder(384), llm=False)
    # bringing vectors is always allowed: the caller vouches for them
    with MemoryStore.open(path, embedder=False, llm=False) as s:
        assert len(s) == 1


def test_embedder_and_config_disagree_at_creation(tmp_path):
    with pytest.raises(DimensionMismatchError, match="makes 96-dimensional.*holds 64"):
        MemoryStore.open(tmp_path / "x", config=StoreConfig(dim=64), embedder=HashingEmbedder(96), llm=False)
    # nothing was recorded: the directory can still become a 96-d store
    with MemoryStore.open(tmp_path / "x", embedder=HashingEmbedder(96), llm=False) as s:
        assert s.config.dim == 96


def test_an_embedder_of_the_wrong_width_writes_nothing(tmp_path):
    with MemoryStore.open(tmp_path / "w", config=StoreConfig(dim=12, slm="off"), embedder=WrongWidth(),
                          llm=False) as s:
        with pytest.raises(DimensionMismatchError, match=r"returned shape \(2, 10\).*12-dimensional"):
            s.add_many(["a", "b"])
        assert len(s) == 0 and s.stats()["vector_rows"] == 0


def test_default_embedder_is_recorded_by_name(tmp_path):
    path = tmp_path / "d"
    with MemoryStore.open(path, llm=False):  # the default MiniLM embedder (not loaded: nothing added)
        pass
    with pytest.raises(DimensionMismatchError, match="'minilm-l6', opened with 'HashingEmbedder'"):
        MemoryStore.open(path, embedder=HashingEmbedder(), llm=False)


def test_a_store_of_brought_vectors_accepts_an_embedder(tmp_path):
    path = tmp_path / "b"
    vecs = HashingEmbedder().encode(["red apples", "blue sky"])
    with MemoryStore.open(path, embedder=False, llm=False) as s:
        s.add_many(["red apples", "blue sky"], embeddings=vecs)
    with MemoryStore.open(path, embedder=HashingEmbedder(), llm=False) as s:
        assert s.search("apples", k=1)[0].text == "red apples"
