"""Small deterministic embedders for the adapter tests (offline, no model files)."""

from __future__ import annotations

import hashlib

import numpy as np


class HashEncoder:
    """A clag_fast embedder: a fixed random unit vector per text, seeded by its hash. Distinct
    texts get clearly different vectors, so rankings by similarity are unambiguous."""

    name = "hash-encoder"

    def __init__(self, dim: int = 16) -> None:
        self.dim = dim

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(self.dim)
            out[i] = v / np.linalg.norm(v)
        return out
