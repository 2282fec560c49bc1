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


#: LangGraph's index configs for the adapter tests: 8-dim hash vectors of one or two fields.
LG_DIMS = 8


def hash_embed(texts: list[str]) -> list[list[float]]:
    """A LangGraph embed function: a fixed random vector per text (seeded by its hash):
    deterministic, and distinct texts get clearly different similarities."""
    out = []
    for t in texts:
        seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
        out.append(np.random.default_rng(seed).standard_normal(LG_DIMS).tolist())
    return out


LG_INDEX = {"dims": LG_DIMS, "embed": hash_embed, "fields": ["text"]}
# Two fields: one vector per field in both stores, searches max-pool over them.
LG_INDEX2 = {"dims": LG_DIMS, "embed": hash_embed, "fields": ["text", "alt"]}
