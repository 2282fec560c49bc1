"""Two-stage retrieval for a store: filters to a row mask, the probe rule, the native search,
and hits with their cluster labels.

Per query the work outside the native search is constant: the filter mask is cached per
(filters, write version) in the row table, decay weights per write version and minute, and
the k hits' texts come from SQLite in one statement.
"""

from __future__ import annotations

import math
import time

import numpy as np

from clag_fast.results import Hit, Hits
from clag_fast.store.state import StoreState


class Searcher:
    """Searches one store's state; owns the per-write caches the search path reuses."""

    def __init__(self, state: StoreState) -> None:
        self.state = state
        self._weights: tuple[int, float, np.ndarray] | None = None
        self._filters: dict[tuple, tuple[np.ndarray | None, int]] = {}
        self._filters_version = -1

    def eligible(self, filters: tuple) -> tuple[np.ndarray | None, int]:
        """(row mask or None, eligible count) for (namespace, kind, since, until), cached until
        the next write: counting a mask is O(rows), which at 1M rows would cost more than the
        search. None when every row is eligible, so the native scan skips the mask."""
        rows = self.state.rows
        if self._filters_version != rows.version:
            self._filters.clear()
            self._filters_version = rows.version
        hit = self._filters.get(filters)
        if hit is None:
            mask = rows.mask(*filters)
            count = int(np.count_nonzero(mask))
            hit = (None if count == len(mask) else mask, count)
            if len(self._filters) > 64:  # many distinct filters: keep memory bounded
                self._filters.clear()
            self._filters[filters] = hit
        return hit

    def auto_probe(self) -> int:
        """The default number of clusters to probe: ``n_probe`` when configured, else
        ``probe_fraction`` of the clusters, at least 4 and at most ``max_probe``."""
        cfg = self.state.config
        if cfg.n_probe is not None:
            return cfg.n_probe
        n_clusters = len(self.state.index.cluster_ids())
        return int(min(max(4, math.ceil(cfg.probe_fraction * n_clusters)), cfg.max_probe))

    def search(self, qvecs: np.ndarray, k: int, filters: tuple, mode: str, n_probe: int | None,
               selected: list[int] | None = None) -> list[Hits]:
        """One ``Hits`` per query row of ``qvecs`` (q, dim). Call under the read lock."""
        state = self.state
        mask, candidates = self.eligible(filters)
        if candidates == 0:
            return [Hits([], candidates=0, scanned=0, mode=mode) for _ in range(len(qvecs))]
        weights = self._decay_weights()
        if selected:
            return [self._search_selected(qvecs, k, mask, candidates, selected, weights)]
        idx = state.index
        eff_mode = mode if len(idx.cluster_ids()) else "flat"
        probe = self.auto_probe() if n_probe is None else n_probe
        res = idx.search(qvecs, k=k, n_probe=probe, mode=eff_mode, mask=mask, weights=weights)
        out = []
        want = min(k, candidates)
        short = np.flatnonzero(res.counts < want) if eff_mode == "two_stage" else np.empty(0, np.int64)
        flat = None
        if len(short):
            # A selective filter (a small namespace) can leave the probed clusters short of k
            # eligible rows: the eligible rows are few, so scanning them all is cheap.
            flat = idx.search(qvecs[short], k=k, mode="flat", mask=mask, weights=weights)
        where = {int(q): i for i, q in enumerate(short.tolist())}
        for q in range(len(qvecs)):
            if q in where:
                i = where[q]
                out.append(Hits(self._hits(flat, i), scanned=int(flat.scanned[i]), candidates=candidates,
                                mode="flat"))
                continue
            probed = [c for c in res.probed[q].tolist() if c >= 0] if eff_mode == "two_stage" else []
            out.append(Hits(self._hits(res, q), scanned=int(res.scanned[q]), candidates=candidates,
                            clusters_probed=probed, mode=eff_mode))
        return out

    def _search_selected(self, qvecs, k, mask, candidates, selected: list[int], weights) -> Hits:
        """Stage 2 over the clusters the SLM selected (query-time cluster selection)."""
        idx = self.state.index
        live = set(idx.cluster_ids().tolist())
        members = [m for c in selected if c in live for m in (idx.members(c), idx.secondary_members(c))]
        in_clusters = np.zeros(len(idx), bool)
        if members:
            in_clusters[np.concatenate(members)] = True
        sub = in_clusters if mask is None else mask & in_clusters
        res = idx.search(qvecs[:1], k=k, mode="flat", mask=sub, weights=weights)
        return Hits(self._hits(res, 0), scanned=int(sub.sum()), candidates=candidates,
                    clusters_probed=list(selected), mode="two_stage")

    def _hits(self, res, q: int) -> list[Hit]:
        """Hits for query ``q`` of a native result, with texts and labels; records the access."""
        state = self.state
        rows = state.rows
        count = int(res.counts[q])
        hit_rows = res.ids[q, :count]
        mids = rows.memory_id[hit_rows].tolist()
        clusters = res.clusters[q, :count].tolist()
        details = state.details(mids)
        profiles = state.profiles
        hits = []
        for mid, score, cid in zip(mids, res.scores[q, :count].tolist(), clusters):
            text, kind_, ns, created, meta = details[mid]
            summary, tags = profiles.get(cid, ("", [])) if cid >= 0 else ("", [])
            hits.append(Hit(mid, text, score, cid if cid >= 0 else None, summary, list(tags), kind_, ns,
                            created, meta))
        now = time.time()
        rows.last_accessed[hit_rows] = now
        rows.access_count[hit_rows] += 1
        state.access.record(mids, clusters, now)
        return hits

    def _decay_weights(self) -> np.ndarray | None:
        """Per-row decay weights, recomputed after writes or once a minute.

        A half-life is measured in days, so a minute-old weight is off by < 0.05% even at a
        one-day half-life, while recomputing costs ~2 ms per 100k rows: several times a
        two-stage search. Accesses by searches count at the next recomputation.
        """
        policy = self.state.config.forgetting
        if not policy.active:
            return None
        now = time.time()
        rows = self.state.rows
        cached = self._weights
        if cached is not None and cached[0] == rows.version and now - cached[1] < 60.0:
            return cached[2]
        w = rows.weights(policy, now)
        self._weights = (rows.version, now, w)
        return w
