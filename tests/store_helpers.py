"""Synthetic data for store tests: topic-clustered unit vectors with texts to match."""

from __future__ import annotations

import numpy as np

DIM = 384


def topic_vectors(n: int, n_topics: int, *, seed: int = 0, spread: float = 0.35, dim: int = DIM):
    """``n`` unit vectors around ``n_topics`` random centres; returns (vectors, topic of each)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_topics, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    topics = rng.integers(0, n_topics, size=n)
    noise = rng.standard_normal((n, dim)).astype(np.float32) * spread / np.sqrt(dim) * 4
    v = centres[topics] + noise
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v.astype(np.float32), topics


def texts_for(topics: np.ndarray, start: int = 0) -> list[str]:
    return [f"memory {start + i} about topic {t}" for i, t in enumerate(topics.tolist())]


def exact_top(vectors: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    """Indices of the exact top-k rows by cosine (vectors are unit length)."""
    q = query / np.linalg.norm(query)
    return np.argsort(-(vectors @ q), kind="stable")[:k]
