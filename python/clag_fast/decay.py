"""Decay and pruning policy: how old, unused memories fade, and when they are archived.

Nothing here deletes anything by itself: ``weights`` only re-ranks search results, and
``prune_mask`` only says which memories the policy would archive or delete; the store applies
it when ``MemoryStore.forget()`` is called (or periodically, when configured).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DAY = 86_400.0


@dataclass(frozen=True)
class ForgettingPolicy:
    """Time decay, access boost and pruning thresholds. All off by default.

    A memory's weight is ``strength * 0.5 ** (idle_days / half_life_days)
    * (1 + access_boost * log1p(access_count))`` where ``idle_days`` counts from the last
    access (or creation). Search scores are multiplied by it when ``half_life_days`` is set.
    """

    half_life_days: float | None = None
    access_boost: float = 0.1
    prune_below: float | None = None
    prune_action: str = "archive"  # or "delete"
    archive_clusters_after_days: float | None = None

    def __post_init__(self) -> None:
        if self.half_life_days is not None and not self.half_life_days > 0:
            raise ValueError(f"half_life_days must be > 0, got {self.half_life_days}")
        if self.access_boost < 0:
            raise ValueError(f"access_boost must be >= 0, got {self.access_boost}")
        if self.prune_action not in ("archive", "delete"):
            raise ValueError(f"prune_action must be 'archive' or 'delete', got {self.prune_action!r}")
        if self.prune_below is not None and self.half_life_days is None:
            raise ValueError("prune_below needs half_life_days (without decay nothing fades)")

    @property
    def active(self) -> bool:
        return self.half_life_days is not None

    def weights(
        self,
        now: float,
        created_at: np.ndarray,
        last_accessed: np.ndarray,
        access_count: np.ndarray,
        strength: np.ndarray,
    ) -> np.ndarray:
        """Per-row float32 weights in (0, inf); rows never accessed count from creation."""
        if self.half_life_days is None:
            return strength.astype(np.float32, copy=True)
        last = np.where(np.isnan(last_accessed), created_at, last_accessed)
        idle_days = np.maximum(now - last, 0.0) / DAY
        freshness = np.exp2(-idle_days / self.half_life_days)
        boost = 1.0 + self.access_boost * np.log1p(access_count)
        return (strength * freshness * boost).astype(np.float32)

    def prune_mask(self, weights: np.ndarray) -> np.ndarray:
        """Rows the policy would prune (weight below ``prune_below``)."""
        if self.prune_below is None:
            return np.zeros(weights.shape, dtype=bool)
        return weights < self.prune_below

    def cluster_is_stale(self, now: float, last_hit_at: float | None, created_at: float) -> bool:
        """A cluster no query has touched for ``archive_clusters_after_days``."""
        if self.archive_clusters_after_days is None:
            return False
        last = created_at if last_hit_at is None or math.isnan(last_hit_at) else last_hit_at
        return (now - last) / DAY > self.archive_clusters_after_days
