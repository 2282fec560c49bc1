"""StoreState: everything one open store owns, shared by the modules that work on it.

``MemoryStore`` is the public facade; placement, organisation, recovery, forgetting and the
SLM scheduler each get this object and use its public attributes, so no module reaches into
another's private names and none imports the facade.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clag_fast.config import StoreConfig
from clag_fast.embed.vector_cache import VectorCache
from clag_fast.index import VectorIndex
from clag_fast.store.assignments import Assignments
from clag_fast.store.catalog import Catalog
from clag_fast.store.fields import FieldTable
from clag_fast.store.locks import RWLock
from clag_fast.store.rowtable import RowTable

#: Rows added since the last checkpoint past which an add syncs the rows and checkpoints the
#: database (a store not organised periodically, organize_every=0, would otherwise grow its
#: write-ahead log until close: ~0.7 kB per memory).
CHECKPOINT_ROWS = 65_536

#: The assignment records, beside the vectors (``store.assignments``).
ASSIGNMENTS = "index/assignments.bin"

#: Searches whose cluster hits are recorded before they are folded into ``AccessLog.clusters``.
HIT_BATCH = 256

COUNTERS = ("adds", "searches", "cache_hits", "organizations", "embed_s", "add_s", "search_s", "organize_s",
            "label_s", "label_units", "routed_vector", "routed_new", "routed_slm", "routed_fallback")


class ResultCache:
    """LRU of search results keyed by the query and its filters; any write clears it.

    A search computes its hits under the store's read lock and files them after releasing
    it, so a write can land in between (another thread's add, in the service). ``put`` then
    takes the ``generation`` the search read under the lock and files nothing when a clear
    came since: a result from before a write never outlives it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.generation = 0  # bumped by every clear()

    def get(self, key: tuple) -> Any | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: tuple, value: Any, generation: int) -> None:
        """File ``value``, computed when the cache was at ``generation`` (read under the
        store's read lock); nothing when the cache was cleared since."""
        if not self.size:
            return
        with self._lock:
            if generation != self.generation:
                return
            self._items[key] = value
            if len(self._items) > self.size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._items.clear()


class AccessLog:
    """What searches used since the last ``flush()``, written then in one transaction: no
    SQLite write on the search path.

    Memories' accesses are counted in the row table's columns (``last_accessed``,
    ``access_count`` and ``unflushed``, applied in batches: ``RowTable.record_access``);
    clusters' last hit times are kept here, folded in batches too: one dict update per search
    cost 2-3 us, a thirtieth of a small filtered search (benches/bench_filters.py).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.clusters: dict[int, float] = {}
        self._hits: list[tuple[list[int], float]] = []

    def record(self, rows: RowTable, hit_rows: list[int], cluster_ids: list[int], now: float) -> None:
        """``hit_rows``: distinct vector rows returned by one search; ``cluster_ids``: their
        clusters (-1 for none). Lists (what the search path holds; the batch fold converts
        them once), which must not change afterwards."""
        rows.record_access(hit_rows, now)
        self._hits.append((cluster_ids, now))  # list.append is atomic: searches run concurrently
        if len(self._hits) >= HIT_BATCH:
            self.settle()

    def settle(self) -> None:
        """Fold the recorded cluster hits into ``clusters`` (cluster -> last hit time)."""
        with self._lock:
            n = len(self._hits)
            if not n:
                return
            # Slice, then delete: a search appending meanwhile keeps its entry for the next fold.
            batch = self._hits[:n]
            del self._hits[:n]
            ids = list(itertools.chain.from_iterable(b[0] for b in batch))
            times = np.repeat(np.asarray([b[1] for b in batch]), [len(b[0]) for b in batch]).tolist()
            self.clusters.update(zip(ids, times))  # in search order: a cluster keeps its last hit

    def take(self, rows: RowTable) -> tuple[dict[int, tuple[float, int]], dict[int, float]]:
        """(memory id -> (last access, accesses since the last take), cluster -> last hit),
        cleared. Call under the store's write lock (no search records meanwhile)."""
        rows.settle_access()
        pending = np.flatnonzero(rows.unflushed[: rows.n])
        memories: dict[int, tuple[float, int]] = {}
        for mid, last, count in zip(rows.memory_id[pending].tolist(), rows.last_accessed[pending].tolist(),
                                    rows.unflushed[pending].tolist()):
            if mid >= 0:  # -1: deleted since
                memories[mid] = (last, int(count))
        rows.unflushed[pending] = 0
        self.settle()
        with self._lock:
            clusters, self.clusters = self.clusters, {}
        clusters.pop(-1, None)  # hits outside any cluster (pending rows)
        return memories, clusters


@dataclass
class StoreState:
    """One open store: its files, configuration, in-memory tables and locks.

    Invariants every module keeps: a vector row is appended (durable) before the SQLite row
    that references it commits; ``rows`` mirrors the database's per-memory columns;
    ``fields`` mirrors the live memories' metadata in the columns it has built;
    ``profiles`` mirrors the clusters table's summaries and tags; ``cache`` is cleared by any
    write that can change a search result. Mutations happen under ``lock.write()``.
    """

    path: Path
    config: StoreConfig
    read_only: bool
    catalog: Catalog
    index: VectorIndex
    rows: RowTable = field(default_factory=RowTable)
    fields: FieldTable = field(default_factory=FieldTable)
    profiles: dict[int, tuple[str, list[str]]] = field(default_factory=dict)
    lock: RWLock = field(default_factory=RWLock)
    access: AccessLog = field(default_factory=AccessLog)
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    cache: ResultCache = field(init=False)
    # Per vector row, its soft assignment (clusters and affinities): index/assignments.bin.
    assignments: Assignments = field(init=False)
    embed_cache: VectorCache = field(init=False)  # text -> vector; writes do not clear it
    # (cluster ids, their centres) at the end of the last organisation in this process: the
    # next one re-assigns the members of clusters whose centre moved since (organize.drifted).
    organized_centres: tuple[np.ndarray, np.ndarray] | None = None
    # Clusters over the size cap that a split would not separate (organize.cohesion), with
    # their size then: left whole until they grow (organize.RETEST_GROWTH).
    coherent: dict[int, int] = field(default_factory=dict)
    rows_since_checkpoint: int = 0

    def __post_init__(self) -> None:
        self.cache = ResultCache(self.config.cache_size)
        self.embed_cache = VectorCache(self.config.embed_cache)
        self.assignments = Assignments(self.path / ASSIGNMENTS, self.config.soft_k, self.read_only)

    def __len__(self) -> int:
        """Live memories."""
        return int(self.rows.live[: self.rows.n].sum())

    def count(self, key: str, n: float = 1) -> None:
        self.counters[key] += n

    def details(self, memory_ids: list[int]) -> dict[int, tuple]:
        return self.catalog.details(memory_ids) if memory_ids else {}

    def field_table(self, names: list[str]) -> FieldTable:
        """The metadata columns, with those of ``names`` built from the database if they were
        not yet (under the read or the write lock: no write runs meanwhile)."""
        self.fields.ensure(names, self.rows.n, self.catalog.metadata_rows)
        return self.fields

    def delete_rows(self, memory_ids: list[int], rows: np.ndarray) -> None:
        """Remove memories everywhere: database first (atomic), then the index and row table."""
        self.catalog.delete_memories(memory_ids)
        self.index.unassign(rows)
        self.rows.kill(rows)
        self.rows.memory_id[rows] = -1
        self.cache.clear()

    def flush_index(self, durable: bool = True) -> None:
        """Save the index (rows synced, cluster state written; ``durable``: the state file
        fsynced too), sync the assignment records with it, then checkpoint the database (the
        only checkpoints it gets: ``catalog.connect``)."""
        self.index.flush(durable=durable)
        self.assignments.flush(durable)
        if not self.read_only:
            self.catalog.checkpoint()  # after the rows it may reference are synced
            self.rows_since_checkpoint = 0

    def close_index(self) -> None:
        self.index.close()
        self.assignments.close()

    def flush_access(self) -> None:
        accesses, hits = self.access.take(self.rows)
        if accesses or hits:
            self.catalog.record_access(accesses, hits)

    def cluster_table(self) -> tuple[list[int], dict[int, int]]:
        """(cluster ids, id -> size) of the index's live clusters."""
        ids = self.index.cluster_ids().tolist()
        return ids, dict(zip(ids, self.index.cluster_sizes().tolist()))
