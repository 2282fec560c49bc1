"""mem0's ``Memory`` interface on a clag_fast ``MemoryStore`` (no extra package needed).

    from clag_fast.compat.mem0 import Memory
    m = Memory(path="mem/")
    m.add("I am allergic to seafood", user_id="alice")
    hits = m.search("what can alice eat?", user_id="alice", limit=3)["results"]
    m.delete_all(user_id="alice")

Result shapes are mem0's (``mem0/memory/main.py``): ``add`` returns ``{"results": [{"id",
"memory", "event", "actor_id", "role"}]}``; ``search`` / ``get_all`` return ``{"results":
[{"id", "memory", "hash", "metadata", "score", "created_at", "updated_at", "user_id", ...}]}``
(``get_all`` adds ``next_cursor`` for paging); ``get`` returns one such item or None; ``update``
/ ``delete`` / ``delete_all`` return ``{"message": ...}``. Both mem0 calling conventions are
accepted: ``search(query, user_id=..., limit=...)`` and ``search(query, filters={"user_id":
...}, top_k=...)``.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clag_fast._deprecated import renamed_kwargs
from clag_fast.config import StoreConfig
from clag_fast.integrations.storehandle import StoreHandle
from clag_fast.store import MemoryStore

log = logging.getLogger(__name__)

SCOPE = ("user_id", "agent_id", "run_id")
PROMOTED = ("user_id", "agent_id", "run_id", "actor_id", "role")
HISTORY_FIELD = "__mem0_history"
CORE = {"hash", "created_at", "updated_at", HISTORY_FIELD, *PROMOTED}
_OPS = {"eq": "$eq", "ne": "$ne", "in": "$in", "nin": "$nin", "gt": "$gt", "gte": "$gte", "lt": "$lt", "lte": "$lte"}
PAGE = 1000


class Memory:
    """mem0's ``Memory`` on clag_fast.

    ``add(..., infer=True)`` does NOT run mem0's LLM fact extraction and rewriting: each
    message is stored as it is (exact repeats within the same scope are skipped, reported
    with event "NONE") and clag_fast's SLM organisation files it (routing into clusters,
    cluster profiles, evolution links) when the store has an SLM (``slm=``); with
    ``slm=False`` organisation is vector-only. ``infer=False`` stores every message as it is.

    store / path / config / slm: the ``MemoryStore`` (see ``StoreHandle``); without either a
      temporary directory is used. embedder: None (clag_fast's MiniLM) or an object with
      ``encode(list[str]) -> float32[n, dim]`` (its ``dim`` attribute, or ``config.dim``,
      gives the width). namespace: the store namespace holding mem0's memories.

    Scopes: memories carry ``user_id`` / ``agent_id`` / ``run_id``; a read or a delete_all
    names at least one and reaches only memories carrying all the ids it names.
    ``history(memory_id)`` lists the memory's ADD and UPDATE events; it is kept with the
    memory, so a deleted memory has no history.
    """

    @renamed_kwargs(llm="slm")
    def __init__(self, store: MemoryStore | None = None, *, path: str | Path | None = None,
                 config: StoreConfig | None = None, embedder: Any = None, slm: Any = False,
                 namespace: str = "mem0") -> None:
        dim = (config.dim if config is not None else None) or getattr(embedder, "dim", None) or 384
        self.namespace = namespace
        self._handle = StoreHandle(store, path=path, config=config, encoder=embedder, slm=slm)
        self._store = self._handle.open_now(int(dim))

    @property
    def store(self) -> MemoryStore:
        """The ``MemoryStore`` holding the memories."""
        return self._store

    def close(self) -> None:
        """Close the store (when this object opened it) and remove a temporary directory."""
        self._handle.close()

    # -- writing -------------------------------------------------------------------------
    def add(self, messages: Any, *, user_id: str | None = None, agent_id: str | None = None,
            run_id: str | None = None, metadata: dict[str, Any] | None = None, infer: bool = True,
            memory_type: str | None = None, prompt: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Store ``messages`` (a string, a message dict or a list of them) in the scope of
        the ids given (at least one); system messages are skipped, as in mem0.

        ``infer=True`` runs clag_fast's SLM organisation, NOT mem0's LLM fact extraction and
        rewriting: each message is stored as it is (an exact repeat in the same scope is
        skipped and reported with event "NONE"), then routed into clusters and profiled by the
        store's SLM when it has one (``slm=``), by vectors otherwise. ``infer=False`` stores
        every message as it is."""
        scope = _scope(user_id, agent_id, run_id)
        if not scope:
            raise ValueError("At least one of 'user_id', 'agent_id', or 'run_id' must be provided.")
        if memory_type is not None:
            raise ValueError(f"memory_type={memory_type!r} is not supported (procedural memories need mem0's LLM)")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        elif isinstance(messages, dict):
            messages = [messages]
        elif not isinstance(messages, list):
            raise ValueError(f"messages must be str, dict, or list[dict], got {type(messages).__name__}")
        base = {k: v for k, v in (metadata or {}).items() if k not in SCOPE}
        clash = [k for k in base if k in CORE]
        if clash:
            raise ValueError(f"metadata uses reserved field(s) {clash}")
        now = _now()
        texts, metas, keys, out = [], [], [], []
        seen: set[str] = set()
        for msg in messages:
            if not isinstance(msg, dict) or msg.get("role") is None or msg.get("content") is None:
                log.warning("skipping a message without role/content: %r", msg)
                continue
            if msg["role"] == "system":
                continue
            text = str(msg["content"])
            digest = _hash(text)
            if infer and (digest in seen or self._find(dict(scope, hash=digest))):
                out.append({"id": None, "memory": text, "event": "NONE", "actor_id": msg.get("name"),
                            "role": msg["role"]})
                continue
            seen.add(digest)
            key = str(uuid.uuid4())
            # No history list on add: its ADD event is derived at read (history()), so the
            # metadata stays flat, which the store decodes once and caches for searches.
            meta = {**copy.deepcopy(base), **scope, "role": msg["role"], "hash": digest, "created_at": now,
                    "updated_at": now}
            if msg.get("name"):
                meta["actor_id"] = msg["name"]
            texts.append(text)
            metas.append(meta)
            keys.append(key)
            out.append({"id": key, "memory": text, "event": "ADD", "actor_id": msg.get("name"), "role": msg["role"]})
        if texts:
            self._store.add_many(texts, namespaces=self.namespace, metadata=metas, keys=keys)
        return {"results": out}

    def update(self, memory_id: str, text: str | None = None, metadata: dict[str, Any] | None = None,
               data: str | None = None) -> dict[str, str]:
        """Replace a memory's text and/or metadata (its scope ids stay). ``data`` is mem0's
        older name for ``text``."""
        text = text if text is not None else data
        if text is None and metadata is None:
            raise ValueError("At least one of text or metadata must be provided.")
        old = self._memory(memory_id)
        old_meta = old.metadata or {}
        now = _now()
        meta = {k: v for k, v in (metadata if metadata is not None else _extra(old_meta)).items() if k not in CORE}
        meta.update({k: old_meta[k] for k in PROMOTED if k in old_meta})
        new_text = text if text is not None else old.text
        meta.update(hash=_hash(new_text), created_at=old_meta.get("created_at"), updated_at=now)
        meta[HISTORY_FIELD] = list(old_meta.get(HISTORY_FIELD, [])) + [_event(memory_id, old.text, new_text, "UPDATE", now)]
        self._store.update(key=memory_id, namespace=self.namespace, text=text, metadata=meta)
        return {"message": "Memory updated successfully!"}

    def delete(self, memory_id: str) -> dict[str, str]:
        """Delete one memory (ValueError when there is none with this id)."""
        try:
            self._store.delete(key=_check_id(memory_id), namespace=self.namespace)
        except KeyError:
            raise ValueError(f"Memory with id {memory_id} not found") from None
        return {"message": "Memory deleted successfully!"}

    def delete_all(self, user_id: str | None = None, agent_id: str | None = None,
                   run_id: str | None = None) -> dict[str, str]:
        """Delete the memories carrying all the ids given; refuses to run with none
        (``reset()`` empties everything)."""
        scope = _scope(user_id, agent_id, run_id)
        if not scope:
            raise ValueError("At least one filter is required to delete all memories. "
                             "If you want to delete all memories, use the `reset()` method.")
        keys = [m.key for m in self._all(_where(scope, None))]
        if keys:
            self._store.delete_many(keys=keys, namespace=self.namespace)
        return {"message": "Memories deleted successfully!"}

    def reset(self) -> None:
        """Delete every memory of this ``Memory`` (its namespace; others are untouched)."""
        self._store.delete_namespace(self.namespace)

    # -- reading -------------------------------------------------------------------------
    def get(self, memory_id: str) -> dict[str, Any] | None:
        """One memory in mem0's item shape, or None."""
        found = self._store.get_many(keys=[_check_id(memory_id)], namespace=self.namespace)
        return _item(found[0], keep_score=True) if found else None

    def get_all(self, *, user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None,
                filters: dict[str, Any] | None = None, limit: int | None = None, top_k: int | None = None,
                cursor: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Memories of a scope (at least one id), oldest first: up to ``limit`` (or
        ``top_k``; 100 by default) from ``cursor``; ``next_cursor`` continues, None at the end."""
        scope, rest = _split(user_id, agent_id, run_id, filters)
        n = _limit(limit, top_k, 100)
        page = self._store.memories(namespace=self.namespace, where=_where(scope, rest), limit=n, cursor=cursor)
        return {"results": [_item(m) for m in page.items], "next_cursor": page.next_cursor}

    def search(self, query: str, *, user_id: str | None = None, agent_id: str | None = None,
               run_id: str | None = None, limit: int | None = None, top_k: int | None = None,
               filters: dict[str, Any] | None = None, threshold: float | None = None,
               **kwargs: Any) -> dict[str, Any]:
        """The memories of a scope most relevant to ``query`` (clag_fast's hybrid search:
        MiniLM similarity fused with BM25), best first, with their scores. ``filters`` holds
        scope ids and metadata conditions (``{"key": value}``, ``{"key": {"eq"|"ne"|"in"|
        "nin"|"gt"|"gte"|"lt"|"lte": v}}``, ``{"AND"|"OR": [...]}``) applied before top-k;
        ``threshold`` drops hits scoring below it."""
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query must be a non-empty string")
        scope, rest = _split(user_id, agent_id, run_id, filters)
        hits = self._store.search(query, _limit(limit, top_k, 100), namespace=self.namespace,
                                  where=_where(scope, rest))
        return {"results": [_item(h, float(h.score)) for h in hits if threshold is None or h.score >= threshold]}

    def history(self, memory_id: str) -> list[dict[str, Any]]:
        """The memory's ADD / UPDATE events, oldest first ([] for an unknown id)."""
        found = self._store.get_many(keys=[_check_id(memory_id)], namespace=self.namespace)
        if not found:
            return []
        meta = found[0].metadata or {}
        events = list(meta.get(HISTORY_FIELD, []))
        if not events or events[0]["event"] != "ADD":
            # Stored since adds keep no list: the ADD event is the memory's creation, with the
            # text it had then (the first update's old text, or the text now).
            first = events[0]["old_memory"] if events else found[0].text
            add = _event(memory_id, None, first, "ADD", meta.get("created_at"))
            add["id"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"clag_fast:mem0:add:{memory_id}"))  # stable across calls
            events.insert(0, add)
        return events

    # -- internals -----------------------------------------------------------------------
    def _memory(self, memory_id: str) -> Any:
        found = self._store.get_many(keys=[_check_id(memory_id)], namespace=self.namespace)
        if not found:
            raise ValueError(f"Memory with id {memory_id} not found")
        return found[0]

    def _find(self, where: dict) -> bool:
        return bool(self._store.memories(namespace=self.namespace, where=where, limit=1).items)

    def _all(self, where: dict | None) -> list[Any]:
        out: list[Any] = []
        cursor = None
        while True:
            page = self._store.memories(namespace=self.namespace, where=where, limit=PAGE, cursor=cursor)
            out += page.items
            cursor = page.next_cursor
            if cursor is None:
                return out


# -- helpers ----------------------------------------------------------------------------
def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _hash(text: str) -> str:
    return hashlib.md5(text.encode("utf-8")).hexdigest()


def _event(memory_id: str, old: str | None, new: str, event: str, when: str) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "memory_id": memory_id, "old_memory": old, "new_memory": new,
            "event": event, "created_at": when, "updated_at": when, "is_deleted": 0}


def _check_id(memory_id: Any) -> str:
    if not isinstance(memory_id, str) or not memory_id:
        raise ValueError(f"memory_id must be a non-empty string, got {memory_id!r}")
    return memory_id


def _scope(user_id: str | None, agent_id: str | None, run_id: str | None) -> dict[str, str]:
    out = {}
    for name, value in (("user_id", user_id), ("agent_id", agent_id), ("run_id", run_id)):
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        out[name] = value.strip()
    return out


def _split(user_id: str | None, agent_id: str | None, run_id: str | None,
           filters: dict[str, Any] | None) -> tuple[dict[str, str], dict[str, Any]]:
    """(scope ids, other conditions) from the arguments and ``filters``; ValueError when no
    scope id is given or the two disagree."""
    filters = dict(filters or {})
    from_filters = _scope(*(filters.pop(k, None) for k in SCOPE))
    scope = _scope(user_id, agent_id, run_id)
    for k, v in from_filters.items():
        if scope.get(k, v) != v:
            raise ValueError(f"{k} given twice with different values ({scope[k]!r}, {v!r})")
        scope[k] = v
    if not scope:
        raise ValueError("filters must contain at least one of: user_id, agent_id, run_id. "
                         "Example: filters={'user_id': 'u1'}")
    return scope, filters


def _limit(limit: int | None, top_k: int | None, default: int) -> int:
    n = limit if limit is not None else top_k if top_k is not None else default
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"limit must be a positive integer, got {n!r}")
    return n


def _where(scope: dict[str, str], rest: dict[str, Any] | None) -> dict | None:
    parts: list[dict] = [{k: v} for k, v in scope.items()]
    if rest:
        parts.append(_translate(rest))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else {"$and": parts}


def _translate(filters: dict[str, Any]) -> dict:
    """mem0's metadata filter grammar as the store's ``where=``."""
    parts = []
    for key, cond in filters.items():
        if key in ("AND", "OR"):
            if not isinstance(cond, list) or not cond:
                raise ValueError(f"{key} takes a non-empty list of filters, got {cond!r}")
            parts.append({"$and" if key == "AND" else "$or": [_translate(c) for c in cond]})
        elif key == "NOT" or key.startswith("$"):
            raise ValueError(f"filter operator {key!r} is not supported (supported: AND, OR)")
        elif isinstance(cond, dict):
            for op, value in cond.items():
                if op not in _OPS:
                    raise ValueError(f"filter operator {op!r} on {key!r} is not supported "
                                     f"(supported: {', '.join(_OPS)})")
                parts.append({key: {_OPS[op]: value}})
        elif cond == "*":
            raise ValueError(f"the wildcard filter on {key!r} is not supported")
        else:
            parts.append({key: cond})
    if not parts:
        raise ValueError("empty filter")
    return parts[0] if len(parts) == 1 else {"$and": parts}


def _extra(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k not in CORE}


def _item(m: Any, score: float | None = None, keep_score: bool = False) -> dict[str, Any]:
    meta = m.metadata or {}
    item: dict[str, Any] = {"id": m.key, "memory": m.text, "hash": meta.get("hash"), "metadata": _extra(meta) or None,
                            "score": score, "created_at": meta.get("created_at"), "updated_at": meta.get("updated_at")}
    if score is None and not keep_score:
        del item["score"]  # as mem0's get_all (its get keeps score=None)
    for k in PROMOTED:
        if k in meta:
            item[k] = meta[k]
    return item


__all__ = ["Memory"]
