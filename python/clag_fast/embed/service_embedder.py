"""ServiceEmbedder: the default embedder of processes that answer concurrent requests (the
HTTP service, the Ray shard owners).

Kept apart from the server package so a shard owner uses it without importing FastAPI.
"""

from __future__ import annotations

import threading
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

    def __init__(self, precision: str) -> None:
        from clag_fast.embed import modelfiles

        self.precision = precision
        self.name = modelfiles.DEFAULT_MODEL  # the store records it: the default embedder's
        self.dim = self.model_dim()
        self._one: Any = None
        self._spread: Any = None
        self._lock = threading.Lock()

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
        """Embed ``texts`` -> float32 (n, dim), as ``Embedder.encode`` (repeated texts are
        the store's ``VectorCache``'s to catch)."""
        one, spread = self._one, self._spread
        if one is None:
            one, spread = self._load()
        return (spread if len(texts) >= self.SPREAD_FROM else one).encode(texts)

    def warm_up(self) -> None:
        """Load the ONNX sessions and run them on batches of several sizes and lengths, as
        coalesced requests bring them (ONNX Runtime grows its buffers on the first runs of
        each shape)."""
        for n in (1, 8, 32):
            self.encode([" ".join(["warm up the model"] * (1 + i % 12)) for i in range(n)])
