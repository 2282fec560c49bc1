"""Triggers: when the store should re-organise itself.

Pure bookkeeping (no I/O, no SLM), thread-safe, so the store can feed it from ``add()`` and
``search()`` on any thread and poll :meth:`Triggers.due`:

* explicit: :meth:`Triggers.request` (``store.organize()``);
* periodic: every ``organize_every`` new memories since the last re-organisation;
* confusion: the last ``confusion_window`` searches all had a best score below
  ``confusion_threshold`` (the clusters no longer match what is asked);
* drift: the mean affinity of the last ``drift_window`` assignments fell by at least
  ``drift_drop`` versus the ``drift_window`` before them (new memories fit the clusters worse
  and worse).

``due()`` only looks; ``reset()`` (after the re-organisation ran) clears every trigger.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import Any

from clag_fast.config import SLMConfig

__all__ = ["Triggers", "REASONS"]

# In priority order: the first that holds is what due() reports.
REASONS = ("explicit", "periodic", "drift", "confusion")


class Triggers:
    """Decides when re-organisation is due. See the module docstring for the four triggers.

    Args:
        config: the thresholds (``confusion_window``, ``confusion_threshold``,
            ``drift_window``, ``drift_drop``); default ``SLMConfig()``.
        organize_every: the periodic trigger's period in new memories (0 = never); the store
            raises it as it grows (``StoreConfig.organize_period``).
    """

    def __init__(self, config: SLMConfig | None = None, organize_every: int = 50):
        if not isinstance(organize_every, int) or organize_every < 0:
            raise ValueError(f"organize_every must be an int >= 0, got {organize_every!r}")
        self.config = config if config is not None else SLMConfig()
        self.organize_every = organize_every
        self._lock = threading.Lock()
        self._adds = 0
        self._explicit = False
        self._searches: deque[float] = deque(maxlen=self.config.confusion_window)
        self._low_streak = 0  # consecutive searches below confusion_threshold, the latest last
        self._affinities: deque[float] = deque(maxlen=2 * self.config.drift_window)

    def on_add(self, affinity: float | None = None, n: int = 1) -> None:
        """Record ``n`` new memories; ``affinity``: similarity of the memory to the centre of
        the cluster it was assigned to (None before clustering, or for a new cluster)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        with self._lock:
            self._adds += n
            if affinity is not None:
                a = float(affinity)
                if not math.isfinite(a):
                    raise ValueError(f"affinity must be finite, got {affinity!r}")
                self._affinities.append(a)

    def on_add_batch(self, affinities: "np.ndarray") -> None:
        """``on_add`` for a batch: one memory per entry, NaN for "no affinity" (a new cluster).
        Only the last ``2 * drift_window`` affinities can matter, so only those are kept."""
        import numpy as np

        a = np.asarray(affinities, dtype=np.float64)
        if np.isinf(a).any():
            raise ValueError("affinities must be finite (NaN for none)")
        finite = a[~np.isnan(a)][-2 * self.config.drift_window:]
        with self._lock:
            self._adds += len(a)
            self._affinities.extend(finite.tolist())

    def on_search(self, best_score: float | None) -> bool:
        """Record a search's best score (None or -inf when it found nothing: maximal confusion).
        Returns whether the confusion trigger holds now (the last ``confusion_window`` searches
        all below the threshold), so a search path polls :meth:`due` only then: ``due`` reads
        the whole drift window, a cost every search would pay for a trigger adds move."""
        s = float("-inf") if best_score is None else float(best_score)
        if math.isnan(s):
            raise ValueError("best_score must not be NaN")
        with self._lock:
            self._searches.append(s)
            self._low_streak = self._low_streak + 1 if s < self.config.confusion_threshold else 0
            return self._low_streak >= self.config.confusion_window

    def request(self) -> None:
        """Ask for a re-organisation now (the explicit trigger)."""
        with self._lock:
            self._explicit = True

    def due(self) -> str | None:
        """The reason a re-organisation is due ("explicit", "periodic", "drift",
        "confusion"), or None. Does not clear anything: call :meth:`reset` once it ran."""
        cfg = self.config
        with self._lock:
            if self._explicit:
                return "explicit"
            if self.organize_every > 0 and self._adds >= self.organize_every:
                return "periodic"
            w = cfg.drift_window
            if len(self._affinities) == 2 * w:
                vals = list(self._affinities)
                earlier = sum(vals[:w]) / w
                recent = sum(vals[w:]) / w
                if earlier - recent >= cfg.drift_drop:
                    return "drift"
            if len(self._searches) == cfg.confusion_window and all(
                s < cfg.confusion_threshold for s in self._searches
            ):
                return "confusion"
            return None

    def reset(self) -> None:
        """Clear every trigger (call after a re-organisation, whatever its reason)."""
        with self._lock:
            self._adds = 0
            self._explicit = False
            self._searches.clear()
            self._low_streak = 0
            self._affinities.clear()

    def snapshot(self) -> dict[str, Any]:
        """The counters behind the triggers, for stats and debugging."""
        with self._lock:
            vals = list(self._affinities)
            return {
                "adds_since_organize": self._adds,
                "explicit": self._explicit,
                "recent_search_scores": list(self._searches),
                "affinity_window": len(vals),
                "mean_affinity": sum(vals) / len(vals) if vals else None,
            }
