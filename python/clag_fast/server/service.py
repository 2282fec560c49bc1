"""StoreService: the one open store behind the HTTP API, and the work shared across requests.

Adds from concurrent requests are coalesced (``batching.Coalescer``) into one ``add_many`` per
batch: one embedding call, one SQLite transaction, one answer to every request once the batch
is committed (group commit). Searches with the same options are coalesced into one
``search_many`` (one embedding call, one native call over the cores). Every store call runs in
a worker thread so the event loop only parses and answers. The store's own background worker
runs the SLM organiser.

Tenancy lives here too: a key that reads only some namespaces sees cluster labels only for
clusters whose members all lie in those namespaces (a label is written from the members'
texts, so a mixed cluster's label could describe another tenant's memories).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from clag_fast.config import StoreConfig
from clag_fast.embed.service_embedder import ServiceEmbedder
from clag_fast.server import tenancy
from clag_fast.server.auth import Principal
from clag_fast.server.batching import Coalescer
from clag_fast.server.settings import ServeConfig
from clag_fast.store import MemoryStore
from clag_fast.store.dimension import PENDING

log = logging.getLogger(__name__)

class AddPayload:
    """One request's memories, checked and ready for ``add_many``."""

    __slots__ = ("texts", "vectors", "kinds", "namespaces", "metadata", "keys", "turns")

    def __init__(self, texts: list[str], vectors: np.ndarray | None, kinds: list[str], namespaces: list[str],
                 metadata: list[dict | None], keys: list[str | None], turns: dict[str, list] | None = None) -> None:
        self.texts, self.vectors, self.kinds = texts, vectors, kinds
        self.namespaces, self.metadata, self.keys = namespaces, metadata, keys
        self.turns = turns or {}  # add_many's per-item conversation arguments: threads, turns, speakers, supersedes


class StoreService:
    """Opens the store, runs the batchers and the warm-up, answers the routes' calls."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.store: MemoryStore | None = None
        self.embedder: ServiceEmbedder | None = None
        self.embedder_state = "not used (bring-your-own vectors)" if not config.embedder else "not loaded"
        self.started_at = time.time()
        limits = config.limits
        self._executor = ThreadPoolExecutor(max_workers=3 + config.add_workers + config.search_workers,
                                            thread_name_prefix="clag-serve")
        # Batches that embed texts run one at a time, vector batches side by side (``batching``).
        self.adds = Coalescer("add", self._add_batch, self._executor, max_items=limits.max_batch,
                              max_pending=limits.max_pending, workers=config.add_workers,
                              solo=lambda group: group == "texts")
        self.searches = Coalescer("search", self._search_batch, self._executor, max_items=config.search_batch,
                                  max_pending=limits.max_pending, workers=config.search_workers,
                                  solo=lambda group: group[0] == "text")
        # cluster id -> namespaces of its members, for keys that read only some namespaces:
        # built on first need, then kept up to date by the writes (see ``rerouted``).
        self._table: dict[int, set[str]] | None = None
        self._table_generation: tuple | None = None
        self._table_lock = threading.Lock()
        # Memories also move between clusters outside the service's own calls (each followed
        # by ``rerouted``): the store's worker re-organises in the background, with or without
        # an SLM (``open``).
        self._moves_in_background = True

    # -- life ----------------------------------------------------------------------------
    def open(self) -> MemoryStore:
        """Open the store (synchronously, so a locked or foreign directory fails at start-up)."""
        c = self.config
        cfg = None
        if c.dim is not None or c.slm == "off" or c.fsync or c.embed_cache != StoreConfig().embed_cache:
            stored_dim = _stored_dim(c.store)
            kwargs: dict[str, Any] = {"dim": stored_dim or c.dim, "fsync": c.fsync,
                                      "embed_cache": c.embed_cache}
            if c.slm == "off":
                # Periodic re-organisations run in the store's worker, not inside the add batch
                # that triggers one: the requests committed in that batch are answered at once
                # instead of after it (0.3-1 s, the adds' p99 in benches/bench_service.py).
                kwargs["slm"] = StoreConfig().slm.replace(mode="off", vector_in_background=True)
            cfg = StoreConfig(**kwargs)
        slm: Any = None if c.slm == "managed" else False if c.slm == "off" else c.slm
        embedder: Any = False
        if c.embedder:
            precision = _stored_meta(c.store, "embed_precision")
            if precision is None:
                # A new store (or one written before precisions were recorded): let the store
                # settle and record its precision by its own rule, as a plain open does.
                MemoryStore.open(c.store, config=cfg, slm=False).close()
                precision = _stored_meta(c.store, "embed_precision")
            embedder = ServiceEmbedder(precision or "auto")
        self.embedder = embedder or None
        self.store = MemoryStore.open(c.store, config=cfg, embedder=embedder, slm=slm)
        return self.store

    async def start(self) -> None:
        """Start the batch workers."""
        self.adds.start()
        self.searches.start()

    def warm_up(self) -> None:
        """Load the embedding model in a background thread (/healthz tells when it is ready;
        a text request before then waits for it)."""
        if self.config.embedder and self.embedder_state == "not loaded":
            self.embedder_state = "loading"
            threading.Thread(target=self._warm_up, name="clag-serve-warmup", daemon=True).start()

    async def close(self) -> None:
        """Answer what is queued, then persist and release the store."""
        await self.adds.close()
        await self.searches.close()
        self._executor.shutdown(wait=True)
        if self.store is not None:
            self.store.close()
            self.store = None

    def _warm_up(self) -> None:
        """Load the ONNX sessions of the store's embedder (directly, not through a search that
        would count in the store's statistics and triggers)."""
        t0 = time.perf_counter()
        try:
            assert self.embedder is not None
            self.embedder.warm_up()
        except Exception as e:  # a missing model is reported by /healthz and by the first text request
            self.embedder_state = f"failed: {e}"
            log.warning("the embedding model did not load: %s", e)
        else:
            self.embedder_state = "ready"
            log.info("embedding model loaded in %.1f s", time.perf_counter() - t0)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a store call in a worker thread."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    # -- adds ----------------------------------------------------------------------------
    async def add(self, payload: AddPayload) -> list[int]:
        """Add one request's memories as part of the next batch; returns once committed."""
        group = "vectors" if payload.vectors is not None else "texts"
        ids = await self.adds.submit(group, payload, len(payload.texts))
        return ids

    def _add_batch(self, group: Hashable, payloads: list[AddPayload]) -> list[Any]:
        try:
            ids = self._add_many(payloads)
        except Exception as e:
            if len(payloads) == 1:
                return [e]
            # add_many is atomic: the batch wrote nothing, so each request is retried alone
            # and only the bad one fails.
            out: list[Any] = []
            for p in payloads:
                try:
                    out.append(self._add_many([p]))
                except Exception as e1:
                    out.append(e1)
            return out
        out, start = [], 0
        for p in payloads:
            out.append(ids[start:start + len(p.texts)])
            start += len(p.texts)
        return out

    def _add_many(self, payloads: list[AddPayload]) -> list[int]:
        texts = [t for p in payloads for t in p.texts]
        vectors = None
        if payloads[0].vectors is not None:
            vectors = np.concatenate([p.vectors for p in payloads]) if len(payloads) > 1 else payloads[0].vectors
        keys = [k for p in payloads for k in p.keys]
        extra: dict[str, Any] = {"keys": keys} if any(k is not None for k in keys) else {}
        for name in {name for p in payloads for name in p.turns}:
            extra[name] = [v for p in payloads for v in p.turns.get(name, [None] * len(p.texts))]
        ids = self.store.add_many(texts, embeddings=vectors, kinds=[k for p in payloads for k in p.kinds],
                                  namespaces=[n for p in payloads for n in p.namespaces],
                                  metadata=[m for p in payloads for m in p.metadata], **extra)
        self.rerouted(ids)
        return ids

    # -- searches ------------------------------------------------------------------------
    async def search(self, queries: list[str] | np.ndarray, options: dict[str, Any]) -> list[Any]:
        """Search as part of the next batch with the same options; one Hits per query."""
        kind = "text" if isinstance(queries, list) else "vector"
        return await self.searches.submit(search_group(kind, options), (queries, options), len(queries))

    def _search_batch(self, group: Hashable, payloads: list[tuple[Any, dict[str, Any]]]) -> list[Any]:
        def run(items: list[tuple[Any, dict[str, Any]]]) -> list[Any]:
            options = items[0][1]
            if group[0] == "text":
                queries: Any = [q for qs, _ in items for q in qs]
            else:
                queries = np.concatenate([qs for qs, _ in items]) if len(items) > 1 else items[0][0]
            opts = {k: v for k, v in options.items() if not (k == "where" and v is None)}
            hits = self.store.search_many(queries, **opts)
            out, start = [], 0
            for qs, _ in items:
                out.append(hits[start:start + len(qs)])
                start += len(qs)
            return out

        try:
            return run(payloads)
        except Exception as e:
            if len(payloads) == 1:
                return [e]
            out: list[Any] = []
            for p in payloads:
                try:
                    out.extend(run([p]))
                except Exception as e1:
                    out.append(e1)
            return out

    # -- tenancy -------------------------------------------------------------------------
    def _generation(self) -> tuple:
        """Changes when memories may have moved between clusters outside the service's own
        writes: organisations (explicit, periodic inside an add, or in the SLM worker) and
        SLM routes."""
        stats = self.store.stats()
        routing = stats["routing"]
        return stats["organizations"], routing.get("slm", 0), routing.get("fallback", 0)

    def rerouted(self, ids: list[int] | None) -> None:
        """After a write placed ``ids`` (None: anything may have moved): keep the cluster
        table exact by adding their namespaces, or drop it for a rebuild. Deletes need no call:
        a removed memory can only make a cluster purer, and the table stays on the safe side
        until the next rebuild. Runs in a worker thread."""
        with self._table_lock:
            if self._table is None:
                return
            if ids is None or self._generation() != self._table_generation:
                self._table = None
                return
            margin = float(self.store.config.spill_margin)
            memories = self.store.get_many(ids)
            for m, cids in zip(memories, tenancy.listed_in(memories, margin)):
                for cid in cids:
                    self._table.setdefault(cid, set()).add(m.namespace)

    def cluster_namespaces(self) -> dict[int, set[str]]:
        """cluster id -> the namespaces of its members (``tenancy.cluster_namespaces``): one
        scan of the store on first need, then updated by ``rerouted``; rebuilt when the store
        re-organised. Runs in a worker thread."""
        with self._table_lock:
            stale = self._table is None or (self._moves_in_background
                                            and self._generation() != self._table_generation)
            if stale:
                self._table_generation = self._generation()
                self._table = {c: set(ns) for c, ns in tenancy.cluster_namespaces(self.store).items()}
            return {c: set(ns) for c, ns in self._table.items()}

    def visible_clusters(self, principal: Principal) -> Callable[[int | None], bool]:
        """A predicate: may ``principal`` see this cluster's label (summary, tags, id)?"""
        if principal.unrestricted:
            return lambda cid: True
        pure = tenancy.pure_clusters(self.cluster_namespaces(), principal.can_read)
        return lambda cid: cid in pure

    def namespace_counts(self, principal: Principal) -> dict[str, int]:
        """Live memories per namespace the principal may read."""
        return tenancy.namespace_counts(self.store, principal.can_read)


def search_group(kind: str, options: dict[str, Any]) -> tuple:
    """The coalescing key of a search: requests with equal keys run as one ``search_many``.
    The scalar options as they are (numerically equal values filter alike), the metadata
    filter as canonical JSON. Built on the event loop for every search: a tuple costs 0.3 us
    where ``json.dumps`` of all the options cost 4 us."""
    where = options.get("where")
    scalars = tuple(item for item in options.items() if item[0] != "where")
    return kind, scalars, None if where is None else json.dumps(where, sort_keys=True, default=str)


def _stored_meta(path: Any, key: str) -> str | None:
    """One value of a store's meta table, read through a read-only catalog connection."""
    from pathlib import Path

    from clag_fast.store.catalog import Catalog

    db = Path(path) / "memories.db"
    if not db.exists() or db.stat().st_size == 0:
        return None
    catalog = Catalog(db, read_only=True)
    try:
        return catalog.meta(key)
    finally:
        catalog.close()


def _stored_dim(path: Any) -> int | None:
    """The dim of an existing store (so --dim may be omitted when reopening), read without
    opening the whole store. A store written by an older clag_fast needs a schema migration
    first, which only a writable open does: it is opened once for that."""
    from clag_fast.errors import StoreFormatError

    try:
        if _stored_meta(path, PENDING) is not None:
            return None  # a store whose width its first vectors will fix
        value = _stored_meta(path, "dim")
    except StoreFormatError as e:
        if "migration" not in str(e):
            raise
        with MemoryStore.open(path, embedder=False, slm=False) as store:
            return store.config.dim
    return int(value) if value is not None else None


def as_payload(texts: Sequence[str], vectors: list[list[float]] | None, kinds: Sequence[str],
               namespaces: Sequence[str], metadata: Sequence[dict | None], keys: Sequence[str | None],
               turns: dict[str, list] | None = None) -> AddPayload:
    arr = None if vectors is None else np.asarray(vectors, dtype=np.float32)
    return AddPayload(list(texts), arr, list(kinds), list(namespaces), list(metadata), list(keys), turns)
