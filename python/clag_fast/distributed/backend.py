"""ShardedStore: MemoryStore's methods over the shard owners of a sharded store.

The HTTP service (``clag_fast.server``) calls a store; behind the Ray front door that store is
this object. Each call goes to the shard that owns its namespace (or whose number its ids
carry); calls that span namespaces (a search or listing without a namespace, namespaces,
clusters, stats, organize, forget, flush) fan out to every shard that exists and merge.

Reads never create a shard: a namespace whose shard has no store yet simply holds nothing
(a search finds nothing, a key lookup is a KeyError -> 404), so probing unknown names costs
no actor and no directory. Writes create the shard's owner on first use.

A shard that is restarting or unreachable answers ``ShardUnavailable`` (HTTP 503 with
Retry-After). A write that fails that way is never retried here: the owner may have
committed it before dying, and only the caller knows whether the write is idempotent (keys).
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import numpy as np

from clag_fast._deprecated import renamed_kwargs
from clag_fast.arguments import batch_namespaces
from clag_fast.distributed.owner import MAX_CONCURRENCY, RAY_NAMESPACE, ShardOwner
from clag_fast.distributed.shardmap import ShardMap, decode_id
from clag_fast.errors import ShardUnavailable
from clag_fast.results import Hits, MemoryPage

log = logging.getLogger(__name__)

_SUMMED = ("memories", "archived", "vector_rows", "clusters", "adds", "searches", "cache_hits", "organizations")


def owner_handle(layout: ShardMap, shard: int, **placement: Any) -> Any:
    """The shard's owner actor, created if it does not exist yet (by whoever asks first:
    Ray's control store gives every racer the same named actor). ``placement``: extra actor
    options for a new owner (``scheduling_strategy``, ``resources``); an existing one stays
    where it is."""
    import ray

    options: dict[str, Any] = dict(
        name=f"clag-{layout.cluster_name}-shard-{shard:04d}", namespace=RAY_NAMESPACE, get_if_exists=True,
        lifetime="detached",
        # Restart forever: the store's directory is the state, and reopening it recovers
        # every committed write. No task retries: a write in flight when the owner died may
        # have been committed, and retrying it blindly could store it twice.
        max_restarts=-1, max_task_retries=0, max_concurrency=MAX_CONCURRENCY,
        # The owner's threads do the store's work, but reserving a core per shard would
        # leave none for ingest tasks on small nodes; its calls are the load, not its life.
        num_cpus=0)
    options.update(placement)
    return ray.remote(ShardOwner).options(**options).remote(str(layout.root), shard)


class ShardedStore:
    """A store-like object whose calls run on the shard owners (Ray actors).

    Args:
      root: the sharded store's directory (``cluster.json`` + ``shards/NNNN/``), on storage
        every node that may run an owner can reach (one machine, or a shared filesystem).
      shards, dim, embedder, slm: the layout, when ``root`` is new (else checked against it);
        ``slm``: "off", "managed" or a server URL (``llm`` is its deprecated spelling).
      timeout_s: how long one call waits for an owner before answering ShardUnavailable.
      placement: called with a shard number, returns extra actor options for its owner when
        this object creates it (say a node-affinity ``scheduling_strategy``); None: Ray decides.
    """

    @renamed_kwargs(llm="slm")
    def __init__(self, root: str | os.PathLike[str], shards: int | None = None, *, dim: int | None = None,
                 embedder: bool | None = None, slm: str | None = None, timeout_s: float = 30.0,
                 placement: Callable[[int], dict[str, Any]] | None = None) -> None:
        self._placement = placement
        self.layout = ShardMap.create_or_load(root, shards, dim=dim, embedder=embedder, slm=slm)
        self.config = SimpleNamespace(dim=self.layout.dim)  # what the routes read (vector width)
        self.timeout_s = timeout_s
        self._handles: dict[int, Any] = {}
        self._existing: set[int] = set()
        self._lock = threading.Lock()
        self._map_mtime = self._mtime()
        self._pool = ThreadPoolExecutor(max_workers=min(32, max(4, self.layout.shards)),
                                        thread_name_prefix="clag-shards")

    # -- routing ---------------------------------------------------------------------------
    def _mtime(self) -> float:
        return os.stat(self.layout.root / "cluster.json").st_mtime_ns

    def shard_of(self, namespace: str) -> int:
        """The owning shard of a namespace (pins written by other processes are seen at once:
        one stat of the map file per call)."""
        mtime = self._mtime()
        if mtime != self._map_mtime:
            self.layout, self._map_mtime = ShardMap.load(self.layout.root), mtime
        return self.layout.shard_of(namespace)

    def _exists(self, shard: int) -> bool:
        if shard in self._existing:
            return True
        if 0 <= shard < self.layout.shards and (self.layout.shard_dir(shard) / "memories.db").exists():
            self._existing.add(shard)
            return True
        return False

    def existing_shards(self) -> list[int]:
        return [s for s in range(self.layout.shards) if self._exists(s)]

    def owner(self, shard: int) -> Any:
        """The owner of ``shard`` (created on first need: callers check ``_exists`` for reads)."""
        with self._lock:
            h = self._handles.get(shard)
            if h is None:
                extra = self._placement(shard) if self._placement is not None else {}
                h = self._handles[shard] = owner_handle(self.layout, shard, **extra)
        return h

    def _call(self, shard: int, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        try:
            ref = getattr(self.owner(shard), method).remote(*args, **kwargs)
            out = ray.get(ref, timeout=self.timeout_s)
        except RayTaskError as e:
            cause = e.cause if isinstance(e.cause, BaseException) else None
            if cause is None:
                raise
            raise cause from None  # the store's own error (KeyError, ValueError, ...): answered as such
        except (RayActorError, GetTimeoutError) as e:  # ActorUnavailableError (restarting) included
            raise ShardUnavailable(f"shard {shard} is restarting or unreachable ({type(e).__name__}); "
                                   f"retry shortly") from None
        self._existing.add(shard)
        return out

    def _fan_out(self, method: str, *args: Any, shards: Sequence[int] | None = None, **kwargs: Any) -> dict[int, Any]:
        """``method`` on every existing shard (or ``shards``) at once; {shard: result}."""
        targets = self.existing_shards() if shards is None else list(shards)
        futures = {s: self._pool.submit(self._call, s, method, *args, **kwargs) for s in targets}
        return {s: f.result() for s, f in futures.items()}

    # -- writes ----------------------------------------------------------------------------
    def add_many(self, texts: Sequence[str], embeddings: np.ndarray | None = None, kinds: Any = None,
                 namespaces: Any = None, metadata: Any = None, *, keys: Any = None,
                 defer_organize: bool = False, namespace: str | None = None) -> list[int]:
        """``MemoryStore.add_many``, split by owning shard. Atomic within a shard; a batch that
        spans shards is committed shard by shard (all of them at once, in parallel).
        ``namespace`` (the whole batch) or ``namespaces`` (one per item), as ``MemoryStore``.
        ``defer_organize``: a bulk load's write (``organize_deferred`` after the last)."""
        namespaces = batch_namespaces(namespace, namespaces)
        n = len(texts)
        kinds = _per_item(kinds, n, "kinds", "fact")
        namespaces = _per_item(namespaces, n, "namespaces", "default")
        metadata = _per_item(metadata, n, "metadata", None)
        keys = _per_item(keys, n, "keys", None)
        groups: dict[int, list[int]] = {}
        for i, ns in enumerate(namespaces):
            if not isinstance(ns, str) or not ns:
                raise ValueError(f"namespaces[{i}] must be a non-empty string, got {ns!r}")
            groups.setdefault(self.shard_of(ns), []).append(i)

        def one(shard: int, idx: list[int]) -> list[int]:
            emb = None if embeddings is None else np.asarray(embeddings)[idx]
            return self._call(shard, "add_many", [texts[i] for i in idx], emb, [kinds[i] for i in idx],
                              [namespaces[i] for i in idx], [metadata[i] for i in idx],
                              None if all(keys[i] is None for i in idx) else [keys[i] for i in idx],
                              defer_organize=defer_organize)

        if len(groups) == 1:
            ((shard, idx),) = groups.items()
            return one(shard, idx)
        futures = {s: self._pool.submit(one, s, idx) for s, idx in groups.items()}
        out: list[int] = [0] * n
        for s, idx in groups.items():
            for i, mid in zip(idx, futures[s].result()):
                out[i] = mid
        return out

    def add(self, text: str, embedding: np.ndarray | None = None, kind: str = "fact", namespace: str = "default",
            metadata: dict | None = None, *, key: str | None = None) -> int:
        emb = None if embedding is None else np.asarray(embedding)[None, ...]
        return self.add_many([text], emb, [kind], [namespace], [metadata], keys=[key])[0]

    def missing_keys(self, namespace: str, keys: Sequence[str]) -> list[str]:
        """The keys not yet stored in ``namespace``."""
        shard = self.shard_of(namespace)
        return list(keys) if not self._exists(shard) else self._call(shard, "missing_keys", namespace, list(keys))

    def update(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default",
               **changes: Any) -> None:
        shard = self._existing_shard_for(memory_id, key, namespace)
        self._call(shard, "update", memory_id, key=key, namespace=namespace, **changes)

    def delete(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default") -> None:
        shard = self._existing_shard_for(memory_id, key, namespace)
        self._call(shard, "delete", memory_id, key=key, namespace=namespace)

    def delete_many(self, memory_ids: Sequence[int] | None = None, *, keys: Sequence[str] | None = None,
                    namespace: str = "default") -> int:
        if (memory_ids is None) == (keys is None):
            raise ValueError("delete_many needs memory_ids or keys (exactly one)")
        if keys is not None:
            shard = self.shard_of(namespace)
            return self._call(shard, "delete_many", keys=list(keys), namespace=namespace) if self._exists(shard) else 0
        groups = self._by_shard(memory_ids)
        return sum(self._fan_out_groups("delete_many", groups).values())

    def delete_namespace(self, namespace: str) -> int:
        shard = self.shard_of(namespace)
        return self._call(shard, "delete_namespace", namespace) if self._exists(shard) else 0

    # -- reads -----------------------------------------------------------------------------
    def search_many(self, queries: Any, k: int = 5, *, namespace: str | None = None, **options: Any) -> list[Hits]:
        """``MemoryStore.search_many``: on the namespace's shard, or on every shard merged by
        score (each shard's top k, then the best k of those)."""
        n = len(queries)
        if namespace is not None:
            shard = self.shard_of(namespace)
            if not self._exists(shard):
                return [Hits([]) for _ in range(n)]
            return self._call(shard, "search_many", queries, k=k, namespace=namespace, **options)
        per_shard = self._fan_out("search_many", queries, k=k, namespace=None, **options)
        if not per_shard:
            return [Hits([]) for _ in range(n)]
        return [_merge_hits([r[q] for r in per_shard.values()], k) for q in range(n)]

    def search(self, query: Any, k: int = 5, **options: Any) -> Hits:
        queries = np.asarray(query, np.float32)[None, :] if not isinstance(query, str) else [query]
        return self.search_many(queries, k, **options)[0]

    def get(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default") -> Any:
        shard = self._existing_shard_for(memory_id, key, namespace)
        return self._call(shard, "get", memory_id, key=key, namespace=namespace)

    def get_many(self, memory_ids: Sequence[int] | None = None, *, keys: Sequence[str] | None = None,
                 namespace: str = "default") -> list[Any]:
        if (memory_ids is None) == (keys is None):
            raise ValueError("get_many needs memory_ids or keys (exactly one)")
        if keys is not None:
            shard = self.shard_of(namespace)
            return self._call(shard, "get_many", keys=list(keys), namespace=namespace) if self._exists(shard) else []
        ids = list(memory_ids)
        found = {m.memory_id: m for ms in self._fan_out_groups("get_many", self._by_shard(ids)).values() for m in ms}
        return [found[i] for i in ids if i in found]

    def memories(self, namespace: str | None = None, cluster: int | None = None, where: Any = None,
                 kind: str | None = None, limit: int = 100, cursor: str | None = None) -> MemoryPage:
        """Live memories a page at a time: shard by shard (by id within a shard). The cursor
        is ``"<shard>.<the shard's cursor>"``."""
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        if cluster is not None:
            shards = [decode_id(cluster)[0]]
        elif namespace is not None:
            shards = [self.shard_of(namespace)]
        else:
            shards = self.existing_shards()
        shards = [s for s in shards if self._exists(s)]
        start, inner = _parse_cursor(cursor)
        items: list[Any] = []
        for s in shards:
            if s < start:
                continue
            page = self._call(s, "memories", namespace=namespace, cluster=cluster, where=where, kind=kind,
                              limit=limit - len(items), cursor=inner if s == start else None)
            items.extend(page.items)
            if page.next_cursor is not None:
                return MemoryPage(items, f"{s}.{page.next_cursor}")
            if len(items) >= limit:
                later = [t for t in shards if t > s]
                return MemoryPage(items, f"{later[0]}." if later else None)
        return MemoryPage(items, None)

    def namespaces(self) -> list[str]:
        return sorted({n for names in self._fan_out("namespaces").values() for n in names})

    def clusters(self) -> list[Any]:
        out = [c for cs in self._fan_out("clusters").values() for c in cs]
        return sorted(out, key=lambda c: (-c.size, c.id))

    def __len__(self) -> int:
        return sum(self._fan_out("count").values())

    def stats(self) -> dict[str, Any]:
        """Counts summed over the shards, plus each shard's own statistics under "shards"."""
        per = self._fan_out("stats")
        out: dict[str, Any] = {k: sum(s[k] for s in per.values()) for k in _SUMMED}
        routing: dict[str, int] = {}
        for s in per.values():
            for k, v in s["routing"].items():
                routing[k] = routing.get(k, 0) + v
        out["routing"] = routing
        out["slm"] = next((s["slm"] for s in per.values()), "off" if self.layout.slm == "off" else self.layout.slm)
        out["layout"] = {"root": str(self.layout.root), "shards": self.layout.shards, "created": sorted(per),
                         "pins": dict(self.layout.pins)}
        out["shards"] = {str(k): v for k, v in sorted(per.items())}
        return out

    # -- admin -----------------------------------------------------------------------------
    def organize(self, task_context: str | None = None) -> dict[str, Any]:
        return {"shards": {str(k): v for k, v in self._fan_out("organize", task_context).items()}}

    def organize_deferred(self) -> dict[str, Any]:
        """``MemoryStore.organize_deferred`` on every shard at once: {"shards": {shard: report
        or None}}."""
        return {"shards": {str(k): v for k, v in self._fan_out("organize_deferred").items()}}

    def forget(self, now: float | None = None) -> dict[str, Any]:
        return {"shards": {str(k): v for k, v in self._fan_out("forget", now).items()}}

    def flush(self) -> None:
        """Persist every shard (then each shard directory can be copied as a backup)."""
        self._fan_out("flush")

    def pin(self, namespace: str, shard: int) -> None:
        """Give ``namespace`` a shard of its own choosing (a large tenant), before it holds
        memories: moving a namespace's existing memories is a copy job, not a routing change."""
        current = self.shard_of(namespace)
        if self._exists(current) and self._call(current, "memories", namespace=namespace, limit=1).items:
            raise ValueError(f"namespace {namespace!r} already holds memories in shard {current}: pin it "
                             f"before its first write (moving a namespace is described in docs/SCALING.md)")
        self.layout = self.layout.pin(namespace, shard)
        self._map_mtime = self._mtime()

    def shutdown(self) -> None:
        """Flush and stop every owner actor of this store (they are detached: they outlive
        front doors and drivers until this is called or the Ray cluster stops)."""
        import ray

        for s in self.existing_shards():
            try:
                self._call(s, "flush")
                ray.kill(self.owner(s), no_restart=True)
            except ShardUnavailable:
                log.warning("shard %d did not answer the final flush", s)
        self._handles.clear()

    def close(self) -> None:
        """Forget the handles (the owners keep running: they belong to the cluster)."""
        self._pool.shutdown(wait=True)
        self._handles.clear()

    # -- helpers ---------------------------------------------------------------------------
    def _shard_for(self, memory_id: int | None, key: str | None, namespace: str) -> int:
        if (memory_id is None) == (key is None):
            raise ValueError("give a memory id or a key (exactly one)")
        return decode_id(memory_id)[0] if memory_id is not None else self.shard_of(namespace)

    def _existing_shard_for(self, memory_id: int | None, key: str | None, namespace: str) -> int:
        """The shard of an id or key, which must exist: an unknown one is a KeyError (404),
        and never creates the shard."""
        shard = self._shard_for(memory_id, key, namespace)
        if not self._exists(shard):
            what = f"id {memory_id}" if memory_id is not None else f"key {key!r} in namespace {namespace!r}"
            raise KeyError(f"no memory with {what}")
        return shard

    def _by_shard(self, ids: Sequence[int]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for i in ids:
            shard = decode_id(i)[0]
            if self._exists(shard):
                groups.setdefault(shard, []).append(i)
        return groups

    def _fan_out_groups(self, method: str, groups: dict[int, list[int]]) -> dict[int, Any]:
        futures = {s: self._pool.submit(self._call, s, method, ids) for s, ids in groups.items()}
        return {s: f.result() for s, f in futures.items()}


def _per_item(value: Any, n: int, name: str, default: Any) -> list[Any]:
    if value is None:
        return [default] * n
    if isinstance(value, str):
        return [value] * n
    value = list(value)
    if len(value) != n:
        raise ValueError(f"{name} has {len(value)} entries for {n} texts")
    return value


def _merge_hits(parts: list[Hits], k: int) -> Hits:
    best = heapq.nlargest(k, (h for p in parts for h in p), key=lambda h: h.score)
    return Hits(best, scanned=sum(p.scanned for p in parts), candidates=sum(p.candidates for p in parts),
                clusters_probed=[c for p in parts for c in p.clusters_probed],
                mode=parts[0].mode, latency_s=max(p.latency_s for p in parts),
                cached=all(p.cached for p in parts))


def _parse_cursor(cursor: str | None) -> tuple[int, str | None]:
    if cursor is None:
        return 0, None
    shard, sep, inner = str(cursor).partition(".")
    if not sep or not shard.isdigit():
        raise ValueError(f"cursor {cursor!r} is not one that memories() returned")
    return int(shard), inner or None


