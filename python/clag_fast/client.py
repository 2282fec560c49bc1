"""The Python client of ``clag-fast serve``: the same methods, arguments, results and
exceptions as ``MemoryStore``, over HTTP (httpx).

    import clag_fast
    store = clag_fast.connect("http://127.0.0.1:8420", api_key=None)   # was MemoryStore.open(...)
    store.add("The user is allergic to seafood", namespace="user-42")
    hits = store.search("what can the user eat?", k=5, namespace="user-42")

``connect_async`` returns an ``AsyncClient`` whose methods are coroutines. Errors come back as
the exceptions ``MemoryStore`` raises: ValueError (400, 413), TypeError (400 wrong_type),
KeyError (404); and as ``ServiceUnauthorized`` / ``ServiceForbidden`` (PermissionError, 401 /
403), ``ServiceBusy`` (503) or ``ServiceError`` for anything else.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

import httpx
import numpy as np

from clag_fast._deprecated import STATS_RENAMES, RenamedKeys
from clag_fast.arguments import batch_namespaces, check_conversation
from clag_fast.errors import ServiceBusy, ServiceError, ServiceForbidden, ServiceUnauthorized
from clag_fast.results import ClusterInfo, ClusterPage, Hit, Hits, Memory, MemoryPage, Turn

__all__ = ["AsyncClient", "Client", "connect", "connect_async"]

_HIT_FIELDS = {f.name for f in fields(Hit)}
_MEMORY_FIELDS = {f.name for f in fields(Memory)}


@dataclass(frozen=True)
class _Req:
    """One HTTP call and how to read its answer."""

    method: str
    path: str
    body: Any = None
    parse: Callable[[Any], Any] = lambda data: data
    params: dict[str, Any] | None = None


# -- requests: built once, sent by the sync and the async client --------------------------------
class _Requests:
    """Argument checks that need no server (so the exceptions match ``MemoryStore``'s) and the
    request each method sends."""

    def _req_add_many(self, texts, embeddings, kinds, namespaces, metadata, keys, namespace=None,
                      turns: dict[str, Any] | None = None) -> _Req | None:
        """``namespace``: the batch's one namespace, sent once for the batch (``namespaces``
        is then None). ``turns``: ``MemoryStore.add_many``'s conversation arguments (thread,
        threads, turns, speaker, speakers, supersedes), checked as the store checks them."""
        if isinstance(texts, str):
            raise TypeError("add_many takes a list of texts, not one string (use add)")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"text {i} is {type(t).__name__}, not str")
        n = len(texts)
        kinds_l = _per_item(kinds, n, "user_input", "kinds")
        ns_l = _per_item(namespaces, n, "default", "namespaces")
        meta = [None] * n if metadata is None else list(metadata)
        if len(meta) != n:
            raise ValueError(f"metadata has {len(meta)} items for {n} texts")
        for i, m in enumerate(meta):
            if m is not None and not isinstance(m, dict):
                raise TypeError(f"metadata[{i}] must be a dict or None, got {type(m).__name__}")
            try:
                json.dumps(m, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise ValueError(f"metadata[{i}] is not JSON-serialisable: {e}") from None
        keys_l = [None] * n if keys is None else list(keys)
        if len(keys_l) != n:
            raise ValueError(f"keys has {len(keys_l)} items for {n} texts")
        vecs = None
        if embeddings is not None:
            arr = np.asarray(embeddings)
            if arr.ndim != 2 or arr.shape[0] != n:
                raise ValueError(f"embeddings must have shape ({n}, dim), got {arr.shape}")
            vecs = _floats(arr)
        conv = check_conversation(n, **(turns or {}))
        if n == 0:
            return None
        items = []
        for i in range(n):
            item: dict[str, Any] = {"text": texts[i], "kind": kinds_l[i]}
            for name, values in (("thread", conv.threads), ("turn", conv.turns), ("speaker", conv.speakers),
                                 ("supersedes", conv.supersedes)):
                if values is not None and values[i] is not None:
                    item[name] = values[i]
            if namespace is None:
                item["namespace"] = ns_l[i]
            if meta[i] is not None:
                item["metadata"] = meta[i]
            if keys_l[i] is not None:
                item["key"] = keys_l[i]
            if vecs is not None:
                item["vector"] = vecs[i]
            items.append(item)
        body: dict[str, Any] = {"items": items} if namespace is None else {"namespace": namespace, "items": items}
        return _Req("POST", "/v1/memories", body, lambda d: list(d["ids"]))

    def _req_search(self, query, k, options) -> _Req:
        body = _search_body(k, options)
        if isinstance(query, str):
            body["query"] = query
        else:
            q = np.asarray(query)
            if q.ndim != 1:
                raise ValueError(f"query vector must be 1-dimensional, got shape {q.shape}")
            body["vector"] = _floats(q)
        return _Req("POST", "/v1/search", body, _hits)

    def _req_search_many(self, queries, k, options) -> _Req | None:
        body = _search_body(k, options)
        if isinstance(queries, np.ndarray):
            if queries.ndim != 2:
                raise ValueError(f"queries must have shape (q, dim), got {queries.shape}")
            if len(queries) == 0:
                return None
            body["vectors"] = _floats(queries)
        else:
            if isinstance(queries, str):
                raise TypeError("search_many takes a list of queries, not one string (use search)")
            queries = list(queries)
            for i, t in enumerate(queries):
                if not isinstance(t, str) or not t.strip():
                    raise ValueError(f"query {i} is empty or not a string")
            if not queries:
                return None
            body["queries"] = queries
        return _Req("POST", "/v1/search/batch", body, lambda d: [_hits(h) for h in d["results"]])

    def _req_get(self, memory_id, key, namespace) -> _Req:
        if (memory_id is None) == (key is None):
            raise ValueError("give exactly one of memory_id or key=")
        if key is not None:
            return _Req("GET", "/v1/memories/by-key", params={"key": key, "namespace": namespace}, parse=_memory)
        return _Req("GET", f"/v1/memories/{_check_id(memory_id)}", parse=_memory)

    def _req_get_many(self, memory_ids, keys, namespace) -> _Req:
        body: dict[str, Any] = {"namespace": namespace}
        if keys is not None:
            body["keys"] = list(keys)
        if memory_ids is not None:
            body["ids"] = [_check_id(m) for m in memory_ids]
        return _Req("POST", "/v1/memories/get", body, lambda d: [_memory(m) for m in d["items"]])

    def _req_update(self, memory_id, key, namespace, text, metadata, embedding) -> _Req:
        if text is None and metadata is None:
            raise ValueError("update needs text= and/or metadata=")
        body: dict[str, Any] = {}
        if text is not None:
            body["text"] = text
        if metadata is not None:
            body["metadata"] = metadata
        if embedding is not None:
            body["vector"] = _floats(np.asarray(embedding))
        if (memory_id is None) == (key is None):
            raise ValueError("give exactly one of memory_id or key=")
        if key is not None:
            return _Req("PATCH", "/v1/memories/by-key", body, lambda d: None, {"key": key, "namespace": namespace})
        return _Req("PATCH", f"/v1/memories/{_check_id(memory_id)}", body, parse=lambda d: None)

    def _req_delete(self, memory_id, key, namespace) -> _Req:
        if (memory_id is None) == (key is None):
            raise ValueError("give exactly one of memory_id or key=")
        if key is not None:
            return _Req("DELETE", "/v1/memories/by-key", params={"key": key, "namespace": namespace}, parse=lambda d: None)
        return _Req("DELETE", f"/v1/memories/{_check_id(memory_id)}", parse=lambda d: None)

    def _req_delete_many(self, memory_ids, keys, namespace) -> _Req:
        body: dict[str, Any] = {"namespace": namespace}
        if keys is not None:
            body["keys"] = list(keys)
        if memory_ids is not None:
            body["ids"] = [_check_id(m) for m in memory_ids]
        return _Req("POST", "/v1/memories/delete", body, lambda d: int(d["deleted"]))

    def _req_memories(self, namespace, cluster, where, kind, limit, cursor) -> _Req:
        params: dict[str, Any] = {"limit": limit}
        for name, value in (("namespace", namespace), ("cluster", cluster), ("kind", kind), ("cursor", cursor)):
            if value is not None:
                params[name] = value
        if where is not None:
            params["where"] = json.dumps(where)
        return _Req("GET", "/v1/memories", params=params,
                    parse=lambda d: MemoryPage([_memory(m) for m in d["items"]], d["next_cursor"]))

    def _req_cluster(self, cluster_id, namespace, limit, cursor) -> _Req:
        params: dict[str, Any] = {"limit": limit}
        if namespace is not None:
            params["namespace"] = namespace
        if cursor is not None:
            params["cursor"] = cursor
        return _Req("GET", f"/v1/clusters/{_check_id(cluster_id)}", params=params, parse=_cluster_page)

    def _req_forget_cluster(self, cluster_id, action, namespace) -> _Req:
        if action not in ("archive", "delete"):
            raise ValueError(f"action must be 'archive' or 'delete', got {action!r}")
        params: dict[str, Any] = {"action": action}
        if namespace is not None:
            params["namespace"] = namespace
        return _Req("DELETE", f"/v1/clusters/{_check_id(cluster_id)}", params=params,
                    parse=lambda d: int(d["forgotten"]))

    def _req_move_cluster(self, cluster_id, to, memory_ids, namespace) -> _Req:
        body: dict[str, Any] = {"to": _check_id(to)}
        if memory_ids is not None:
            body["memory_ids"] = [_check_id(m) for m in memory_ids]
        if namespace is not None:
            body["namespace"] = namespace
        return _Req("POST", f"/v1/clusters/{_check_id(cluster_id)}/move", body, lambda d: int(d["moved"]))

    def _req_merge_clusters(self, keep, absorb) -> _Req:
        return _Req("POST", f"/v1/clusters/{_check_id(keep)}/merge", {"other": _check_id(absorb)},
                    lambda d: int(d["moved"]))


# -- the clients ----------------------------------------------------------------------------------
class Client(_Requests):
    """A ``MemoryStore`` served by ``clag-fast serve``. Use ``clag_fast.connect``.

    Thread-safe (one httpx connection pool); ``close()`` or a ``with`` block releases it.
    """

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 60.0,
                 http: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/")
        self._http = http or httpx.Client(base_url=self.url, timeout=timeout, headers=_headers(api_key))

    def _do(self, req: _Req | None, empty: Any = None) -> Any:
        if req is None:
            return empty
        try:
            r = self._http.request(req.method, req.path, json=req.body, params=req.params)
        except httpx.TransportError as e:
            raise ServiceError(0, "unreachable", f"{self.url}: {e}") from None
        return req.parse(_answer(r))

    # MemoryStore's methods, same arguments and results
    def add(self, text: str, *, key: str | None = None, kind: str = "user_input", namespace: str = "default",
            metadata: dict[str, Any] | None = None, embedding: np.ndarray | None = None, thread: str | None = None,
            turn: float | None = None, speaker: str | None = None, supersedes: int | None = None) -> int:
        """Store one memory and return its id (see ``MemoryStore.add``)."""
        emb = None if embedding is None else np.asarray(embedding)[None, ...]
        return self.add_many([text], embeddings=emb, kinds=[kind], namespaces=[namespace], metadata=[metadata],
                             keys=[key], **_one_turn(thread, turn, speaker, supersedes))[0]

    def add_many(self, texts: Sequence[str], embeddings: np.ndarray | None = None,
                 kinds: Sequence[str] | str | None = None, namespaces: Sequence[str] | str | None = None,
                 metadata: Sequence[dict[str, Any] | None] | None = None, *,
                 keys: Sequence[str | None] | None = None, defer_organize: bool = False,
                 namespace: str | None = None, thread: str | None = None, threads: Sequence[str | None] | None = None,
                 turns: Sequence[float | None] | None = None, speaker: str | None = None,
                 speakers: Sequence[str | None] | None = None, supersedes: Sequence[int | None] | None = None
                 ) -> list[int]:
        """Store memories and return their ids; answered once they are durable.
        ``namespace`` (the whole batch) or ``namespaces`` (one per item), and the conversation
        arguments, as ``MemoryStore``. ``defer_organize`` (``MemoryStore``'s bulk-load switch)
        is not offered by the service, which organises on its own schedule: True is a
        ValueError, and nothing is sent."""
        _no_defer(defer_organize)
        batch_namespaces(namespace, namespaces)
        turns_kw = dict(thread=thread, threads=threads, turns=turns, speaker=speaker, speakers=speakers,
                        supersedes=supersedes)
        return self._do(self._req_add_many(texts, embeddings, kinds, namespaces, metadata, keys, namespace, turns_kw),
                        [])

    def search(self, query: str | np.ndarray, k: int = 5, *,
               namespace: str | None = None, kind: str | None = None, since: float | None = None,
               until: float | None = None, mode: str = "two_stage", n_probe: int | None = None,
               lexical_weight: float | None = None, where: dict | None = None, as_of: float | None = None,
               context: int = 0) -> Hits:
        """The ``k`` memories most similar to ``query`` (options as ``MemoryStore.search``)."""
        opts = _options(namespace, kind, since, until, mode, n_probe, lexical_weight, where, as_of, context)
        return self._do(self._req_search(query, k, opts))

    def search_many(self, queries: Sequence[str] | np.ndarray, k: int = 5, *,
                    namespace: str | None = None, kind: str | None = None, since: float | None = None,
                    until: float | None = None, mode: str = "two_stage", n_probe: int | None = None,
                    lexical_weight: float | None = None, where: dict | None = None, as_of: float | None = None,
                    context: int = 0) -> list[Hits]:
        """``search`` for a batch of queries with the same options."""
        opts = _options(namespace, kind, since, until, mode, n_probe, lexical_weight, where, as_of, context)
        return self._do(self._req_search_many(queries, k, opts), [])

    def get(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default") -> Memory:
        """The memory with this id (or key in ``namespace``); KeyError if there is none."""
        return self._do(self._req_get(memory_id, key, namespace))

    def get_many(self, memory_ids: Sequence[int] | None = None, *, keys: Sequence[str] | None = None,
                 namespace: str = "default") -> list[Memory]:
        """The memories found, in request order (missing ones skipped)."""
        return self._do(self._req_get_many(memory_ids, keys, namespace))

    def update(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default",
               text: str | None = None, metadata: dict[str, Any] | None = None,
               embedding: np.ndarray | None = None) -> None:
        """Change a memory's text (re-embedded and re-routed) and/or metadata."""
        self._do(self._req_update(memory_id, key, namespace, text, metadata, embedding))

    def delete(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default") -> None:
        """Remove a memory (KeyError when absent)."""
        self._do(self._req_delete(memory_id, key, namespace))

    def delete_many(self, memory_ids: Sequence[int] | None = None, *, keys: Sequence[str] | None = None,
                    namespace: str = "default") -> int:
        """Remove memories by ids or keys; returns how many were removed (unknown ones ignored)."""
        return self._do(self._req_delete_many(memory_ids, keys, namespace))

    def delete_namespace(self, namespace: str) -> int:
        """Remove every memory of ``namespace``; returns the count."""
        return self._do(_Req("DELETE", f"/v1/namespaces/{_quote(namespace)}", parse=lambda d: int(d["deleted"])))

    def memories(self, namespace: str | None = None, cluster: int | None = None, where: dict | None = None,
                 kind: str | None = None, limit: int = 100, cursor: str | None = None) -> MemoryPage:
        """One page of memories, ordered by id; pass ``next_cursor`` back for the next."""
        return self._do(self._req_memories(namespace, cluster, where, kind, limit, cursor))

    def namespaces(self) -> list[str]:
        """Namespaces holding at least one live memory (those the key may read)."""
        return self._do(_Req("GET", "/v1/namespaces", parse=lambda d: list(d["namespaces"])))

    def clusters(self) -> list[ClusterInfo]:
        """Every live cluster with its profile and size, largest first."""
        return self._do(_Req("GET", "/v1/clusters", parse=_clusters))

    def cluster(self, cluster_id: int, *, namespace: str | None = None, limit: int = 100,
                cursor: str | None = None) -> ClusterPage:
        """A cluster and a page of its members (see ``MemoryStore.cluster``)."""
        return self._do(self._req_cluster(cluster_id, namespace, limit, cursor))

    def forget_cluster(self, cluster_id: int, *, action: str = "archive", namespace: str | None = None) -> int:
        """Archive or delete a cluster's members (those of ``namespace``; all of them needs an
        admin key); returns how many."""
        return self._do(self._req_forget_cluster(cluster_id, action, namespace))

    def move_cluster(self, cluster_id: int, to: int, *, memory_ids: Sequence[int] | None = None,
                     namespace: str | None = None) -> int:
        """Move a cluster's members to cluster ``to``; returns how many moved."""
        return self._do(self._req_move_cluster(cluster_id, to, memory_ids, namespace))

    def merge_clusters(self, keep: int, absorb: int) -> int:
        """Merge cluster ``absorb`` into ``keep`` (admin keys); returns how many joined."""
        return self._do(self._req_merge_clusters(keep, absorb))

    def organize(self, task_context: str | None = None) -> dict[str, Any]:
        """Re-organise now (admin keys); returns what was done."""
        return self._do(_Req("POST", "/v1/organize", {"task_context": task_context}))

    def forget(self, now: float | None = None) -> dict[str, Any]:
        """Apply the forgetting policy now (admin keys)."""
        return self._do(_Req("POST", "/v1/forget", {"now": now}))

    def flush(self) -> None:
        """Wait for background organisation and persist everything (admin keys)."""
        self._do(_Req("POST", "/v1/flush", parse=lambda d: None))

    def stats(self) -> dict[str, Any]:
        """Counts and timings (only the key's own namespaces for keys that read some); the keys
        of ``MemoryStore.stats()``, whose old ``llm...`` keys read with a DeprecationWarning."""
        return self._do(_Req("GET", "/v1/stats", parse=_stats))

    def health(self) -> dict[str, Any]:
        """/healthz: whether the models are loaded."""
        return self._do(_Req("GET", "/healthz"))

    def __len__(self) -> int:
        return int(self.stats()["memories"])

    def close(self) -> None:
        """Release the connection pool (the service and its store keep running)."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"clag_fast.Client({self.url!r})"


class AsyncClient(_Requests):
    """``Client`` for asyncio: the same methods as coroutines. Use ``clag_fast.connect_async``."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 60.0,
                 http: httpx.AsyncClient | None = None) -> None:
        self.url = url.rstrip("/")
        self._http = http or httpx.AsyncClient(base_url=self.url, timeout=timeout, headers=_headers(api_key))

    async def _do(self, req: _Req | None, empty: Any = None) -> Any:
        if req is None:
            return empty
        try:
            r = await self._http.request(req.method, req.path, json=req.body, params=req.params)
        except httpx.TransportError as e:
            raise ServiceError(0, "unreachable", f"{self.url}: {e}") from None
        return req.parse(_answer(r))

    async def add(self, text: str, *, key: str | None = None, kind: str = "user_input", namespace: str = "default",
                  metadata: dict[str, Any] | None = None, embedding: np.ndarray | None = None,
                  thread: str | None = None, turn: float | None = None, speaker: str | None = None,
                  supersedes: int | None = None) -> int:
        """See ``Client.add``."""
        emb = None if embedding is None else np.asarray(embedding)[None, ...]
        return (await self.add_many([text], embeddings=emb, kinds=[kind], namespaces=[namespace],
                                    metadata=[metadata], keys=[key], **_one_turn(thread, turn, speaker, supersedes)))[0]

    async def add_many(self, texts: Sequence[str], embeddings: np.ndarray | None = None,
                       kinds: Sequence[str] | str | None = None, namespaces: Sequence[str] | str | None = None,
                       metadata: Sequence[dict[str, Any] | None] | None = None, *,
                       keys: Sequence[str | None] | None = None, defer_organize: bool = False,
                       namespace: str | None = None, thread: str | None = None,
                       threads: Sequence[str | None] | None = None, turns: Sequence[float | None] | None = None,
                       speaker: str | None = None, speakers: Sequence[str | None] | None = None,
                       supersedes: Sequence[int | None] | None = None) -> list[int]:
        """See ``Client.add_many``."""
        _no_defer(defer_organize)
        batch_namespaces(namespace, namespaces)
        turns_kw = dict(thread=thread, threads=threads, turns=turns, speaker=speaker, speakers=speakers,
                        supersedes=supersedes)
        return await self._do(self._req_add_many(texts, embeddings, kinds, namespaces, metadata, keys, namespace,
                                                 turns_kw), [])

    async def search(self, query: str | np.ndarray, k: int = 5, *,
                     namespace: str | None = None, kind: str | None = None, since: float | None = None,
                     until: float | None = None, mode: str = "two_stage", n_probe: int | None = None,
                     lexical_weight: float | None = None, where: dict | None = None, as_of: float | None = None,
                     context: int = 0) -> Hits:
        """See ``Client.search``."""
        opts = _options(namespace, kind, since, until, mode, n_probe, lexical_weight, where, as_of, context)
        return await self._do(self._req_search(query, k, opts))

    async def search_many(self, queries: Sequence[str] | np.ndarray, k: int = 5, *,
                          namespace: str | None = None, kind: str | None = None, since: float | None = None,
                          until: float | None = None, mode: str = "two_stage", n_probe: int | None = None,
                          lexical_weight: float | None = None, where: dict | None = None,
                          as_of: float | None = None, context: int = 0) -> list[Hits]:
        """See ``Client.search_many``."""
        opts = _options(namespace, kind, since, until, mode, n_probe, lexical_weight, where, as_of, context)
        return await self._do(self._req_search_many(queries, k, opts), [])

    async def get(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default") -> Memory:
        """See ``Client.get``."""
        return await self._do(self._req_get(memory_id, key, namespace))

    async def get_many(self, memory_ids: Sequence[int] | None = None, *, keys: Sequence[str] | None = None,
                       namespace: str = "default") -> list[Memory]:
        """See ``Client.get_many``."""
        return await self._do(self._req_get_many(memory_ids, keys, namespace))

    async def update(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default",
                     text: str | None = None, metadata: dict[str, Any] | None = None,
                     embedding: np.ndarray | None = None) -> None:
        """See ``Client.update``."""
        await self._do(self._req_update(memory_id, key, namespace, text, metadata, embedding))

    async def delete(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default") -> None:
        """See ``Client.delete``."""
        await self._do(self._req_delete(memory_id, key, namespace))

    async def delete_many(self, memory_ids: Sequence[int] | None = None, *, keys: Sequence[str] | None = None,
                          namespace: str = "default") -> int:
        """See ``Client.delete_many``."""
        return await self._do(self._req_delete_many(memory_ids, keys, namespace))

    async def delete_namespace(self, namespace: str) -> int:
        """See ``Client.delete_namespace``."""
        return await self._do(_Req("DELETE", f"/v1/namespaces/{_quote(namespace)}", parse=lambda d: int(d["deleted"])))

    async def memories(self, namespace: str | None = None, cluster: int | None = None, where: dict | None = None,
                       kind: str | None = None, limit: int = 100, cursor: str | None = None) -> MemoryPage:
        """See ``Client.memories``."""
        return await self._do(self._req_memories(namespace, cluster, where, kind, limit, cursor))

    async def namespaces(self) -> list[str]:
        """See ``Client.namespaces``."""
        return await self._do(_Req("GET", "/v1/namespaces", parse=lambda d: list(d["namespaces"])))

    async def clusters(self) -> list[ClusterInfo]:
        """See ``Client.clusters``."""
        return await self._do(_Req("GET", "/v1/clusters", parse=_clusters))

    async def cluster(self, cluster_id: int, *, namespace: str | None = None, limit: int = 100,
                      cursor: str | None = None) -> ClusterPage:
        """See ``Client.cluster``."""
        return await self._do(self._req_cluster(cluster_id, namespace, limit, cursor))

    async def forget_cluster(self, cluster_id: int, *, action: str = "archive", namespace: str | None = None) -> int:
        """See ``Client.forget_cluster``."""
        return await self._do(self._req_forget_cluster(cluster_id, action, namespace))

    async def move_cluster(self, cluster_id: int, to: int, *, memory_ids: Sequence[int] | None = None,
                           namespace: str | None = None) -> int:
        """See ``Client.move_cluster``."""
        return await self._do(self._req_move_cluster(cluster_id, to, memory_ids, namespace))

    async def merge_clusters(self, keep: int, absorb: int) -> int:
        """See ``Client.merge_clusters``."""
        return await self._do(self._req_merge_clusters(keep, absorb))

    async def organize(self, task_context: str | None = None) -> dict[str, Any]:
        """See ``Client.organize``."""
        return await self._do(_Req("POST", "/v1/organize", {"task_context": task_context}))

    async def forget(self, now: float | None = None) -> dict[str, Any]:
        """See ``Client.forget``."""
        return await self._do(_Req("POST", "/v1/forget", {"now": now}))

    async def flush(self) -> None:
        """See ``Client.flush``."""
        await self._do(_Req("POST", "/v1/flush", parse=lambda d: None))

    async def stats(self) -> dict[str, Any]:
        """See ``Client.stats``."""
        return await self._do(_Req("GET", "/v1/stats", parse=_stats))

    async def health(self) -> dict[str, Any]:
        """See ``Client.health``."""
        return await self._do(_Req("GET", "/healthz"))

    async def aclose(self) -> None:
        """Release the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"clag_fast.AsyncClient({self.url!r})"


def connect(url: str, api_key: str | None = None, **kwargs: Any) -> Client:
    """A client of the service at ``url`` with the methods of ``MemoryStore``."""
    return Client(url, api_key, **kwargs)


def connect_async(url: str, api_key: str | None = None, **kwargs: Any) -> AsyncClient:
    """An asyncio client of the service at ``url`` (methods are coroutines)."""
    return AsyncClient(url, api_key, **kwargs)


# -- helpers --------------------------------------------------------------------------------------
def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _answer(r: httpx.Response) -> Any:
    """The JSON of a 2xx answer; otherwise the exception ``MemoryStore`` would have raised."""
    try:
        data = r.json()
    except ValueError:
        data = None
    if r.is_success:
        if data is None:
            raise ServiceError(r.status_code, "not_json", f"the answer is not JSON: {r.text[:200]!r}")
        return data
    err = data.get("error") if isinstance(data, dict) else None
    code = err.get("code", "http_error") if isinstance(err, dict) else "http_error"
    message = err.get("message", r.text[:200]) if isinstance(err, dict) else r.text[:200]
    s = r.status_code
    if s == 404 and code == "not_found":
        raise KeyError(message)
    if s == 400 and code == "wrong_type":
        raise TypeError(message)
    if s in (400, 413):
        raise ValueError(message)
    if s == 401:
        raise ServiceUnauthorized(message)
    if s == 403:
        raise ServiceForbidden(message)
    if s == 503:
        raise ServiceBusy(s, code, message)
    raise ServiceError(s, code, message)


def _options(namespace, kind, since, until, mode, n_probe, lexical_weight, where, as_of=None,
             context=0) -> dict[str, Any]:
    if as_of is not None and isinstance(as_of, datetime.datetime):
        as_of = as_of.timestamp()
    return {"namespace": namespace, "kind": kind, "since": since, "until": until, "mode": mode,
            "n_probe": n_probe, "lexical_weight": lexical_weight, "where": where, "as_of": as_of,
            "context": context or None}


def _one_turn(thread, turn, speaker, supersedes) -> dict[str, Any]:
    """``add``'s conversation arguments as ``add_many``'s."""
    return {"thread": thread, "turns": None if turn is None else [turn], "speaker": speaker,
            "supersedes": None if supersedes is None else [supersedes]}


def _search_body(k: Any, options: dict[str, Any]) -> dict[str, Any]:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"k must be a positive integer, got {k!r}")
    body = {name: value for name, value in options.items() if value is not None and
            not (name == "mode" and value == "two_stage")}
    body["k"] = int(k)
    return body


def _floats(arr: np.ndarray) -> list:
    a = np.asarray(arr)
    if not np.issubdtype(a.dtype, np.floating) and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"embeddings must be floating point, got {a.dtype}")
    if not np.isfinite(a).all():
        raise ValueError("the vector holds NaN or infinity")
    return a.astype(np.float64).tolist()


def _per_item(values: Sequence[str] | str | None, n: int, default: str, name: str) -> list[str]:
    if values is None:
        return [default] * n
    if isinstance(values, str):
        return [values] * n
    out = list(values)
    if len(out) != n:
        raise ValueError(f"{name} has {len(out)} items for {n} texts")
    return out


def _check_id(memory_id: Any) -> int:
    if isinstance(memory_id, bool) or not isinstance(memory_id, (int, np.integer)):
        raise TypeError(f"memory id must be an int, got {type(memory_id).__name__}")
    return int(memory_id)


def _quote(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="")


def _stats(d: dict[str, Any]) -> dict[str, Any]:
    return RenamedKeys(d, STATS_RENAMES, "Client.stats()")


def _hit(h: dict[str, Any]) -> Hit:
    values = {k: v for k, v in h.items() if k in _HIT_FIELDS}
    values["context"] = tuple(Turn(**t) for t in h.get("context") or ())
    return Hit(**values)


def _hits(d: dict[str, Any]) -> Hits:
    hits = [_hit(h) for h in d["hits"]]
    return Hits(hits, scanned=d["scanned"], candidates=d["candidates"], clusters_probed=list(d["clusters_probed"]),
                mode=d["mode"], latency_s=d["latency_s"], cached=d["cached"])


def _memory(d: dict[str, Any]) -> Memory:
    values = {k: v for k, v in d.items() if k in _MEMORY_FIELDS}
    values["clusters"] = [(int(c), float(a)) for c, a in d.get("clusters", [])]
    return Memory(**values)


def _clusters(d: dict[str, Any]) -> list[ClusterInfo]:
    return [ClusterInfo(**c) for c in d["clusters"]]


def _cluster_page(d: dict[str, Any]) -> ClusterPage:
    return ClusterPage(ClusterInfo(**d["cluster"]), [_memory(m) for m in d["members"]], d["next_cursor"])


def _no_defer(defer_organize: bool) -> None:
    if defer_organize:
        raise ValueError("defer_organize is a MemoryStore bulk-load option; the service organises on its own "
                         "schedule (bulk loads: clag_fast.distributed.ingest or MemoryStore.add_many)")
