"""Importers: other memory stores' data as export records (dicts of ``fields.FIELDS``), for
``MemoryStore.import_``. Each takes the other library's own objects or their plain dumps, so
the library itself is only needed to produce them:

* Chroma: a collection (``chromadb.PersistentClient(path).get_collection(name)``), read a page
  at a time with ``collection.get(include=["documents", "metadatas", "embeddings"], limit=,
  offset=)``; or that call's result dict. Ids become keys, documents texts, metadata
  metadata, embeddings vectors (Chroma's own embedding model is never run).
* mem0: the result of ``Memory.get_all(...)`` (``{"results": [...]}`` or the list), or a
  JSON file of it. Laid out as ``clag_fast.compat.mem0.Memory`` keeps memories, so that
  class reads them back: mem0's id is the key, its scope ids and hash are metadata, in the
  namespace ``"mem0"`` by default. mem0 gives no vectors: the store embeds the texts.
* LangGraph: a ``BaseStore`` (say an ``InMemoryStore``), read with ``search`` a page at a
  time; or its ``Item``s / ``SearchItem``s, or their ``.dict()`` form. The namespace tuple
  joined by "." is the namespace, the item key the key, the value the metadata, and the
  text the value's ``text_field`` (default "text"; the whole value as JSON when it has none).
  No vectors: the store embeds the texts.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from clag_fast.store.transfer.fields import encode_vectors

#: Records read per call to a source that pages (Chroma's get, LangGraph's search).
PAGE = 1000

#: mem0 fields kept in a memory's metadata (as ``compat.mem0`` stores them).
_MEM0_META = ("user_id", "agent_id", "run_id", "actor_id", "role", "hash", "created_at", "updated_at")


def from_chroma(collection: Any, *, namespace: str = "default", page: int = PAGE) -> Iterator[dict[str, Any]]:
    """Records of a Chroma collection (or of the dict one ``collection.get`` returned)."""
    if isinstance(collection, dict):
        yield from _chroma_page(collection, namespace)
        return
    offset = 0
    while True:
        got = collection.get(include=["documents", "metadatas", "embeddings"], limit=page, offset=offset)
        if not got.get("ids"):
            return
        yield from _chroma_page(got, namespace)
        offset += len(got["ids"])


def _chroma_page(got: dict[str, Any], namespace: str) -> Iterator[dict[str, Any]]:
    ids = list(got.get("ids") or [])
    docs = got.get("documents")
    metas = got.get("metadatas")
    embs = got.get("embeddings")
    vecs = None
    if embs is not None and len(embs):
        # Chroma hands float64 (or lists); its index holds float32, which the store keeps.
        vecs = encode_vectors(np.asarray(embs, dtype=np.float32))
    for i, cid in enumerate(ids):
        rec: dict[str, Any] = {"key": str(cid), "namespace": namespace,
                               "text": None if docs is None else docs[i],
                               "metadata": None if metas is None else metas[i]}
        if vecs is not None:
            rec["vector"] = vecs[i]
        yield rec


def from_mem0(dump: Any, *, namespace: str = "mem0") -> Iterator[dict[str, Any]]:
    """Records of mem0 memories: ``Memory.get_all()``'s result, its list, or a path to a JSON
    file holding either."""
    if isinstance(dump, (str, Path)):
        dump = json.loads(Path(dump).read_text(encoding="utf-8"))
    items = dump.get("results", []) if isinstance(dump, dict) else dump
    for item in items:
        if not isinstance(item, dict):
            raise ValueError(f"a mem0 memory is a dict, got {type(item).__name__}")
        meta = dict(item.get("metadata") or {})
        for name in _MEM0_META:
            if item.get(name) is not None:
                meta[name] = item[name]
        rec: dict[str, Any] = {"key": item.get("id"), "namespace": namespace, "text": item.get("memory"),
                               "metadata": meta}
        created = _epoch(item.get("created_at"))
        if created is not None:
            rec["created_at"] = created
        yield rec


def from_langgraph(source: Any, *, text_field: str = "text", prefix: tuple[str, ...] = (),
                   page: int = PAGE) -> Iterator[dict[str, Any]]:
    """Records of a LangGraph store (every item under ``prefix``), or of its items (``Item``
    objects or their ``.dict()``), or a path to a JSON file of such dicts."""
    if isinstance(source, (str, Path)):
        source = json.loads(Path(source).read_text(encoding="utf-8"))
    items: Iterable[Any] = _langgraph_pages(source, prefix, page) if hasattr(source, "search") else source
    for item in items:
        d = item.dict() if hasattr(item, "dict") and not isinstance(item, dict) else item
        if not isinstance(d, dict) or "namespace" not in d or "key" not in d:
            raise ValueError(f"a LangGraph item has a namespace and a key, got {d!r:.200}")
        value = d.get("value") or {}
        text = value.get(text_field) if isinstance(value, dict) else None
        if not isinstance(text, str) or not text.strip():
            text = json.dumps(value, ensure_ascii=False, sort_keys=True)
        rec: dict[str, Any] = {"key": str(d["key"]), "namespace": ".".join(d["namespace"]) or "default",
                               "text": text, "metadata": value if isinstance(value, dict) else {"value": value}}
        created = _epoch(d.get("created_at"))
        if created is not None:
            rec["created_at"] = created
        yield rec


def _langgraph_pages(store: Any, prefix: tuple[str, ...], page: int) -> Iterator[Any]:
    offset = 0
    while True:
        items = store.search(prefix, limit=page, offset=offset)
        if not items:
            return
        yield from items
        offset += len(items)


def _epoch(value: Any) -> float | None:
    """A time as Unix seconds: a datetime, an ISO-8601 string or a number (None when absent)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise ValueError(f"not an ISO-8601 time: {value!r}") from None
    raise ValueError(f"not a time: {value!r}")
