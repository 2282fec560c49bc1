"""The service embedder's cache of recent texts' vectors (``ServiceEmbedder``): a repeated text
gets the vector the model gave it, without an ONNX call; bad items are refused as without it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from clag_fast.embed.service_embedder import ServiceEmbedder
from clag_fast.server.settings import ServeConfig

TEXTS = ["What does the user like?", "Who booked the rental car?", "a much longer sentence about the weekend "
         "trip to the museum and the tickets nobody paid for", "LOUD TEXT!!! 12345 🙂"]


class Counting(ServiceEmbedder):
    """Counts the texts that reach the model."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.embedded: list[str] = []

    def _encode(self, texts):
        self.embedded += list(texts)
        return super()._encode(texts)


def test_int8_cached_rows_are_the_vectors_each_text_gets_alone():
    plain = ServiceEmbedder("int8", cache_size=0)
    alone = np.vstack([plain.encode([t]) for t in TEXTS])
    e = Counting("int8", cache_size=16)
    first = e.encode([TEXTS[0], TEXTS[1], TEXTS[0]])  # a repeat within one call is embedded once
    assert e.embedded == TEXTS[:2]
    again = e.encode(TEXTS[::-1])
    assert e.embedded == TEXTS[:2] + [TEXTS[3], TEXTS[2]]  # only the new ones
    np.testing.assert_array_equal(first, alone[[0, 1, 0]])
    np.testing.assert_array_equal(again, alone[::-1])
    assert (e.cache_hits, e.cache_misses) == (3, 4)
    # Rows handed out are copies: a caller writing into its array leaves the cache as it was.
    again[:] = 0
    np.testing.assert_array_equal(e.encode([TEXTS[2]]), alone[[2]])


def test_fp32_cached_rows_are_what_the_model_gave():
    e = Counting("fp32", cache_size=16)
    first = e.encode(TEXTS)
    got = e.encode([TEXTS[2], TEXTS[0]])
    assert e.embedded == TEXTS
    np.testing.assert_array_equal(got, first[[2, 0]])


def test_least_recently_used_goes_first_and_long_texts_are_not_kept():
    e = Counting("int8", cache_size=2)
    e.encode(TEXTS[:2])
    e.encode([TEXTS[0]])  # TEXTS[0] is now the most recent
    e.encode([TEXTS[2]])  # evicts TEXTS[1]
    e.encode([TEXTS[0], TEXTS[1]])
    assert e.embedded == TEXTS[:3] + [TEXTS[1]]
    long = "word " * (ServiceEmbedder.CACHE_MAX_CHARS // 5 + 1)
    e.encode([long])
    e.encode([long])
    assert e.embedded[-2:] == [long, long]
    assert len(e._cache) <= 2


@pytest.mark.parametrize("bad, index", [(["fine text", ""], 1), (["fine text", "  "], 1), ([b"bytes"], 0),
                                        (["fine text", "fine text", "lone \ud800 surrogate"], 2)])
def test_bad_items_are_refused_naming_their_index(bad, index):
    e = ServiceEmbedder("int8", cache_size=16)
    e.encode(["fine text"])  # cached: the error still names the index among all the texts
    with pytest.raises(ValueError, match=rf"texts\[{index}\]"):
        e.encode(bad)


def test_cache_size_is_checked():
    with pytest.raises(ValueError, match="cache_size"):
        ServiceEmbedder("int8", cache_size=-1)
    with pytest.raises(ValueError, match="embed_cache"):
        ServeConfig(store="s", embed_cache=-1)


def test_threads_sharing_the_cache_get_each_text_its_own_vector():
    texts = [f"question number {i} about the trip" for i in range(12)]
    alone = {t: ServiceEmbedder("int8", cache_size=0).encode([t])[0] for t in texts}
    e = ServiceEmbedder("int8", cache_size=8)  # smaller than the texts: evictions under way too
    wrong: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(20):
            batch = [texts[i] for i in rng.integers(0, len(texts), size=int(rng.integers(1, 10)))]
            for t, v in zip(batch, e.encode(batch)):
                if not np.array_equal(v, alone[t]):
                    wrong.append(t)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
    assert e.cache_hits > 0 and len(e._cache) <= 8


def test_warm_up_runs_the_model_past_the_cache():
    e = Counting("int8", cache_size=16)
    e.warm_up()
    assert len(e.embedded) == 1 + 8 + 32  # every text reached the model, the spread batch too
    if e._spread._workers > 1:  # the 32-text batch was spread over the cores: its session is made
        assert e._spread._narrow is not None
    assert (e.cache_hits, e.cache_misses, len(e._cache)) == (0, 0, 0)
