"""The store's cache of recently embedded texts' vectors (``embed.vector_cache.VectorCache``):
a repeated text gets the vector the model gave it, without another model call; bad items are
refused as without it; writes do not clear it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from clag_fast.config import StoreConfig
from clag_fast.embed import vector_cache
from clag_fast.embed.service_embedder import ServiceEmbedder
from clag_fast.embed.vector_cache import VectorCache
from clag_fast.server.settings import ServeConfig
from clag_fast.store import MemoryStore

DIM = 384
TEXTS = ["What does the user like?", "Who booked the rental car?", "a much longer sentence about the weekend "
         "trip to the museum and the tickets nobody paid for", "LOUD TEXT!!! 12345 🙂"]


def enc(cache, texts, embed, remember=True):
    return cache.encode(texts, embed, DIM, remember)


class Counting:
    """A real embedder (the service's, at a given precision) that records the texts it saw."""

    def __init__(self, precision: str) -> None:
        self.model = ServiceEmbedder(precision)
        self.dim, self.name = self.model.dim, self.model.name
        self.embedded: list[str] = []

    def encode(self, texts):
        self.embedded += list(texts)
        return self.model.encode(texts)


def test_int8_cached_rows_are_the_vectors_each_text_gets_alone():
    plain = ServiceEmbedder("int8")
    alone = np.vstack([plain.encode([t]) for t in TEXTS])
    e, cache = Counting("int8"), VectorCache(16)
    first = enc(cache, [TEXTS[0], TEXTS[1], TEXTS[0]], e.encode)  # a repeat within one call: embedded once
    assert e.embedded == TEXTS[:2]
    again = enc(cache, TEXTS[::-1], e.encode)
    assert e.embedded == TEXTS[:2] + [TEXTS[3], TEXTS[2]]  # only the new ones
    # int8 embeds the missing texts in one call: each row is its text's vector alone up to the
    # float rounding of the pooling sum; a hit is bit for bit the row the model gave.
    np.testing.assert_allclose(first, alone[[0, 1, 0]], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(first[2], first[0])
    np.testing.assert_allclose(again, alone[::-1], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(again[2:], first[[1, 0]])
    assert (cache.hits, cache.misses) == (3, 4)
    # Rows handed out are copies: a caller writing into its array leaves the cache as it was.
    kept = again[1].copy()
    again[:] = 0
    np.testing.assert_array_equal(enc(cache, [TEXTS[2]], e.encode)[0], kept)


def test_fp32_cached_rows_are_what_the_model_gave():
    e, cache = Counting("fp32"), VectorCache(16)
    first = enc(cache, TEXTS, e.encode)
    got = enc(cache, [TEXTS[2], TEXTS[0]], e.encode)
    assert e.embedded == TEXTS
    np.testing.assert_array_equal(got, first[[2, 0]])


def test_least_recently_used_goes_first_and_long_texts_are_not_kept():
    e, cache = Counting("int8"), VectorCache(2)
    enc(cache, TEXTS[:2], e.encode)
    enc(cache, [TEXTS[0]], e.encode)  # TEXTS[0] is now the most recent
    enc(cache, [TEXTS[2]], e.encode)  # evicts TEXTS[1]
    enc(cache, [TEXTS[0], TEXTS[1]], e.encode)
    assert e.embedded == TEXTS[:3] + [TEXTS[1]]
    long = "word " * (vector_cache.MAX_CHARS // 5 + 1)
    enc(cache, [long], e.encode)
    enc(cache, [long], e.encode)
    assert e.embedded[-2:] == [long, long]
    assert len(cache) <= 2


@pytest.mark.parametrize("bad, index", [(["fine text", ""], 1), (["fine text", "  "], 1), ([b"bytes"], 0),
                                        (["fine text", "fine text", "lone \ud800 surrogate"], 2)])
def test_bad_items_are_refused_naming_their_index(bad, index):
    e, cache = ServiceEmbedder("int8"), VectorCache(16)
    enc(cache, ["fine text"], e.encode)  # cached: the error still names the index among all the texts
    with pytest.raises(ValueError, match=rf"texts\[{index}\]"):
        enc(cache, bad, e.encode)


def test_sizes_are_checked():
    for bad in (-1, True, 2.5):
        with pytest.raises(ValueError, match="embed_cache"):
            VectorCache(bad)
    with pytest.raises(ValueError, match="embed_cache"):
        StoreConfig(embed_cache=-1)
    with pytest.raises(ValueError, match="embed_cache"):
        ServeConfig(store="s", embed_cache=-1)


def test_threads_sharing_the_cache_get_each_text_its_own_vector():
    texts = [f"question number {i} about the trip" for i in range(12)]
    model = ServiceEmbedder("int8")
    alone = {t: model.encode([t])[0] for t in texts}
    cache = VectorCache(8)  # smaller than the texts: evictions under way too
    wrong: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(20):
            batch = [texts[i] for i in rng.integers(0, len(texts), size=int(rng.integers(1, 10)))]
            for t, v in zip(batch, enc(cache, batch, model.encode)):
                if not np.array_equal(v, alone[t]):
                    wrong.append(t)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))  # a worker's exception is raised here, not lost in its thread
    assert not wrong
    assert cache.hits > 0 and len(cache) <= 8


@pytest.mark.parametrize("size", [4096, 0])
def test_the_store_embeds_a_repeated_query_once_across_writes(tmp_path, size):
    """In-process: a query asked again after a write (the result cache is cleared) is searched
    afresh with the vector it had; embed_cache=0 embeds it every time."""
    e = Counting("int8")
    cfg = StoreConfig(min_memories_to_cluster=50, organize_every=0, slm="off", embed_cache=size)
    with MemoryStore.open(tmp_path / "s", config=cfg, embedder=e, slm=False) as s:
        s.add_many(TEXTS[1:])
        first = s.search(TEXTS[0], k=2)
        s.add("another memory about the museum")
        again = s.search(TEXTS[0], k=3)
        assert not again.cached and again[0].memory_id == first[0].memory_id
        assert e.embedded.count(TEXTS[0]) == (1 if size else 2)
        stats = s.stats()["embed_cache"]
        # Added texts are looked up, not kept: a bulk ingest must not evict the queries.
        assert stats["hits"] == (1 if size else 0) and stats["size"] == (1 if size else 0)


def test_adds_look_texts_up_without_keeping_them():
    e, cache = Counting("int8"), VectorCache(16)
    enc(cache, TEXTS[:2], e.encode, remember=False)
    assert len(cache) == 0
    enc(cache, [TEXTS[0]], e.encode)  # a query: kept
    enc(cache, [TEXTS[0], TEXTS[2]], e.encode, remember=False)  # an add: finds it, keeps nothing new
    assert e.embedded == [TEXTS[0], TEXTS[1], TEXTS[0], TEXTS[2]] and len(cache) == 1


def test_a_misbehaving_embedder_is_not_cached():
    cache = VectorCache(16)
    wide = lambda texts: np.ones((len(texts), DIM + 1), np.float32)  # noqa: E731
    short = lambda texts: np.ones((max(0, len(texts) - 1), DIM), np.float32)  # noqa: E731
    assert enc(cache, TEXTS[:2], wide).shape == (2, DIM + 1)  # the caller's shape check names it
    assert enc(cache, TEXTS[:2], short).shape == (1, DIM)
    assert len(cache) == 0
