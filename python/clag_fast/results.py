"""What the store hands back: search hits, memories and cluster descriptions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result, with the labels of the cluster it was found in."""

    memory_id: int
    text: str
    score: float
    cluster_id: int | None
    cluster_summary: str
    cluster_tags: list[str]
    kind: str
    namespace: str
    created_at: float
    metadata: dict[str, Any] | None
    key: str | None = None  # the user's key (``add(key=...)``), None when added without one
    # The id of a newer memory that updates this one (``add(supersedes=...)``), when that
    # memory is eligible for the same search (created by ``as_of``, in the same filters).
    superseded_by: int | None = None
    # The hit's adjacent turns in its thread (``search(..., context=n)``), in thread order.
    context: tuple["Turn", ...] = ()


@dataclass(frozen=True, slots=True)
class Turn:
    """A memory next to a hit in its thread: ``offset`` turns before (< 0) or after (> 0)."""

    memory_id: int
    offset: int
    text: str
    speaker: str | None = None


class _HitBuilder:
    """Builds a ``Hit`` at a quarter of the cost of its constructor.

    A search builds k hits per call, and the frozen dataclass ``__init__`` (one
    ``object.__setattr__`` per field) cost 1.2 us a hit: a tenth of the whole search at 200k
    memories. This class has Hit's slots in Hit's order, assigns them plainly, then becomes a
    Hit (``__class__`` assignment between classes of one slot layout), frozen from then on.
    tests/test_results.py checks the fields stay in step with ``Hit``.
    """

    __slots__ = ("memory_id", "text", "score", "cluster_id", "cluster_summary", "cluster_tags", "kind",
                 "namespace", "created_at", "metadata", "key", "superseded_by", "context")

    def __init__(self, memory_id, text, score, cluster_id, cluster_summary, cluster_tags, kind, namespace,
                 created_at, metadata, key, superseded_by=None, context=()):
        self.memory_id = memory_id
        self.text = text
        self.score = score
        self.cluster_id = cluster_id
        self.cluster_summary = cluster_summary
        self.cluster_tags = cluster_tags
        self.kind = kind
        self.namespace = namespace
        self.created_at = created_at
        self.metadata = metadata
        self.key = key
        self.superseded_by = superseded_by
        self.context = context
        self.__class__ = Hit  # type: ignore[assignment]


#: ``Hit(...)`` with every field given, positionally, for the search path (see
#: ``_HitBuilder``). The class itself, not a function calling it: a wrapper's frame cost a
#: quarter of a hit's construction (0.24 vs 0.17 us).
make_hit: Callable[..., Hit] = _HitBuilder  # type: ignore[assignment]


class Hits(list):
    """The hits of one search, best first, plus what the search cost.

    Attributes:
      scanned: memories scored exactly in stage 2 (all candidates for a flat search).
      candidates: memories that passed the filters (namespace, kind, time range).
      clusters_probed: clusters searched in stage 2 (empty for a flat search).
      mode: "two_stage" or "flat" (a two-stage search on an unclustered store runs flat).
      latency_s: wall time of the search, embedding included.
      cached: served from the retrieval cache.
    """

    scanned: int = 0
    candidates: int = 0
    clusters_probed: list[int]
    mode: str = "two_stage"
    latency_s: float = 0.0
    cached: bool = False

    def __init__(self, hits: list[Hit] = (), *, scanned: int = 0, candidates: int = 0,  # type: ignore[assignment]
                 clusters_probed: list[int] | None = None, mode: str = "two_stage", latency_s: float = 0.0,
                 cached: bool = False) -> None:
        list.__init__(self, hits)  # not super(): this runs once per search
        self.scanned = scanned
        self.candidates = candidates
        self.clusters_probed = [] if clusters_probed is None else clusters_probed
        self.mode = mode
        self.latency_s = latency_s
        self.cached = cached

    @property
    def search_fraction(self) -> float:
        """Share of the eligible memories that stage 2 scored."""
        return self.scanned / self.candidates if self.candidates else 0.0


@dataclass(frozen=True, slots=True)
class Memory:
    """A stored memory as ``MemoryStore.get`` returns it."""

    memory_id: int
    text: str
    kind: str
    namespace: str
    metadata: dict[str, Any] | None
    created_at: float
    last_accessed: float | None
    access_count: int
    strength: float
    archived: bool
    clusters: list[tuple[int, float]] = field(default_factory=list)  # (cluster id, affinity), best first
    key: str | None = None  # the user's key (``add(key=...)``), None when added without one
    thread: str | None = None  # the conversation it belongs to (``add(thread=...)``)
    turn: float | None = None  # its place in the thread (None: insertion order)
    speaker: str | None = None  # who said or wrote it (``add(speaker=...)``)
    superseded_by: int | None = None  # the id of a newer memory that updates it

    @property
    def cluster_id(self) -> int | None:
        return self.clusters[0][0] if self.clusters else None


@dataclass(frozen=True, slots=True)
class MemoryPage:
    """One page of ``MemoryStore.memories``: memories by id ascending, and the cursor that
    fetches the next page (None when this is the last)."""

    items: list[Memory]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """A cluster's profile as ``MemoryStore.clusters`` returns it."""

    id: int
    summary: str
    tags: list[str]
    size: int
    source: str  # "kmeans" | "slm_topic" | "template" | "route" | "split" | "recovered"
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class ClusterPage:
    """A cluster as ``MemoryStore.cluster`` returns it: its profile and size, and one page of
    its members (primary members, by id ascending, live only) with the cursor of the next
    page (None when this is the last)."""

    info: ClusterInfo
    members: list[Memory]
    next_cursor: str | None
