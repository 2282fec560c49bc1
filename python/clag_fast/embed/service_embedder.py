"""ServiceEmbedder: the default embedder of processes that answer concurrent requests (the
HTTP service, the Ray shard owners).

Kept apart from the server package so a shard owner uses it without importing FastAPI.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np


class ServiceEmbedder:
    """The store's embedder in the service (and in each Ray shard owner): the default ONNX
    MiniLM model at the store's recorded precision, loaded on first use, on 1-thread ONNX
    sessions.

    Why not the default ``Embedder()``: it runs a single text as one ONNX call split over
    every core, whose intra-op threads spin while they wait for work. In-process that buys a
    lower latency for one caller; in the service, requests already run side by side (search
    batches, the add batches) and every spinning thread takes a core from them: measured at a
    load average of 8 on 2 cores, 8.7 ms of CPU per single-text encode against 1.4 ms on one
    thread. Larger
    batches (an organisation's phrases) are still spread, one 1-thread call per core
    (``Embedder``'s own spreading, which makes no spinning calls).
    """

    #: Texts from which one encode is spread over the cores.
    SPREAD_FROM = 8
    #: Longer texts are not kept in the cache (a 32k-character text as a key would cost more
    #: memory than its vector; repeats are short queries and label phrases).
    CACHE_MAX_CHARS = 2048

    def __init__(self, precision: str, cache_size: int = 4096) -> None:
        """cache_size: vectors of recent texts kept (LRU; 0: none), ~1.6 kB each at dim 384."""
        from clag_fast.embed import modelfiles

        if not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be a non-negative int, got {cache_size!r}")
        self.precision = precision
        self.name = modelfiles.DEFAULT_MODEL  # the store records it: the default embedder's
        self.dim = self.model_dim()
        self._one: Any = None
        self._spread: Any = None
        self._lock = threading.Lock()
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_lock = threading.Lock()
        self.cache_hits = 0
        self.cache_misses = 0

    @staticmethod
    def model_dim() -> int:
        """The width of the vectors the default model makes (read from its manifest)."""
        from clag_fast.embed import modelfiles

        return int(modelfiles.manifest(modelfiles.DEFAULT_MODEL)["dim"])

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._one is None:
                from clag_fast.embed.embedder import Embedder

                spread = Embedder(self.name, precision=self.precision)
                self._one = Embedder(self.name, precision=self.precision, threads=1)
                self._spread = spread
            return self._one, self._spread

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` -> float32 (n, dim), as ``Embedder.encode``.

        A text embedded recently is not embedded again: its vector comes from the cache (the
        row the model gave it then), and a text repeated within ``texts`` is embedded once.
        Agents repeat queries, and every re-organisation embeds its clusters' label phrases,
        most of them the same as the pass before. The cached row is the one a new call would
        give: the model's vector of a text does not depend on the other texts of its call at
        int8 (one ONNX call per text, ``Embedder``), and at fp32 only within float rounding
        (padding), as between the service's coalesced batches anyway."""
        texts = list(texts)
        if not self.cache_size or not all(type(t) is str for t in texts):
            return self._encode(texts)  # a wrong item is the embedder's to refuse
        out = np.empty((len(texts), self.dim), np.float32)
        missing: dict[str, list[int]] = {}
        with self._cache_lock:
            cache = self._cache
            for i, t in enumerate(texts):
                row = cache.get(t)
                if row is None:
                    missing.setdefault(t, []).append(i)
                else:
                    cache.move_to_end(t)
                    out[i] = row
            self.cache_hits += len(texts) - len(missing)  # repeats within the call count too
            self.cache_misses += len(missing)
        if not missing:
            return out
        # Bad items (not str, empty, unencodable) are refused by the embedder, as without a
        # cache; the error names its index among the texts embedded, so pass them all then.
        fresh = list(missing)
        try:
            vecs = self._encode(fresh)
        except ValueError:
            return self._encode(texts)
        with self._cache_lock:
            for t, row in zip(fresh, vecs):
                out[missing[t]] = row
                if len(t) <= self.CACHE_MAX_CHARS:
                    cache[t] = row.copy()
            while len(cache) > self.cache_size:
                cache.popitem(last=False)
        return out

    def warm_up(self) -> None:
        """Load the ONNX sessions and run them on batches of several sizes and lengths, as
        coalesced requests bring them (ONNX Runtime grows its buffers on the first runs of
        each shape). Past the cache, which would answer most of these texts."""
        for n in (1, 8, 32):
            self._encode([" ".join(["warm up the model"] * (1 + i % 12)) for i in range(n)])

    def _encode(self, texts: list[str]) -> np.ndarray:
        one, spread = self._one, self._spread
        if one is None:
            one, spread = self._load()
        return (spread if len(texts) >= self.SPREAD_FROM else one).encode(texts)
