"""ShardOwner: the Ray actor that owns one shard's store directory.

One actor per shard, named after the store root and the shard, so there is exactly one
writer per store by construction: every front door and ingest worker asks Ray for the actor
by name (``get_if_exists``), and when two race to create it, Ray's control store lets one win
and hands the other the same actor. The actor is detached (it outlives the front door that
created it) and restarts on failure (``max_restarts``): the new incarnation reopens the store,
whose own recovery replays whatever the dead one had committed.

The owner speaks the API's ids (shard in the top bits, ``shardmap.encode_id``), so the front
door only routes and merges.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

import numpy as np

from clag_fast.distributed.shardmap import ShardMap, decode_id, encode_id
from clag_fast.embed.service_embedder import ServiceEmbedder

log = logging.getLogger(__name__)

RAY_NAMESPACE = "clag_fast"
# Calls run on this many threads inside the actor: the store is thread-safe (a read-write
# lock; searches run together, writes one at a time), and a search must not wait behind a
# long add batch of another tenant.
MAX_CONCURRENCY = 8


def _recorded_precision(path: Any) -> str | None:
    """The embedding precision a store recorded (None: a new store, or none recorded yet)."""
    from clag_fast.store.catalog import Catalog

    db = path / "memories.db"
    if not db.exists() or db.stat().st_size == 0:
        return None
    catalog = Catalog(db, read_only=True)
    try:
        return catalog.meta("embed_precision")
    finally:
        catalog.close()


class ShardOwner:
    """One shard's MemoryStore, opened in this actor's process. Methods mirror MemoryStore's,
    with the API's global ids in and out."""

    def __init__(self, root: str, shard: int) -> None:
        from clag_fast.config import StoreConfig
        from clag_fast.store import MemoryStore

        layout = ShardMap.load(root)
        self.shard = shard
        path = layout.shard_dir(shard)
        path.parent.mkdir(parents=True, exist_ok=True)
        config = StoreConfig(dim=layout.dim, slm="off") if layout.slm == "off" else StoreConfig(dim=layout.dim)
        slm: Any = False if layout.slm == "off" else None if layout.slm == "managed" else layout.slm
        embedder: Any = None if layout.embedder else False
        if layout.embedder and layout.dim == ServiceEmbedder.model_dim():
            # As in the HTTP service: 1-thread ONNX sessions. Several owners share a node's
            # cores with each other and with the front door, so one text is one core's work.
            # (A store of another width keeps the default embedder, unused: it gets vectors.)
            precision = _recorded_precision(path)
            if precision is None:  # a new shard: the store records its precision by its own rule
                MemoryStore.open(path, config=config, slm=False).close()
                precision = _recorded_precision(path)
            embedder = ServiceEmbedder(precision or "auto")
        self.store = MemoryStore.open(path, config=config, embedder=embedder, slm=slm)
        log.info("shard %d: opened %s (%d memories)", shard, path, len(self.store))

    # -- ids -------------------------------------------------------------------------------
    def _local(self, global_id: int) -> int:
        shard, local = decode_id(int(global_id))
        if shard != self.shard:
            raise KeyError(f"no memory with id {global_id}")
        return local

    def _g(self, local: int) -> int:
        return encode_id(self.shard, local)

    def _memory(self, m: Any) -> Any:
        return dataclasses.replace(m, memory_id=self._g(m.memory_id),
                                   clusters=[(self._g(c), a) for c, a in m.clusters])

    def _cluster(self, c: Any) -> Any:
        return dataclasses.replace(c, id=self._g(c.id))

    def _hits(self, hits: Any) -> Any:
        from clag_fast.results import Hits

        out = [dataclasses.replace(h, memory_id=self._g(h.memory_id),
                                   cluster_id=None if h.cluster_id is None else self._g(h.cluster_id)) for h in hits]
        return Hits(out, scanned=hits.scanned, candidates=hits.candidates, mode=hits.mode, latency_s=hits.latency_s,
                    cached=hits.cached, clusters_probed=[self._g(c) for c in hits.clusters_probed])

    # -- the store's methods ---------------------------------------------------------------
    def ping(self) -> int:
        """The shard number (a cheap call that answers once the store is open)."""
        return self.shard

    def add_many(self, texts: Sequence[str], embeddings: np.ndarray | None = None, kinds: Any = None,
                 namespaces: Any = None, metadata: Any = None, keys: Any = None,
                 defer_organize: bool = False) -> list[int]:
        """``MemoryStore.add_many``; one atomic batch (all of it is committed, or nothing).
        ``defer_organize``: a bulk ingest's write (``organize_deferred`` after the last)."""
        ids = self.store.add_many(texts, embeddings=embeddings, kinds=kinds, namespaces=namespaces,
                                  metadata=metadata, keys=keys, defer_organize=defer_organize)
        return [self._g(i) for i in ids]

    def organize_deferred(self) -> dict[str, Any] | None:
        """``MemoryStore.organize_deferred``: the pass a bulk ingest's writes put off."""
        return self.store.organize_deferred()

    def missing_keys(self, namespace: str, keys: Sequence[str]) -> list[str]:
        """The keys of ``keys`` not yet in ``namespace`` (what a resumed ingest still has to add)."""
        present = {m.key for m in self.store.get_many(keys=list(keys), namespace=namespace)}
        return [k for k in keys if k not in present]

    def search_many(self, queries: Any, **options: Any) -> list[Any]:
        return [self._hits(h) for h in self.store.search_many(queries, **options)]

    def get(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default") -> Any:
        local = None if memory_id is None else self._local(memory_id)
        return self._memory(self.store.get(local, key=key, namespace=namespace))

    def get_many(self, memory_ids: Sequence[int] | None = None, *, keys: Sequence[str] | None = None,
                 namespace: str = "default") -> list[Any]:
        local = None if memory_ids is None else [self._local(i) for i in memory_ids]
        return [self._memory(m) for m in self.store.get_many(local, keys=keys, namespace=namespace)]

    def update(self, memory_id: int | None = None, **kwargs: Any) -> None:
        local = None if memory_id is None else self._local(memory_id)
        self.store.update(local, **kwargs)

    def delete(self, memory_id: int | None = None, **kwargs: Any) -> None:
        local = None if memory_id is None else self._local(memory_id)
        self.store.delete(local, **kwargs)

    def delete_many(self, memory_ids: Sequence[int] | None = None, **kwargs: Any) -> int:
        local = None if memory_ids is None else [self._local(i) for i in memory_ids]
        return self.store.delete_many(local, **kwargs)

    def delete_namespace(self, namespace: str) -> int:
        return self.store.delete_namespace(namespace)

    def memories(self, namespace: str | None = None, cluster: int | None = None, where: Any = None,
                 kind: str | None = None, limit: int = 100, cursor: str | None = None) -> Any:
        from clag_fast.results import MemoryPage

        local_cluster = None if cluster is None else self._local(cluster)
        page = self.store.memories(namespace=namespace, cluster=local_cluster, where=where, kind=kind,
                                   limit=limit, cursor=cursor)
        return MemoryPage([self._memory(m) for m in page.items], page.next_cursor)

    def namespaces(self) -> list[str]:
        return self.store.namespaces()

    def clusters(self) -> list[Any]:
        return [self._cluster(c) for c in self.store.clusters()]

    def organize(self, task_context: str | None = None) -> dict[str, Any]:
        return self.store.organize(task_context)

    def forget(self, now: float | None = None) -> dict[str, Any]:
        return self.store.forget(now)

    def flush(self) -> None:
        """Persist everything: after this the shard's directory is a consistent copy (backup)."""
        self.store.flush()

    def stats(self) -> dict[str, Any]:
        return self.store.stats()

    def count(self) -> int:
        return len(self.store)

    def pid(self) -> int:
        """The actor's process id (tests kill it to check restarts)."""
        import os

        return os.getpid()

    def node(self) -> str:
        """The id of the Ray node this owner runs on (placement checks)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def path(self) -> str:
        return str(self.store.path)
