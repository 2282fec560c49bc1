"""The JSON API under /v1: authentication, namespace rights, limits, and the conversion of
store results into response bodies. The store work itself is ``service.StoreService``'s."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Callable, Literal, Mapping

import numpy as np
from fastapi import APIRouter, Body, Depends, Query, Request

from clag_fast.server.auth import LOCAL, KeyRing, Principal
from clag_fast.server.http_errors import problem
from clag_fast.server.models import (
    AddResult,
    ClusterOut,
    ClusterPageOut,
    ClustersOut,
    DeleteResult,
    ErrorBody,
    ForgetRequest,
    ForgottenOut,
    HitOut,
    HitsOut,
    IdsRequest,
    MemoriesOut,
    MemoryOut,
    MemoryPageOut,
    MemoryPatch,
    MergeRequest,
    MovedOut,
    MoveRequest,
    NewMemories,
    NewMemory,
    OrganizeRequest,
    SearchBatchRequest,
    SearchBatchResult,
    SearchRequest,
    TurnOut,
)
from clag_fast.server.service import StoreService, as_payload
from clag_fast.server.settings import Limits

_ERRORS = {s: {"model": ErrorBody} for s in (400, 401, 403, 404, 413, 503)}
router = APIRouter(prefix="/v1", responses=_ERRORS)


# -- dependencies --------------------------------------------------------------------------
# All async: FastAPI runs a plain ``def`` dependency in a worker thread, a thread hop per
# dependency per request for what are attribute reads.
async def service(request: Request) -> StoreService:
    return request.app.state.service


async def principal(request: Request) -> Principal:
    """The caller's rights (see ``principal_of``)."""
    return principal_of(request.app.state.keyring, request.headers)


def principal_of(ring: KeyRing | None, headers: Mapping[str, str]) -> Principal:
    """The caller's rights: from ``Authorization: Bearer <key>`` or ``X-API-Key``; everything
    when the service runs without a keys file (loopback only). ``headers``: lower-case names."""
    if ring is None:
        return LOCAL
    key = headers.get("x-api-key")
    auth = headers.get("authorization", "")
    if key is None and auth[:7].lower() == "bearer ":
        key = auth[7:].strip()
    found = ring.lookup(key)
    if isinstance(found, str):
        raise problem(401, "unauthorized", found)
    return found


async def limits(request: Request) -> Limits:
    return request.app.state.service.config.limits


Svc = Depends(service)
Who = Depends(principal)


def _read_ns(who: Principal, namespace: str | None) -> str | None:
    """The namespace a read runs in: the requested one if the key may read it; None (all)
    only for keys that read everything; else the key's default namespace."""
    if namespace is None:
        if who.unrestricted:
            return None
        if who.default_namespace is None:
            raise problem(400, "namespace_required", "this key reads only some namespaces: name one with namespace=")
        return who.default_namespace
    if not who.can_read(namespace):
        raise problem(403, "forbidden", f"this key may not read namespace {namespace!r}")
    return namespace


def _write_ns(who: Principal, namespace: str) -> str:
    if not who.can_write(namespace):
        raise problem(403, "forbidden", f"this key may not write namespace {namespace!r}")
    return namespace


def _admin(who: Principal, what: str) -> None:
    if not who.admin:
        raise problem(403, "forbidden", f"{what} acts on the whole store: it needs an admin key")


def _check_text(text: str, lim: Limits, what: str) -> None:
    if len(text) > lim.max_text_chars:
        raise problem(413, "text_too_long", f"{what} has {len(text)} characters; the limit is {lim.max_text_chars}")


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value, without recursion (the value may be deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def _check_metadata(meta: dict | None, lim: Limits, what: str) -> None:
    if meta is not None:
        if _depth(meta) > lim.max_metadata_depth:
            raise problem(400, "invalid", f"{what} nests deeper than {lim.max_metadata_depth} levels")
        size = len(json.dumps(meta, ensure_ascii=False, default=str).encode())
        if size > lim.max_metadata_bytes:
            raise problem(413, "metadata_too_large", f"{what} is {size} bytes as JSON; the limit is {lim.max_metadata_bytes}")


def _check_count(n: int, lim: Limits, what: str) -> None:
    if n > lim.max_batch:
        raise problem(413, "batch_too_large", f"{n} {what} in one request; the limit is {lim.max_batch}")


def _check_dim(vector: list[float] | None, svc: StoreService, what: str) -> None:
    dim = svc.store.config.dim
    if vector is None:
        return
    if dim is not None and len(vector) != dim:  # None: the store's first vectors fix its width
        raise problem(400, "wrong_dimension", f"{what} has {len(vector)} dimensions; the store holds {dim}-dimensional vectors")
    with np.errstate(over="ignore"):
        finite = np.isfinite(np.asarray(vector, np.float32)).all()
    if not finite:
        raise problem(400, "invalid", f"{what} has values beyond float32's range")


def _check_k(k: int, lim: Limits) -> None:
    if k > lim.max_k:
        raise problem(400, "invalid_request", f"k must be at most {lim.max_k}, got {k}")


# -- conversions ---------------------------------------------------------------------------
def _memory_out(m: Any) -> MemoryOut:
    return MemoryOut(memory_id=m.memory_id, text=m.text, kind=m.kind, namespace=m.namespace, metadata=m.metadata,
                     created_at=m.created_at, last_accessed=m.last_accessed, access_count=m.access_count,
                     strength=m.strength, archived=m.archived, clusters=list(m.clusters), key=getattr(m, "key", None),
                     thread=m.thread, turn=m.turn, speaker=m.speaker, superseded_by=m.superseded_by)


def _hits_out(hits: Any, visible: Callable[[int | None], bool]) -> HitsOut:
    out = []
    for h in hits:
        shown = visible(h.cluster_id)
        out.append(HitOut(memory_id=h.memory_id, text=h.text, score=h.score,
                          cluster_id=h.cluster_id if shown else None,
                          cluster_summary=h.cluster_summary if shown else "",
                          cluster_tags=list(h.cluster_tags) if shown else [],
                          kind=h.kind, namespace=h.namespace, created_at=h.created_at, metadata=h.metadata,
                          key=getattr(h, "key", None), superseded_by=h.superseded_by,
                          context=[TurnOut(memory_id=t.memory_id, offset=t.offset, text=t.text, speaker=t.speaker)
                                   for t in h.context]))
    return HitsOut(hits=out, scanned=hits.scanned, candidates=hits.candidates,
                   clusters_probed=[c for c in hits.clusters_probed if visible(c)], mode=hits.mode,
                   latency_s=hits.latency_s, cached=hits.cached)


async def _visibility(svc: StoreService, who: Principal) -> Callable[[int | None], bool]:
    # Keys that read everything need no table (and no thread hop on every search).
    return (lambda cid: True) if who.unrestricted else await svc.call(svc.visible_clusters, who)


async def _owned(svc: StoreService, who: Principal, memory_id: int, write: bool) -> Any:
    """The memory, if the key may read (write) its namespace; otherwise the same 404 as an
    unknown id, so ids of other namespaces cannot be probed."""
    try:
        m = await svc.call(svc.store.get, memory_id)
    except KeyError:
        m = None
    if m is None or not (who.can_write(m.namespace) if write else who.can_read(m.namespace)):
        raise problem(404, "not_found", f"no memory with id {memory_id}")
    return m


# -- writing -------------------------------------------------------------------------------
@router.post("/memories", response_model=AddResult, summary="Add one memory or a batch")
async def add_memories(body: NewMemory | NewMemories = Body(...), svc: StoreService = Svc, who: Principal = Who,
                       lim: Limits = Depends(limits)) -> AddResult:
    return await handle_add(body, svc, who, lim)


async def handle_add(body: NewMemory | NewMemories, svc: StoreService, who: Principal, lim: Limits) -> AddResult:
    """POST /v1/memories once its body is validated (also ``hotpaths``' entry)."""
    items = body.items if isinstance(body, NewMemories) else [body]
    _check_count(len(items), lim, "memories")
    if isinstance(body, NewMemories) and body.namespace is not None:
        if any("namespace" in it.model_fields_set for it in items):
            raise problem(400, "invalid_request", "give namespace on the batch or on its items, not both")
        items = [it.model_copy(update={"namespace": body.namespace}) for it in items]
    with_vec = [it.vector is not None for it in items]
    if any(with_vec) and not all(with_vec):
        raise problem(400, "invalid_request", "give a vector for every item of a batch or for none")
    for i, it in enumerate(items):
        _check_text(it.text, lim, f"items[{i}].text")
        _check_metadata(it.metadata, lim, f"items[{i}].metadata")
        _check_dim(it.vector, svc, f"items[{i}].vector")
        _write_ns(who, it.namespace)
    turns = {name: [getattr(it, field) for it in items] for name, field in
             (("threads", "thread"), ("turns", "turn"), ("speakers", "speaker"), ("supersedes", "supersedes"))}
    payload = as_payload([it.text for it in items], [it.vector for it in items] if all(with_vec) else None,
                         [it.kind for it in items], [it.namespace for it in items],
                         [it.metadata for it in items], [it.key for it in items],
                         {name: values for name, values in turns.items() if any(v is not None for v in values)})
    return AddResult(ids=await svc.add(payload))


# The by-key routes come before the /memories/{memory_id} ones, which would match "by-key" too.
@router.get("/memories/by-key", response_model=MemoryOut, summary="A memory by its key")
async def get_by_key(key: str = Query(min_length=1, max_length=512), namespace: str = Query("default", min_length=1),
                     svc: StoreService = Svc, who: Principal = Who) -> MemoryOut:
    _read_ns(who, namespace)
    return _memory_out(await svc.call(svc.store.get, key=key, namespace=namespace))


@router.patch("/memories/by-key", response_model=MemoryOut, summary="Change a memory found by its key")
async def update_by_key(body: MemoryPatch, key: str = Query(min_length=1, max_length=512),
                        namespace: str = Query("default", min_length=1), svc: StoreService = Svc,
                        who: Principal = Who, lim: Limits = Depends(limits)) -> MemoryOut:
    _write_ns(who, namespace)
    if body.text is not None:
        _check_text(body.text, lim, "text")
    _check_metadata(body.metadata, lim, "metadata")
    _check_dim(body.vector, svc, "vector")
    emb = None if body.vector is None else np.asarray(body.vector, np.float32)
    await svc.call(svc.store.update, key=key, namespace=namespace, text=body.text, metadata=body.metadata, embedding=emb)
    m = await svc.call(svc.store.get, key=key, namespace=namespace)
    if body.text is not None:
        await svc.call(svc.rerouted, [m.memory_id])
    return _memory_out(m)


@router.delete("/memories/by-key", response_model=DeleteResult, summary="Delete a memory found by its key")
async def delete_by_key(key: str = Query(min_length=1, max_length=512), namespace: str = Query("default", min_length=1),
                        svc: StoreService = Svc, who: Principal = Who) -> DeleteResult:
    _write_ns(who, namespace)
    await svc.call(svc.store.delete, key=key, namespace=namespace)
    return DeleteResult(deleted=1)


@router.patch("/memories/{memory_id}", response_model=MemoryOut, summary="Change a memory's text and/or metadata")
async def update_memory(memory_id: int, body: MemoryPatch, svc: StoreService = Svc, who: Principal = Who,
                        lim: Limits = Depends(limits)) -> MemoryOut:
    if body.text is not None:
        _check_text(body.text, lim, "text")
    _check_metadata(body.metadata, lim, "metadata")
    _check_dim(body.vector, svc, "vector")
    await _owned(svc, who, memory_id, write=True)
    emb = None if body.vector is None else np.asarray(body.vector, np.float32)
    await svc.call(svc.store.update, memory_id, text=body.text, metadata=body.metadata, embedding=emb)
    if body.text is not None:
        await svc.call(svc.rerouted, [memory_id])
    return _memory_out(await svc.call(svc.store.get, memory_id))


@router.delete("/memories/{memory_id}", response_model=DeleteResult, summary="Delete a memory")
async def delete_memory(memory_id: int, svc: StoreService = Svc, who: Principal = Who) -> DeleteResult:
    await _owned(svc, who, memory_id, write=True)
    await svc.call(svc.store.delete, memory_id)
    return DeleteResult(deleted=1)


@router.post("/memories/delete", response_model=DeleteResult, summary="Delete memories by ids or keys")
async def delete_many(body: IdsRequest, svc: StoreService = Svc, who: Principal = Who,
                      lim: Limits = Depends(limits)) -> DeleteResult:
    _check_count(len(body.ids or ()) + len(body.keys or ()), lim, "ids and keys")
    n = 0
    if body.keys:
        _write_ns(who, body.namespace)
        n += await svc.call(svc.store.delete_many, keys=body.keys, namespace=body.namespace)
    if body.ids:
        found = await svc.call(svc.store.get_many, body.ids)
        mine = [m.memory_id for m in found if who.can_write(m.namespace)]  # others' ids count as unknown
        if mine:
            n += await svc.call(svc.store.delete_many, mine)
    return DeleteResult(deleted=n)


# -- reading -------------------------------------------------------------------------------
@router.get("/memories/{memory_id}", response_model=MemoryOut, summary="A memory by id")
async def get_memory(memory_id: int, svc: StoreService = Svc, who: Principal = Who) -> MemoryOut:
    return _memory_out(await _owned(svc, who, memory_id, write=False))


@router.post("/memories/get", response_model=MemoriesOut, summary="Memories by ids or keys (missing ones skipped)")
async def get_many(body: IdsRequest, svc: StoreService = Svc, who: Principal = Who,
                   lim: Limits = Depends(limits)) -> MemoriesOut:
    _check_count(len(body.ids or ()) + len(body.keys or ()), lim, "ids and keys")
    if body.ids is not None and body.keys is not None:
        raise problem(400, "invalid_request", "give ids or keys, not both")
    if body.keys is not None:
        _read_ns(who, body.namespace)
        found = await svc.call(svc.store.get_many, keys=body.keys, namespace=body.namespace)
    else:
        found = await svc.call(svc.store.get_many, body.ids or [])
    return MemoriesOut(items=[_memory_out(m) for m in found if who.can_read(m.namespace)])


@router.get("/memories", response_model=MemoryPageOut, summary="List memories, oldest first, a page at a time")
async def list_memories(namespace: str | None = Query(None, min_length=1), cluster: int | None = None,
                        kind: str | None = None, where: str | None = Query(None, description="a JSON filter"),
                        limit: int = Query(100, ge=1), cursor: str | None = None,
                        svc: StoreService = Svc, who: Principal = Who, lim: Limits = Depends(limits)) -> MemoryPageOut:
    if limit > lim.max_list:
        raise problem(400, "invalid_request", f"limit must be at most {lim.max_list}, got {limit}")
    ns = _read_ns(who, namespace)
    flt = None
    if where is not None:
        try:
            flt = json.loads(where)
        except json.JSONDecodeError as e:
            raise problem(400, "invalid_request", f"where is not valid JSON ({e})") from None
        if not isinstance(flt, dict):
            raise problem(400, "invalid_request", "where must be a JSON object")
    page = await svc.call(svc.store.memories, namespace=ns, cluster=cluster, where=flt, kind=kind,
                          limit=limit, cursor=cursor)
    return MemoryPageOut(items=[_memory_out(m) for m in page.items], next_cursor=page.next_cursor)


@router.get("/namespaces", summary="Namespaces holding memories (those this key may read)")
async def namespaces(svc: StoreService = Svc, who: Principal = Who) -> dict[str, list[str]]:
    names = await svc.call(svc.store.namespaces)
    return {"namespaces": [n for n in names if who.can_read(n)]}


@router.delete("/namespaces/{namespace:path}", response_model=DeleteResult, summary="Delete every memory of a namespace")
async def delete_namespace(namespace: str, svc: StoreService = Svc, who: Principal = Who) -> DeleteResult:
    _write_ns(who, namespace)
    n = await svc.call(svc.store.delete_namespace, namespace)
    return DeleteResult(deleted=n)


def _search_options(body: Any, who: Principal, lim: Limits) -> dict[str, Any]:
    _check_k(body.k, lim)
    return {"k": body.k, "namespace": _read_ns(who, body.namespace), "kind": body.kind, "since": body.since,
            "until": body.until, "mode": body.mode, "n_probe": body.n_probe,
            "lexical_weight": body.lexical_weight, "where": body.where, "as_of": body.as_of, "context": body.context}


@router.post("/search", response_model=HitsOut, summary="The k memories nearest a text or vector")
async def search(body: SearchRequest, svc: StoreService = Svc, who: Principal = Who,
                 lim: Limits = Depends(limits)) -> HitsOut:
    return await handle_search(body, svc, who, lim)


async def handle_search(body: SearchRequest, svc: StoreService, who: Principal, lim: Limits) -> HitsOut:
    """POST /v1/search once its body is validated (also ``hotpaths``' entry)."""
    if (body.query is None) == (body.vector is None):
        raise problem(400, "invalid_request", "give exactly one of query (a text) or vector")
    options = _search_options(body, who, lim)
    if body.query is not None:
        _check_text(body.query, lim, "query")
        if not body.query.strip():
            raise problem(400, "invalid", "query text is empty")
        queries: Any = [body.query]
    else:
        _check_dim(body.vector, svc, "vector")
        queries = np.asarray([body.vector], np.float32)
    hits = (await svc.search(queries, options))[0]
    visible = await _visibility(svc, who)
    return _hits_out(hits, visible)


@router.post("/search/batch", response_model=SearchBatchResult, summary="Several queries with the same options")
async def search_batch(body: SearchBatchRequest, svc: StoreService = Svc, who: Principal = Who,
                       lim: Limits = Depends(limits)) -> SearchBatchResult:
    if (body.queries is None) == (body.vectors is None):
        raise problem(400, "invalid_request", "give exactly one of queries (texts) or vectors")
    options = _search_options(body, who, lim)
    if body.queries is not None:
        _check_count(len(body.queries), lim, "queries")
        for i, q in enumerate(body.queries):
            _check_text(q, lim, f"queries[{i}]")
            if not q.strip():
                raise problem(400, "invalid", f"query {i} is empty or not a string")
        queries: Any = list(body.queries)
    else:
        _check_count(len(body.vectors), lim, "vectors")
        for i, v in enumerate(body.vectors):
            _check_dim(v, svc, f"vectors[{i}]")
        queries = np.asarray(body.vectors, np.float32).reshape(len(body.vectors), -1)
    if len(queries) == 0:
        return SearchBatchResult(results=[])
    results = await svc.search(queries, options)
    visible = await _visibility(svc, who)
    return SearchBatchResult(results=[_hits_out(h, visible) for h in results])


@router.get("/clusters", response_model=ClustersOut, summary="Clusters with their labels, largest first")
async def clusters(svc: StoreService = Svc, who: Principal = Who) -> ClustersOut:
    found = await svc.call(svc.store.clusters)
    visible = await _visibility(svc, who)
    return ClustersOut(clusters=[ClusterOut(**asdict(c)) for c in found if visible(c.id)])


async def _topic(svc: StoreService, who: Principal, cluster_id: int) -> None:
    """A key that reads only some namespaces sees only clusters whose members all lie in them
    (``tenancy``); any other id answers as an unknown one."""
    visible = await _visibility(svc, who)
    if not visible(cluster_id):
        raise problem(404, "not_found", f"no cluster with id {cluster_id}")


@router.get("/clusters/{cluster_id}", response_model=ClusterPageOut, summary="A cluster and a page of its members")
async def cluster(cluster_id: int, namespace: str | None = Query(None, min_length=1), limit: int = Query(100, ge=1),
                  cursor: str | None = None, svc: StoreService = Svc, who: Principal = Who,
                  lim: Limits = Depends(limits)) -> ClusterPageOut:
    if limit > lim.max_list:
        raise problem(400, "invalid_request", f"limit must be at most {lim.max_list}, got {limit}")
    ns = _read_ns(who, namespace)
    await _topic(svc, who, cluster_id)
    page = await svc.call(svc.store.cluster, cluster_id, namespace=ns, limit=limit, cursor=cursor)
    return ClusterPageOut(cluster=ClusterOut(**asdict(page.info)), members=[_memory_out(m) for m in page.members],
                          next_cursor=page.next_cursor)


@router.delete("/clusters/{cluster_id}", response_model=ForgottenOut,
               summary="Forget a topic: archive or delete its members (of one namespace, or all: admin)")
async def forget_cluster(cluster_id: int, action: Literal["archive", "delete"] = Query("archive"),
                         namespace: str | None = Query(None, min_length=1), svc: StoreService = Svc,
                         who: Principal = Who) -> ForgottenOut:
    if namespace is None:
        _admin(who, "forgetting a whole cluster (every namespace)")
    else:
        _write_ns(who, namespace)
        await _topic(svc, who, cluster_id)
    n = await svc.call(svc.store.forget_cluster, cluster_id, action=action, namespace=namespace)
    await svc.call(svc.rerouted, None)
    return ForgottenOut(forgotten=n)


@router.post("/clusters/{cluster_id}/merge", response_model=MovedOut, summary="Merge another cluster into this one (admin)")
async def merge_clusters(cluster_id: int, body: MergeRequest, svc: StoreService = Svc,
                         who: Principal = Who) -> MovedOut:
    _admin(who, "merging clusters")
    n = await svc.call(svc.store.merge_clusters, cluster_id, body.other)
    await svc.call(svc.rerouted, None)
    return MovedOut(moved=n)


@router.post("/clusters/{cluster_id}/move", response_model=MovedOut,
             summary="Move this cluster's members to another cluster (of one namespace, or all: admin)")
async def move_cluster(cluster_id: int, body: MoveRequest, svc: StoreService = Svc, who: Principal = Who,
                       lim: Limits = Depends(limits)) -> MovedOut:
    _check_count(len(body.memory_ids or ()), lim, "memory ids")
    if body.namespace is None:
        _admin(who, "moving a whole cluster (every namespace)")
    else:
        _write_ns(who, body.namespace)
        await _topic(svc, who, cluster_id)
        await _topic(svc, who, body.to)
    n = await svc.call(svc.store.move_cluster, cluster_id, body.to, memory_ids=body.memory_ids,
                       namespace=body.namespace)
    await svc.call(svc.rerouted, None)
    return MovedOut(moved=n)


@router.post("/organize", summary="Re-organise the clusters now (admin)")
async def organize(body: OrganizeRequest | None = None, svc: StoreService = Svc, who: Principal = Who) -> dict[str, Any]:
    _admin(who, "organize")
    report = await svc.call(svc.store.organize, body.task_context if body else None)
    await svc.call(svc.rerouted, None)
    return _jsonable(report)


@router.post("/forget", summary="Apply the forgetting policy now (admin)")
async def forget(body: ForgetRequest | None = None, svc: StoreService = Svc, who: Principal = Who) -> dict[str, Any]:
    _admin(who, "forget")
    report = await svc.call(svc.store.forget, body.now if body else None)
    await svc.call(svc.rerouted, None)
    return _jsonable(report)


@router.post("/flush", summary="Wait for background organisation and persist everything (admin)")
async def flush(svc: StoreService = Svc, who: Principal = Who) -> dict[str, bool]:
    _admin(who, "flush")
    await svc.call(svc.store.flush)
    return {"flushed": True}


@router.get("/stats", summary="Counts and timings (store-wide for keys that read everything)")
async def stats(svc: StoreService = Svc, who: Principal = Who) -> dict[str, Any]:
    if not who.unrestricted:
        counts = await svc.call(svc.namespace_counts, who)
        return {"memories": sum(counts.values()), "namespaces": counts}
    out = _jsonable(await svc.call(svc.store.stats))
    out["service"] = {"add_batches": svc.adds.batches, "adds": svc.adds.items,
                      "search_batches": svc.searches.batches, "searches": svc.searches.items}
    return out


def _jsonable(value: Any) -> Any:
    """Reports hold numpy scalars and tuples; JSON wants plain values (NaN -> None)."""
    return json.loads(json.dumps(value, default=_plain), parse_constant=lambda _: None)


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (set, frozenset)):
        return sorted(v)
    return str(v)
