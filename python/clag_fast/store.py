"""MemoryStore: the public API joining the native index, the embedder and the SLM organiser.

One directory holds a store:
  memories.db   SQLite (WAL): texts, metadata, cluster profiles, soft assignments, links
  index/        the native VectorIndex: memory-mapped vectors + cluster state
  LOCK          the writer's lock file

Write order (why a crash never loses a returned add): the vector row is appended first, then
the SQLite transaction that references it commits, then ``add`` returns. A crash between the
two leaves an unreferenced vector row, which is ignored. Cluster state is saved at
organisations, flushes and close; on open ``maintenance.reconcile`` re-routes whatever the last
saved cluster state does not cover, so SQLite and the index always agree after a restart.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from clag_fast import maintenance, schema
from clag_fast._locks import RWLock, WriterLock
from clag_fast.config import StoreConfig
from clag_fast.index import VectorIndex
from clag_fast.results import ClusterInfo, Hit, Hits, Memory
from clag_fast.rowtable import RowTable
from clag_fast.slm import SLMSide

log = logging.getLogger("clag_fast.store")

DB_NAME = "memories.db"
INDEX_DIR = "index"


class MemoryStore:
    """A persistent, clustered memory store for an agent. Use ``MemoryStore.open``.

    Thread-safe: searches run concurrently (shared lock; the native search releases the GIL);
    writes are serialised. One process writes a store at a time (``LOCK``); others may open
    it with ``read_only=True`` and see the state as of their open (``refresh()`` to update).
    """

    # -- opening and closing -----------------------------------------------------------
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("use MemoryStore.open(path, ...)")

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        config: StoreConfig | None = None,
        embedder: Any = None,
        llm: Any = None,
        read_only: bool = False,
    ) -> "MemoryStore":
        """Create or reopen the store in directory ``path``.

        embedder: None (the default ONNX MiniLM Embedder, loaded on first use), an object
          with ``encode(list[str]) -> float32[n, dim]``, or False (bring your own vectors).
        llm: None (a managed SmolLM2 llama.cpp server when ``config.slm == "auto"`` and it is
          installed, started on first need), a server base URL, an ``LLMClient``, or False
          (vector-only organisation).
        """
        self = object.__new__(cls)
        self._init(Path(path), config, embedder, llm, read_only)
        return self

    def _init(self, path: Path, config: StoreConfig | None, embedder: Any, llm: Any, read_only: bool) -> None:
        self.path = path
        self.read_only = read_only
        self._closed = True
        self._writer_lock: WriterLock | None = None
        self._db = None
        self._index: VectorIndex | None = None
        self._slm: SLMSide | None = None
        _check_store_dir(path, read_only)
        if not read_only:
            path.mkdir(parents=True, exist_ok=True)
            self._writer_lock = WriterLock(path / "LOCK")
        try:
            self._db = schema.connect(path / DB_NAME, read_only=read_only)
            self.config = self._settle_config(config)
            self._index = VectorIndex.open(path / INDEX_DIR, dim=self.config.dim, read_only=read_only)
            self._lock = RWLock()
            self._rows = RowTable()
            self._profiles: dict[int, tuple[str, list[str]]] = {}
            self._cache: OrderedDict[tuple, Hits] = OrderedDict()
            self._embedder_arg = embedder
            self._embedder = embedder if embedder not in (None, False) else None
            self._embed_precision = self._settle_precision() if embedder is None else None
            self._counters = {
                "adds": 0, "searches": 0, "cache_hits": 0, "organizations": 0,
                "embed_s": 0.0, "add_s": 0.0, "search_s": 0.0,
                "routed_vector": 0, "routed_new": 0, "routed_slm": 0, "routed_fallback": 0,
            }
            # Searches record use here (memory id -> (last access, count); cluster -> last hit)
            # and flush() writes it in one transaction: no SQLite write on the search path.
            self._access_dirty: dict[int, tuple[float, int]] = {}
            self._cluster_hits: dict[int, float] = {}
            self._access_lock = threading.Lock()
            self._weights_cache: tuple[int, float, np.ndarray] | None = None
            self._load_rows()
            self._slm = SLMSide(self, llm)
            self._closed = False
            if not read_only:
                with self._lock.write():
                    maintenance.reconcile(self)
        except BaseException:
            self._release()
            raise

    def _settle_config(self, config: StoreConfig | None) -> StoreConfig:
        row = self._db.execute("SELECT value FROM meta WHERE key='dim'").fetchone()
        if row is None:
            config = config or StoreConfig()
            if not self.read_only:
                self._db.execute("INSERT INTO meta (key, value) VALUES ('dim', ?)", (str(config.dim),))
            return config
        dim = int(row[0])
        if config is None:
            return StoreConfig(dim=dim)
        if config.dim != dim:
            raise ValueError(f"store {self.path} holds {dim}-dimensional vectors, config says dim={config.dim}")
        return config

    def _settle_precision(self) -> str:
        """The default embedder's precision, fixed for the life of the store.

        ``Embedder()`` picks int8 or fp32 by CPU, so without this a store created on one
        machine would mix int8 and fp32 vectors after moving to another (or after the
        default changed). Stores written before the key existed hold fp32 vectors.
        """
        row = self._db.execute("SELECT value FROM meta WHERE key='embed_precision'").fetchone()
        if row is not None:
            return str(row[0])
        if len(self._index) > 0:
            precision = "fp32"
        else:
            from clag_fast.embed import resolve_precision

            precision = resolve_precision()
        if not self.read_only:
            self._db.execute("INSERT INTO meta (key, value) VALUES ('embed_precision', ?)", (precision,))
        return precision

    def _load_rows(self) -> None:
        n_vectors = len(self._index)
        self._rows.ensure(n_vectors)
        cur = self._db.execute(
            "SELECT id, vector_row, namespace, kind, created_at, last_accessed, access_count, "
            "strength, state FROM memories"
        )
        data = cur.fetchall()
        if not data:
            return
        mids, rows, nss, kinds, created, last, count, strength, state = zip(*data)
        rows_a = np.asarray(rows, dtype=np.int64)
        if rows_a.max() >= n_vectors:
            raise schema.StoreFormatError(
                f"{self.path}: the database references vector row {int(rows_a.max())} but the "
                f"vector file holds {n_vectors} rows (vector file truncated or replaced)"
            )
        self._rows.set_rows(
            rows_a,
            np.asarray(mids, dtype=np.int64),
            list(nss),
            list(kinds),
            np.asarray(created, dtype=np.float64),
            last_accessed=np.asarray([np.nan if v is None else v for v in last], dtype=np.float64),
            access_count=np.asarray(count, dtype=np.float64),
            strength=np.asarray(strength, dtype=np.float32),
            live=np.asarray(state, dtype=np.int64) == schema.LIVE,
        )
        for cid, summary, tags in self._db.execute("SELECT id, summary, tags FROM clusters WHERE archived=0"):
            self._profiles[cid] = (summary, json.loads(tags))

    def close(self) -> None:
        """Finish pending organisation, persist everything and release the store."""
        if self._closed:
            return
        try:
            if not self.read_only:
                self.flush()
        finally:
            self._closed = True
            self._release()

    def _release(self) -> None:
        if self._slm is not None:
            self._slm.close()
        if self._index is not None:
            self._index.close()
        if self._db is not None:
            self._db.close()
        if self._writer_lock is not None:
            self._writer_lock.release()

    def __enter__(self) -> "MemoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{int(self._rows.live.sum())} memories"
        return f"MemoryStore({str(self.path)!r}, {state})"

    def _check_open(self, write: bool = False) -> None:
        if self._closed:
            raise ValueError("the store is closed")
        if write and self.read_only:
            raise PermissionError(f"store {self.path} is open read-only")

    # -- writing -----------------------------------------------------------------------
    def add(
        self,
        text: str,
        *,
        kind: str = "user_input",
        namespace: str = "default",
        metadata: dict[str, Any] | None = None,
        embedding: np.ndarray | None = None,
    ) -> int:
        """Store one memory and return its id. See ``add_many``."""
        emb = None if embedding is None else np.asarray(embedding)[None, ...]
        return self.add_many([text], embeddings=emb, kinds=[kind], namespaces=[namespace],
                             metadata=[metadata])[0]

    def add_many(
        self,
        texts: Sequence[str],
        embeddings: np.ndarray | None = None,
        kinds: Sequence[str] | str | None = None,
        namespaces: Sequence[str] | str | None = None,
        metadata: Sequence[dict[str, Any] | None] | None = None,
    ) -> list[int]:
        """Store memories (embedding them unless ``embeddings`` is given) and return their ids.

        Each memory is routed to its clusters by vectors before this returns; SLM decisions
        (ambiguous routes, profiles, periodic re-organisation) run afterwards, in the
        background when ``config.background`` is set. A failing SLM never fails an add.
        """
        self._check_open(write=True)
        t0 = time.perf_counter()
        texts = _check_texts(texts)
        n = len(texts)
        kinds_l = _per_item(kinds, n, "user_input", "kinds")
        namespaces_l = _per_item(namespaces, n, "default", "namespaces")
        meta_json = _metadata_json(metadata, n)
        vectors = self._vectors(texts, embeddings)
        if n == 0:
            return []
        if self.config.labels is not None and not self._label_clusters_exist():
            self.set_label_vectors(self._label_vectors())
        with self._lock.write():
            ids = self._insert(texts, vectors, kinds_l, namespaces_l, meta_json)
            self._counters["adds"] += n
            self._counters["add_s"] += time.perf_counter() - t0
        self._slm.after_add()
        return ids

    def _insert(self, texts, vectors, kinds, namespaces, meta_json) -> list[int]:
        now = time.time()
        rows = self._index.append(vectors)  # validated + durable before SQLite references it
        placement = maintenance.route_new_rows(self, rows, self._index.vectors()[rows])
        first = self._db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM memories").fetchone()[0]
        ids = list(range(first, first + len(texts)))
        with schema.transaction(self._db):
            self._db.executemany(
                "INSERT INTO memories (id, text, kind, namespace, metadata, created_at, vector_row) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                zip(ids, texts, kinds, namespaces, meta_json, [now] * len(ids), rows.tolist()),
            )
            maintenance.record_placement(self, ids, texts, placement, now)
        self._rows.set_rows(rows, np.asarray(ids, np.int64), namespaces, kinds, np.full(len(ids), now))
        self._cache.clear()
        self._slm.note_routes(ids, rows, texts, placement)
        if self.config.fsync:
            self._index.flush()
        return ids

    def update(self, memory_id: int, *, text: str | None = None, metadata: dict[str, Any] | None = None,
               embedding: np.ndarray | None = None) -> None:
        """Change a memory's text (re-embedded and re-routed) and/or metadata."""
        self._check_open(write=True)
        if text is None and metadata is None:
            raise ValueError("update needs text= and/or metadata=")
        vectors = None
        if text is not None:
            text = _check_texts([text])[0]
            vectors = self._vectors([text], None if embedding is None else np.asarray(embedding)[None, ...])
        meta = None if metadata is None else _metadata_json([metadata], 1)[0]
        with self._lock.write():
            old_row = self._row_of(memory_id)
            with schema.transaction(self._db):
                if meta is not None:
                    self._db.execute("UPDATE memories SET metadata=? WHERE id=?", (meta, memory_id))
                if vectors is not None:
                    new_row = self._index.append(vectors)
                    placement = maintenance.route_new_rows(self, new_row, self._index.vectors()[new_row])
                    self._db.execute("UPDATE memories SET text=?, vector_row=? WHERE id=?",
                                     (text, int(new_row[0]), memory_id))
                    maintenance.record_placement(self, [memory_id], [text], placement, time.time())
            if vectors is not None:
                self._index.unassign(np.asarray([old_row]))
                r = self._rows
                r.set_rows(new_row, np.asarray([memory_id]), [r.name("namespace", old_row)], [r.name("kind", old_row)],
                           r.created_at[[old_row]], access_count=r.access_count[[old_row]])
                r.kill(np.asarray([old_row]))
                r.memory_id[old_row] = -1
            self._cache.clear()

    def delete(self, memory_id: int) -> None:
        """Remove a memory (its text, metadata, assignments and links)."""
        self._check_open(write=True)
        with self._lock.write():
            row = self._row_of(memory_id, include_archived=True)
            self._delete_rows([memory_id], np.asarray([row]))

    def delete_namespace(self, namespace: str) -> int:
        """Remove every memory of ``namespace``; other namespaces are untouched. Returns the count."""
        self._check_open(write=True)
        with self._lock.write():
            data = self._db.execute("SELECT id, vector_row FROM memories WHERE namespace=?", (namespace,)).fetchall()
            if data:
                mids, rows = zip(*data)
                self._delete_rows(list(mids), np.asarray(rows, np.int64))
            return len(data)

    def _delete_rows(self, mids: list[int], rows: np.ndarray) -> None:
        with schema.transaction(self._db):
            for table, column in (("assignments", "memory_id"), ("links", "src"), ("links", "dst"),
                                  ("memories", "id")):
                self._db.executemany(f"DELETE FROM {table} WHERE {column}=?", [(m,) for m in mids])
        self._index.unassign(rows)
        self._rows.kill(rows)
        self._rows.memory_id[rows] = -1
        self._cache.clear()

    def set_label_vectors(self, vectors: np.ndarray) -> list[int]:
        """Templated-labels mode: create one cluster per ``config.labels`` entry, centred on
        the given label embeddings (the store embeds the labels itself when it has an
        embedder). Memories are then routed among these labels only."""
        self._check_open(write=True)
        labels = self.config.labels
        if labels is None:
            raise ValueError("set_label_vectors needs StoreConfig(labels=...)")
        vecs = self._vectors(list(labels), vectors)
        with self._lock.write():
            if self._label_clusters_exist():
                raise ValueError("the label clusters exist already")
            return maintenance.create_label_clusters(self, list(labels), vecs)

    def _label_clusters_exist(self) -> bool:
        return self._db.execute("SELECT 1 FROM clusters WHERE source='template' LIMIT 1").fetchone() is not None

    def _label_vectors(self) -> np.ndarray:
        if self._embedder_arg is False:
            raise ValueError("templated labels with embedder=False: call set_label_vectors(vectors) first")
        return self._vectors(list(self.config.labels), None)

    def organize(self, task_context: str | None = None) -> dict[str, Any]:
        """Re-organise now: cold-start clustering, SLM topics from ``task_context``, split
        oversized and merge redundant clusters, refresh profiles. Returns what was done."""
        self._check_open(write=True)
        return self._slm.organize(task_context, "explicit")

    def forget(self, now: float | None = None) -> dict[str, Any]:
        """Apply the forgetting policy now: prune faded memories, archive stale clusters."""
        self._check_open(write=True)
        with self._lock.write():
            return maintenance.forget(self, time.time() if now is None else now)

    def flush(self) -> None:
        """Wait for background organisation, then persist everything durably."""
        self._check_open(write=True)
        self._slm.drain()
        with self._lock.write():
            self._flush_access()
            self._index.flush()

    # -- reading -----------------------------------------------------------------------
    def search(
        self,
        query: str | np.ndarray,
        k: int = 5,
        *,
        namespace: str | None = None,
        kind: str | None = None,
        since: float | None = None,
        until: float | None = None,
        mode: str = "two_stage",
        n_probe: int | None = None,
    ) -> Hits:
        """The ``k`` memories most similar to ``query`` (a text, or a vector of ``dim``).

        two_stage: the ``n_probe`` clusters nearest the query, then an exact scan of their
        members only (falls back to flat while the store is not clustered yet); flat: exact
        scan of every eligible memory. Filters: namespace, kind, created_at in [since, until).
        """
        self._check_open()
        t0 = time.perf_counter()
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        if mode not in ("two_stage", "flat"):
            raise ValueError(f"mode must be 'two_stage' or 'flat', got {mode!r}")
        if n_probe is not None and (not isinstance(n_probe, (int, np.integer)) or n_probe < 1):
            raise ValueError(f"n_probe must be a positive integer, got {n_probe!r}")
        qkey = query if isinstance(query, str) else None
        if qkey is not None and not query.strip():
            raise ValueError("query text is empty")
        key = (qkey, int(k), namespace, kind, since, until, mode, n_probe)
        if qkey is not None and self.config.cache_size:
            hit = self._cache_get(key)
            if hit is not None:
                return hit
        qvec = self._query_vector(query)
        selected = None
        if qkey is not None and mode == "two_stage" and self.config.slm_select_clusters:
            n_clusters = len(self._index.cluster_ids())
            selected = self._slm.select_clusters(query, qvec, n_probe or self._auto_probe(n_clusters))
        with self._lock.read():
            hits = self._search_locked(qvec, int(k), namespace, kind, since, until, mode, n_probe, selected)
        hits.latency_s = time.perf_counter() - t0
        self._counters["searches"] += 1
        self._counters["search_s"] += hits.latency_s
        self._slm.after_search(hits[0].score if hits else float("-inf"))
        if qkey is not None and self.config.cache_size:
            self._cache_put(key, hits)
        return hits

    def _search_locked(self, qvec, k, namespace, kind, since, until, mode, n_probe, selected=None) -> Hits:
        rows = self._rows
        mask = rows.mask(namespace, kind, since, until)
        candidates = int(mask.sum())
        if candidates == 0:
            return Hits([], candidates=0, scanned=0, mode=mode)
        if selected:
            return self._search_selected(qvec, k, mask, candidates, selected)
        policy = self.config.forgetting
        weights = self._decay_weights(policy) if policy.active else None
        n_clusters = len(self._index.cluster_ids())
        eff_mode = mode if n_clusters else "flat"
        # Issue 11: the automatic count is the cap of adaptive probing (StoreConfig.probe_gap).
        adaptive = self._probe_rule() if n_probe is None else {}
        n_probe = self._auto_probe(n_clusters) if n_probe is None else n_probe
        res = self._index.search(qvec, k=k, n_probe=n_probe, mode=eff_mode, mask=mask, weights=weights, **adaptive)
        if eff_mode == "two_stage" and res.counts[0] < min(k, candidates):
            # A selective filter (a small namespace) can leave the probed clusters short of k
            # eligible rows: the eligible rows are few, so scanning them all is cheap.
            eff_mode = "flat"
            res = self._index.search(qvec, k=k, mode="flat", mask=mask, weights=weights)
        hits = self._hits_from(res)
        probed = [c for c in res.probed[0].tolist() if c >= 0] if eff_mode == "two_stage" else []
        return Hits(hits, scanned=int(res.scanned[0]), candidates=candidates, clusters_probed=probed,
                    mode=eff_mode)

    def _hits_from(self, res) -> list[Hit]:
        """Hits for the first query of a native result, with texts, labels; records the access."""
        rows = self._rows
        count = int(res.counts[0])
        hit_rows = res.ids[0, :count]
        scores = res.scores[0, :count]
        clusters = res.clusters[0, :count]
        mids = rows.memory_id[hit_rows]
        details = self._details(mids.tolist())
        hits = []
        for mid, score, cid in zip(mids.tolist(), scores.tolist(), clusters.tolist()):
            text, kind_, ns, created, meta = details[mid]
            summary, tags = self._profiles.get(cid, ("", [])) if cid >= 0 else ("", [])
            hits.append(Hit(mid, text, score, cid if cid >= 0 else None, summary, list(tags), kind_, ns,
                            created, meta))
        now = time.time()
        rows.last_accessed[hit_rows] = now
        rows.access_count[hit_rows] += 1
        with self._access_lock:
            for mid in mids.tolist():
                _, count = self._access_dirty.get(mid, (now, 0))
                self._access_dirty[mid] = (now, count + 1)
            for cid in set(clusters.tolist()):
                if cid >= 0:
                    self._cluster_hits[cid] = now
        return hits

    def _search_selected(self, qvec, k, mask, candidates, selected: list[int]) -> Hits:
        """Stage 2 over the clusters the SLM selected (query-time cluster selection)."""
        idx = self._index
        live = set(idx.cluster_ids().tolist())
        members = [m for c in selected if c in live for m in (idx.members(c), idx.secondary_members(c))]
        in_clusters = np.zeros(len(mask), bool)
        if members:
            in_clusters[np.concatenate(members)] = True
        sub = mask & in_clusters
        policy = self.config.forgetting
        weights = self._decay_weights(policy) if policy.active else None
        res = idx.search(qvec, k=k, mode="flat", mask=sub, weights=weights)
        hits = self._hits_from(res)
        return Hits(hits, scanned=int(sub.sum()), candidates=candidates, clusters_probed=list(selected),
                    mode="two_stage")

    def get(self, memory_id: int) -> Memory:
        """The memory with this id (KeyError if there is none)."""
        self._check_open()
        r = self._db.execute(
            "SELECT id, text, kind, namespace, metadata, created_at, last_accessed, access_count, "
            "strength, state FROM memories WHERE id=?", (_check_id(memory_id),)
        ).fetchone()
        if r is None:
            raise KeyError(f"no memory with id {memory_id}")
        clusters = self._db.execute(
            "SELECT cluster_id, affinity FROM assignments WHERE memory_id=? ORDER BY rank", (memory_id,)
        ).fetchall()
        return Memory(r[0], r[1], r[2], r[3], _loads(r[4]), r[5], r[6], r[7], r[8], r[9] != schema.LIVE,
                      [(c, a) for c, a in clusters])

    def links(self, memory_id: int) -> list[tuple[int, str]]:
        """(other memory id, relation) pairs linked from this memory (localized evolution)."""
        self._check_open()
        self._row_of(memory_id, include_archived=True)
        return [(d, r) for d, r in self._db.execute(
            "SELECT dst, relation FROM links WHERE src=? ORDER BY dst", (memory_id,))]

    def clusters(self) -> list[ClusterInfo]:
        """Every live cluster with its profile and size, largest first."""
        self._check_open()
        with self._lock.read():
            ids = self._index.cluster_ids().tolist()
            sizes = dict(zip(ids, self._index.cluster_sizes().tolist()))
            data = self._db.execute(
                "SELECT id, summary, tags, source, created_at, updated_at FROM clusters WHERE archived=0"
            ).fetchall()
        out = [ClusterInfo(c, s, json.loads(t), sizes.get(c, 0), src, ca, ua)
               for c, s, t, src, ca, ua in data if c in sizes]
        return sorted(out, key=lambda c: (-c.size, c.id))

    def __len__(self) -> int:
        return int(self._rows.live[: self._rows.n].sum())

    def stats(self) -> dict[str, Any]:
        """Counts, cluster sizes, LLM calls and tokens, and timings."""
        self._check_open()
        c = self._counters
        live = len(self)
        archived = self._db.execute("SELECT COUNT(*) FROM memories WHERE state=?", (schema.ARCHIVED,)).fetchone()[0]
        sizes = self._index.cluster_sizes()
        llm = self._slm.llm_stats()
        return {
            "memories": live,
            "archived": archived,
            "vector_rows": len(self._index),
            "clusters": int(len(sizes)),
            "cluster_size": _distribution(sizes),
            "adds": c["adds"],
            "searches": c["searches"],
            "cache_hits": c["cache_hits"],
            "organizations": c["organizations"],
            "routing": {k[7:]: v for k, v in c.items() if k.startswith("routed_")},
            "llm": llm,
            "llm_calls_per_memory": (llm.get("calls", 0) / c["adds"]) if c["adds"] else 0.0,
            "slm": self._slm.describe(),
            "timings_s": {"embed": c["embed_s"], "add": c["add_s"], "search": c["search_s"]},
        }

    def refresh(self) -> None:
        """Read-only stores: reload to see what the writer has committed since open."""
        self._check_open()
        if not self.read_only:
            return
        with self._lock.write():
            self._index.close()
            self._index = VectorIndex.open(self.path / INDEX_DIR, dim=self.config.dim, read_only=True)
            self._rows = RowTable()
            self._profiles.clear()
            self._cache.clear()
            self._load_rows()

    # -- internals ---------------------------------------------------------------------
    def _vectors(self, texts: list[str], embeddings: np.ndarray | None) -> np.ndarray:
        if embeddings is None:
            t0 = time.perf_counter()
            vecs = self._get_embedder().encode(texts)
            self._counters["embed_s"] += time.perf_counter() - t0
            return np.ascontiguousarray(vecs, dtype=np.float32)
        vecs = np.asarray(embeddings)
        if vecs.ndim != 2 or vecs.shape != (len(texts), self.config.dim):
            raise ValueError(
                f"embeddings must have shape ({len(texts)}, {self.config.dim}), got {vecs.shape}"
            )
        if not np.issubdtype(vecs.dtype, np.floating):
            raise ValueError(f"embeddings must be floating point, got {vecs.dtype}")
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def _query_vector(self, query: str | np.ndarray) -> np.ndarray:
        if isinstance(query, str):
            return self._vectors([query], None)[0]
        q = np.asarray(query)
        if q.ndim != 1 or q.shape[0] != self.config.dim:
            raise ValueError(f"query vector must have shape ({self.config.dim},), got {q.shape}")
        return self._vectors([""], q[None, :])[0]

    def _get_embedder(self) -> Any:
        if self._embedder is None:
            if self._embedder_arg is False:
                raise ValueError("this store was opened with embedder=False: pass embeddings / a query vector")
            from clag_fast.embed import Embedder

            self._embedder = Embedder(precision=self._embed_precision or "auto")
        return self._embedder

    def _row_of(self, memory_id: int, include_archived: bool = False) -> int:
        r = self._db.execute("SELECT vector_row, state FROM memories WHERE id=?", (_check_id(memory_id),)).fetchone()
        if r is None or (r[1] != schema.LIVE and not include_archived):
            raise KeyError(f"no memory with id {memory_id}")
        return int(r[0])

    def _details(self, mids: list[int]) -> dict[int, tuple]:
        if not mids:
            return {}
        q = ",".join("?" * len(mids))
        out = {}
        for mid, text, kind, ns, created, meta in self._db.execute(
            f"SELECT id, text, kind, namespace, created_at, metadata FROM memories WHERE id IN ({q})", mids
        ):
            out[mid] = (text, kind, ns, created, _loads(meta))
        return out

    def _flush_access(self) -> None:
        """Access counts are kept in memory on the search path and written in one batch."""
        with self._access_lock:
            dirty, self._access_dirty = self._access_dirty, {}
            hits, self._cluster_hits = self._cluster_hits, {}
        if not dirty and not hits:
            return
        with schema.transaction(self._db):
            self._db.executemany(
                "UPDATE memories SET last_accessed=?, access_count=access_count+? WHERE id=?",
                [(t, n, m) for m, (t, n) in dirty.items()],
            )
            self._db.executemany("UPDATE clusters SET last_hit_at=? WHERE id=?", [(t, c) for c, t in hits.items()])

    def _auto_probe(self, n_clusters: int) -> int:
        cfg = self.config
        if cfg.n_probe is not None:
            return cfg.n_probe
        return int(min(max(4, math.ceil(cfg.probe_fraction * n_clusters)), cfg.max_probe))

    def _probe_rule(self) -> dict:
        """Adaptive-probing arguments for an automatic n_probe (none for a configured one)."""
        cfg = self.config
        if cfg.n_probe is not None or cfg.probe_gap is None:
            return {}
        return {"probe_gap": cfg.probe_gap, "min_probe": cfg.min_probe}

    def _decay_weights(self, policy) -> np.ndarray:
        """Per-row decay weights, recomputed after writes or once a minute.

        A half-life is measured in days, so a minute-old weight is off by < 0.05% even at a
        one-day half-life, while recomputing costs ~2 ms per 100k rows: several times a
        two-stage search. Accesses by searches count at the next recomputation.
        """
        now = time.time()
        cached = self._weights_cache
        if cached is not None and cached[0] == self._rows.version and now - cached[1] < 60.0:
            return cached[2]
        w = self._rows.weights(policy, now)
        self._weights_cache = (self._rows.version, now, w)
        return w

    def _cache_get(self, key: tuple) -> Hits | None:
        hits = self._cache.get(key)
        if hits is None:
            return None
        self._cache.move_to_end(key)
        self._counters["cache_hits"] += 1
        out = Hits(list(hits), scanned=hits.scanned, candidates=hits.candidates,
                   clusters_probed=list(hits.clusters_probed), mode=hits.mode, latency_s=0.0, cached=True)
        return out

    def _cache_put(self, key: tuple, hits: Hits) -> None:
        self._cache[key] = hits
        if len(self._cache) > self.config.cache_size:
            self._cache.popitem(last=False)


# -- helpers ----------------------------------------------------------------------------
def _check_store_dir(path: Path, read_only: bool) -> None:
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")
    if path.is_dir():
        entries = {p.name for p in path.iterdir()}
        if entries and DB_NAME not in entries:
            raise schema.StoreFormatError(
                f"{path} is not empty and holds no clag_fast store ({DB_NAME} missing)"
            )
    elif read_only:
        raise FileNotFoundError(f"no store at {path}")


def _check_texts(texts: Iterable[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("add_many takes a list of texts, not one string (use add)")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"text {i} is {type(t).__name__}, not str")
        if not t.strip():
            raise ValueError(f"text {i} is empty or whitespace only")
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"text {i} is not valid unicode ({e.reason})") from None
    return out


def _per_item(values: Sequence[str] | str | None, n: int, default: str, name: str) -> list[str]:
    if values is None:
        return [default] * n
    if isinstance(values, str):
        values = [values] * n
    out = list(values)
    if len(out) != n:
        raise ValueError(f"{name} has {len(out)} items for {n} texts")
    for i, v in enumerate(out):
        if not isinstance(v, str) or not v:
            raise ValueError(f"{name}[{i}] must be a non-empty string, got {v!r}")
    return out


def _metadata_json(metadata: Sequence[dict[str, Any] | None] | None, n: int) -> list[str | None]:
    if metadata is None:
        return [None] * n
    items = list(metadata)
    if len(items) != n:
        raise ValueError(f"metadata has {len(items)} items for {n} texts")
    out = []
    for i, m in enumerate(items):
        if m is None:
            out.append(None)
            continue
        if not isinstance(m, dict):
            raise TypeError(f"metadata[{i}] must be a dict or None, got {type(m).__name__}")
        try:
            out.append(json.dumps(m, ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise ValueError(f"metadata[{i}] is not JSON-serialisable: {e}") from None
    return out


def _check_id(memory_id: Any) -> int:
    if isinstance(memory_id, bool) or not isinstance(memory_id, (int, np.integer)):
        raise TypeError(f"memory id must be an int, got {type(memory_id).__name__}")
    return int(memory_id)


def _loads(s: str | None) -> Any:
    return None if s is None else json.loads(s)


def _distribution(sizes: np.ndarray) -> dict[str, float]:
    if len(sizes) == 0:
        return {"min": 0, "median": 0, "max": 0, "mean": 0.0}
    return {"min": int(sizes.min()), "median": float(np.median(sizes)), "max": int(sizes.max()),
            "mean": float(sizes.mean())}

