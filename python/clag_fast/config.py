"""StoreConfig: every tunable of a MemoryStore in one frozen dataclass."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from clag_fast.forgetting import ForgettingPolicy


@dataclass(frozen=True)
class StoreConfig:
    """Settings of a store. ``dim`` is fixed when the store is created; the rest may change
    between opens.

    Clustering:
      soft_k: clusters kept per memory with their affinities (soft assignment; 1 = hard).
      spill_margin: a secondary cluster also lists the memory for search when its affinity is
        within this margin of the best one (widens stage 2 only where a memory sits on a
        border, so recall rises without scanning every memory K times).
      n_probe: clusters searched in stage 2 by default; None = automatic: ``probe_fraction``
        of the clusters (at least 4 and at most ``max_probe``), so the share of memories a
        search scans stays put as the store grows from hundreds to a few thousand memories.
      probe_gap, min_probe: adaptive probing when ``n_probe`` is None: of the automatic count
        (the cap), probe the best ``min_probe`` clusters and then each further one whose centre
        score is within ``probe_gap`` of the best; None = always the full automatic count.
        Clustered data whose query stands out from all but its own clusters then scans only
        those (blob vectors: ~1-2 of 64), while close-together centre scores (conversation
        stores) still probe up to the cap (BENCHMARKS.md, issue 11).
      min_memories_to_cluster: the store stays flat (exact search) below this many memories,
        then clusters itself (the paper's cold start).
      target_cluster_size: k-means picks k = memories / target_cluster_size at cold start.
        Many small clusters probed in numbers beat a few big ones (LoCoMo, BENCHMARKS.md:
        size 4 with 22% of clusters probed scans 29% of memories at -0.6 points Recall@10),
        hence 4 for conversation-sized stores; above ~1,000 memories both sizes grow with
        sqrt(memories) / 8 (``cluster_sizes_for``) so stage 1 stays cheap.
      max_cluster_size: a cluster larger than this is split in two at the next organisation,
        which keeps clusters near the target size as the store grows.
      min_cluster_size: smaller clusters that survived an organisation are merged away.
      merge_threshold: clusters whose centres are at least this similar are merged.
      topic_weight: weight of an SLM topic's (or template label's) embedding in its cluster
        centre, in member-equivalents: the inertia that keeps a topic cluster on topic.
      labels: templated-labels mode: a fixed label set to organise by (no invented topics).
    Organisation:
      slm: "auto" (managed SmolLM2 server, started on first need, when installed), "off".
      background: organise in a worker thread; add() returns after vector routing.
      organize_every: periodic re-organisation every N new memories (0 = never).
      route_batch: ambiguous memories routed by the SLM in one prompt.
      slm_profile_min_size: clusters smaller than this keep a vector profile (their most
        typical member + keywords) until they grow: with clusters of ~4 memories, an SLM
        profile for each would cost more calls than the memories are worth.
      evolution: localized evolution (the paper's, off for speed): the SLM links each new
        memory to related neighbours in its cluster and tags it (one call per memory).
      slm_select_clusters: query-time cluster selection: the SLM picks which candidate
        clusters a text query searches (one call per search); off = the vector choice.
    Other:
      forgetting: decay / pruning policy (off by default).
      cache_size: retrieval cache entries (0 = off); invalidated by any write.
      fsync: sync vectors and the database to disk on every write (power-loss safety);
        without it a process crash (SIGKILL) still loses nothing that add() returned.
    """

    dim: int = 384
    soft_k: int = 3
    spill_margin: float = 0.03
    n_probe: int | None = None
    probe_fraction: float = 0.22
    max_probe: int = 64
    probe_gap: float | None = 0.4
    min_probe: int = 1
    min_memories_to_cluster: int = 100
    target_cluster_size: int = 4
    max_cluster_size: int = 16
    min_cluster_size: int = 2
    merge_threshold: float = 0.92
    topic_weight: float = 8.0
    labels: tuple[str, ...] | None = None
    slm: str = "auto"
    background: bool = False
    organize_every: int = 50
    route_batch: int = 8
    slm_profile_min_size: int = 6
    evolution: bool = False
    slm_select_clusters: bool = False
    forgetting: ForgettingPolicy = field(default_factory=ForgettingPolicy)
    cache_size: int = 1024
    fsync: bool = False

    def __post_init__(self) -> None:
        checks = [
            (self.dim > 0, "dim must be > 0"),
            (self.soft_k >= 1, "soft_k must be >= 1"),
            (self.spill_margin >= 0, "spill_margin must be >= 0"),
            (self.n_probe is None or self.n_probe >= 1, "n_probe must be >= 1 or None"),
            (0 < self.probe_fraction <= 1, "probe_fraction must be in (0, 1]"),
            (self.max_probe >= 1, "max_probe must be >= 1"),
            (self.probe_gap is None or (math.isfinite(self.probe_gap) and self.probe_gap >= 0),
             "probe_gap must be finite and >= 0, or None"),
            (self.min_probe >= 1, "min_probe must be >= 1"),
            (self.min_memories_to_cluster >= 2, "min_memories_to_cluster must be >= 2"),
            (self.target_cluster_size >= 2, "target_cluster_size must be >= 2"),
            (self.max_cluster_size > self.target_cluster_size,
             "max_cluster_size must be > target_cluster_size"),
            (self.min_cluster_size >= 1, "min_cluster_size must be >= 1"),
            (0 < self.merge_threshold <= 1, "merge_threshold must be in (0, 1]"),
            (self.topic_weight >= 0, "topic_weight must be >= 0"),
            (self.slm in ("auto", "off"), "slm must be 'auto' or 'off'"),
            (self.organize_every >= 0, "organize_every must be >= 0"),
            (self.route_batch >= 1, "route_batch must be >= 1"),
            (self.slm_profile_min_size >= 1, "slm_profile_min_size must be >= 1"),
            (self.cache_size >= 0, "cache_size must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"StoreConfig: {message}")
        if self.labels is not None:
            labels = tuple(self.labels)
            if not labels or any(not isinstance(s, str) or not s.strip() for s in labels):
                raise ValueError("StoreConfig: labels must be non-empty strings")
            object.__setattr__(self, "labels", labels)

    def cluster_sizes_for(self, n_memories: int) -> tuple[int, int]:
        """(target, max) cluster size for a store of ``n_memories``: the configured sizes,
        scaled by sqrt(n) / 8 once that is larger (IVF's sqrt(n) lists, kept 8x finer because
        probing many small clusters measured better than few large ones)."""
        scale = max(1.0, math.sqrt(max(n_memories, 0)) / 8.0 / self.target_cluster_size)
        return round(self.target_cluster_size * scale), round(self.max_cluster_size * scale)

    def replace(self, **changes: object) -> "StoreConfig":
        return dataclasses.replace(self, **changes)
