"""LangGraph ``BaseStore`` backed by a clag_fast ``MemoryStore`` (extra ``langgraph``).

    from clag_fast.integrations.langgraph import ClagStore
    store = ClagStore(index={"dims": 384, "embed": my_embeddings, "fields": ["text"]}, path="mem/")
    store.put(("users", "u1"), "tea", {"text": "The user likes green tea", "kind": "pref"})
    items = store.search(("users",), query="what does the user drink?", filter={"kind": "pref"})

Mapping: a namespace tuple is the store namespace ``".".join(labels)`` (LangGraph forbids "."
in labels) and the item key the memory's key. The value is the memory's metadata, beside
reserved fields named ``__lg_*`` (a value may not use that prefix): the namespace's labels one
per field (``__lg_ns0``, ``__lg_ns1``, ...; a search prefix with deeper namespaces below it
filters on them in the store, before top-k), the times, and what was embedded. The memory's
text and vector are the first text embedded; an item with nothing embedded keeps its value as
JSON text, a placeholder vector and the store kind ``RAW_KIND`` (similarity search reads kind
``KIND`` only). Each further text embedded (several fields, list paths) is one more memory,
keyed ``key + PART_SEP + i`` and carrying the value too, so a search max-pools over an item's
texts as ``InMemoryStore`` does. Behaviour follows ``InMemoryStore``:

- a batch answers its gets, searches and listings from the state before its puts, and of
  several puts to one (namespace, key) the last wins;
- ``filter`` matches as in ``InMemoryStore`` (equality, nested-dict and list equality,
  ``$eq``/``$ne``/``$gt``/``$gte``/``$lt``/``$lte``); string equalities run inside the store
  before top-k, the rest is checked here on over-fetched candidates;
- a search with a query ranks embedded items by cosine similarity, then fills up to
  ``limit`` with items that have no vector (``index=False`` or no text at the fields).

Differences (tested, and listed in the README): a search without a query lists items in
insertion order across namespaces (``InMemoryStore`` groups them by namespace);
``list_namespaces`` shows only namespaces that hold items (as the Postgres store does;
``InMemoryStore`` also lists namespaces that were only read or emptied); re-putting a key
replaces all its vectors (``InMemoryStore`` keeps old ones when the new value is not embedded
or has fewer fields); unknown filter operators raise even when nothing would be compared;
texts that are empty or whitespace are not embedded; keys must be non-empty, at most 500
characters and free of ``PART_SEP``; namespaces have at most ``MAX_DEPTH`` labels.

TTL (``InMemoryStore`` has none; this follows LangGraph's ``BaseStore`` contract as its
Postgres store does): ``put(..., ttl=minutes)`` (or ``TTLConfig.default_ttl``) stores an
expiry time with the item and its further vectors. Reads never return an expired item, even
before it is deleted. Expired items are deleted lazily (no background thread): at the end of
a batch whose reads met one, or that ends ``sweep_interval_minutes`` or more after the last
sweep, by ``list_namespaces`` (so an expired namespace is not listed) and by ``sweep_ttl()``.
A get or search that returns an item with a TTL restarts its clock (``refresh_ttl``,
default ``TTLConfig.refresh_on_read`` or True); to spare a write per read, a refresh is
skipped while less than 1% of the TTL (at least a second) has passed since the last one, so
an item may expire up to that much early. Stores without TTL items pay nothing for this:
the first TTL put leaves a marker memory in the store namespace ``MARKER_NAMESPACE``
(LangGraph refuses a root label "langgraph" in puts), and only stores holding it check expiry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
try:  # name the extra to install rather than the missing module
    import langgraph  # noqa: F401
except ImportError as e:
    raise ImportError(f"clag_fast.integrations.langgraph needs langgraph: pip install 'clag_fast[langgraph]' ({e})") from e
from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)
from langgraph.store.base.embed import ensure_embeddings, get_text_at_path, tokenize_path

from clag_fast._deprecated import renamed_kwargs
from clag_fast.config import StoreConfig
from clag_fast.integrations.storehandle import StoreHandle, query_vector
from clag_fast.store import MemoryStore

log = logging.getLogger(__name__)

RESERVED_PREFIX = "__lg_"
LEVEL_FIELD = "__lg_ns"  # + label position
INDEXED_FIELD = "__lg_indexed"
CREATED_FIELD = "__lg_created_at"
UPDATED_FIELD = "__lg_updated_at"
PARTS_FIELD = "__lg_parts"
OWNER_FIELD = "__lg_owner"
EXPIRES_FIELD = "__lg_expires_at"  # Unix seconds
TTL_FIELD = "__lg_ttl"  # minutes, as given to put
MAX_DEPTH = 256
# Every reserved field a value can carry: a set lookup per field, not a prefix test.
RESERVED = frozenset([INDEXED_FIELD, CREATED_FIELD, UPDATED_FIELD, PARTS_FIELD, OWNER_FIELD, EXPIRES_FIELD,
                      TTL_FIELD] + [f"{LEVEL_FIELD}{i}" for i in range(MAX_DEPTH)])
PART = "part"  # INDEXED_FIELD of an item's further vectors
# Store kinds: similarity search reads only KIND (items with vectors and their further
# vectors), so it needs no metadata filter of its own; RAW_KIND rows hold a placeholder vector.
KIND = "langgraph"
RAW_KIND = "langgraph_raw"
META_KIND = "langgraph_meta"
MARKER_NAMESPACE = "langgraph"  # a root label LangGraph refuses in puts: no item can live there
MARKER_KEY = "ttl"
PART_SEP = "\x1f"
MAX_KEY = 500
OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
PAGE = 1000


class ClagStore(BaseStore):
    """A LangGraph store on a clag_fast ``MemoryStore``.

    index: LangGraph's ``IndexConfig`` (``dims``, ``embed``: an ``Embeddings``, a function
      or a "provider:model" string, ``fields``: paths embedded by default, "$" = the whole
      value). None: no vectors, queries are ignored (as in ``InMemoryStore``).
    store / path / config / slm: the ``MemoryStore`` (see ``StoreHandle``; ``llm`` is the
      deprecated spelling of ``slm``); without either a temporary directory is used and
      removed at ``close()``.
    search_mode: "two_stage" or "flat" (exact).
    ttl: LangGraph's ``TTLConfig`` (``default_ttl`` minutes for puts that name none,
      ``refresh_on_read``, ``sweep_interval_minutes``); items expire only when given a TTL.
    """

    supports_ttl = True

    @renamed_kwargs(llm="slm")
    def __init__(self, *, index: IndexConfig | None = None, store: MemoryStore | None = None,
                 path: str | Path | None = None, config: StoreConfig | None = None, slm: Any = False,
                 search_mode: str = "two_stage", ttl: TTLConfig | None = None) -> None:
        if search_mode not in ("two_stage", "flat"):
            raise ValueError(f"search_mode must be 'two_stage' or 'flat', got {search_mode!r}")
        self.search_mode = search_mode
        self.ttl_config = dict(ttl) if ttl else None
        if self.ttl_config and self.ttl_config.get("default_ttl") is not None:
            _check_ttl(self.ttl_config["default_ttl"])
        self.index_config = dict(index) if index else None
        self.embeddings = None
        self._fields: list[tuple[str, Any]] = []
        if self.index_config:
            if "dims" not in self.index_config:
                raise ValueError("index config needs 'dims'")
            self.embeddings = ensure_embeddings(self.index_config.get("embed"))
            self._fields = [(p, tokenize_path(p) if p != "$" else p) for p in (self.index_config.get("fields") or ["$"])]
        dims = int(self.index_config["dims"]) if self.index_config else 1
        self._handle = StoreHandle(store, path=path, config=config, slm=slm)
        self._store = self._handle.open_now(dims)
        # Items with no vector still need a row: a fixed unit vector, of RAW_KIND.
        self._placeholder = np.zeros(dims, np.float32)
        self._placeholder[0] = 1.0
        # Namespaces that have deeper namespaces below them ("a" for "a.b"): a prefix that has
        # none is one store namespace, searched with namespace= instead of per-label filters.
        # This process is the store's only writer, so the set (only ever grown) is complete.
        self._parents: set[str] = set()
        names = self._store.namespaces()
        for name in names:
            self._note_namespace(name)
        # Whether any item may carry a TTL: reads check expiry times only then.
        self._expiring = MARKER_NAMESPACE in names
        self._sweep_due = False
        self._last_sweep = time.time()
        # Held by writes, TTL refreshes and sweeps, so a sweep never deletes an item that a
        # concurrent put (abatch runs in threads) has just renewed.
        self._write_lock = threading.Lock()

    def _note_namespace(self, name: str) -> None:
        labels = name.split(".")
        self._parents.update(".".join(labels[:i]) for i in range(1, len(labels)))

    def _scope(self, prefix: tuple[str, ...]) -> tuple[str | None, list[dict]]:
        """(store namespace, label filters) selecting the namespaces under ``prefix``."""
        if not prefix:
            return None, []
        name = _ns_name(prefix)
        if name not in self._parents:
            return name, []
        return None, [{f"{LEVEL_FIELD}{i}": label} for i, label in enumerate(prefix)]

    @property
    def store(self) -> MemoryStore:
        """The ``MemoryStore`` holding the items."""
        return self._store

    def close(self) -> None:
        """Close the store (when this object opened it) and remove a temporary directory."""
        self._handle.close()

    # -- batches -------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        puts = self._check(ops)
        queries = self._queries(ops)
        now = time.time() if self._expiring else None
        results, touched = self._read(ops, {q: self.embeddings.embed_query(q) for q in queries}, now)
        if touched:
            self._refresh(touched, now)
        if puts:
            per_put = self._put_texts(puts)
            texts = [t for ts in per_put for t in ts]
            self._write(puts, per_put, self.embeddings.embed_documents(texts) if texts else [])
        if now is not None:
            self._sweep_if_due(now)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        puts = self._check(ops)
        queries = self._queries(ops)
        qvecs = dict(zip(queries, await asyncio.gather(*(self.embeddings.aembed_query(q) for q in queries))))
        loop = asyncio.get_running_loop()
        now = time.time() if self._expiring else None
        results, touched = await loop.run_in_executor(None, self._read, ops, qvecs, now)
        if touched:
            await loop.run_in_executor(None, self._refresh, touched, now)
        if puts:
            per_put = self._put_texts(puts)
            texts = [t for ts in per_put for t in ts]
            embedded = await self.embeddings.aembed_documents(texts) if texts else []
            await loop.run_in_executor(None, self._write, puts, per_put, embedded)
        if now is not None:
            await loop.run_in_executor(None, self._sweep_if_due, now)
        return results

    def _check(self, ops: list[Op]) -> dict[tuple[tuple[str, ...], str], PutOp]:
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for op in ops:
            if not isinstance(op, (GetOp, SearchOp, ListNamespacesOp, PutOp)):
                raise ValueError(f"Unknown operation type: {type(op)}")
            validate_op_namespace(op)
            if isinstance(op, SearchOp) and op.filter:
                check_filter(op.filter)
            if isinstance(op, PutOp):
                if len(op.namespace) > MAX_DEPTH:
                    raise ValueError(f"namespace has {len(op.namespace)} labels, at most {MAX_DEPTH} are supported")
                if op.ttl is not None and op.value is not None:
                    _check_ttl(op.ttl)
                if not isinstance(op.key, str) or not op.key or len(op.key) > MAX_KEY or PART_SEP in op.key:
                    raise ValueError(f"key {op.key!r:.60} must be a non-empty string of at most {MAX_KEY} "
                                     "characters without \\x1f")
                if op.value is not None:
                    clash = [f for f in op.value if isinstance(f, str) and f.startswith(RESERVED_PREFIX)]
                    if clash:
                        raise ValueError(f"value for key {op.key!r} uses reserved field(s) {clash}")
                puts[(op.namespace, op.key)] = op  # last put of a (namespace, key) wins
        return puts

    def _queries(self, ops: list[Op]) -> list[str]:
        if not self.embeddings:
            return []
        return sorted({op.query for op in ops if isinstance(op, SearchOp) and op.query})

    # -- reading -------------------------------------------------------------------------
    def _read(self, ops: list[Op], qvecs: dict[str, Any],
              now: float | None) -> tuple[list[Result], list[tuple[str, str, dict]]]:
        """The ops' results, and the (store namespace, key, metadata) of returned items whose
        TTL the reads refresh. ``now``: the time expiry is judged at (None: no item has a TTL)."""
        results: list[Result] = []
        touched: list[tuple[str, str, dict]] = []
        got = self._get_all([op for op in ops if isinstance(op, GetOp)])
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(got.get((_ns_name(op.namespace), op.key)), now,
                                         touched if op.refresh_ttl else None))
            elif isinstance(op, SearchOp):
                results.append(self._search(op, qvecs.get(op.query) if op.query else None, now,
                                            touched if op.refresh_ttl else None))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                results.append(None)
        return results, touched

    def _get_all(self, gets: list[GetOp]) -> dict[tuple[str, str], Any]:
        """The stored memories of a batch's gets, one store call per namespace."""
        by_ns: dict[str, list[str]] = {}
        for op in gets:
            by_ns.setdefault(_ns_name(op.namespace), []).append(op.key)
        return {(name, m.key): m for name, keys in by_ns.items()
                for m in self._store.get_many(keys=list(dict.fromkeys(keys)), namespace=name)}

    def _get(self, m: Any, now: float | None, touched: list | None) -> Item | None:
        if m is None or m.kind not in (KIND, RAW_KIND):
            return None
        if now is not None:
            if self._expired(m.metadata, now):
                return None
            if touched is not None and TTL_FIELD in m.metadata:
                touched.append((m.namespace, m.key, m.metadata))
        return _item(m)

    def _search(self, op: SearchOp, qvec: Any, now: float | None, touched: list | None) -> list[SearchItem]:
        if op.limit <= 0:
            return []
        namespace, where = self._scope(tuple(op.namespace_prefix))
        where += _pushdown(op.filter or {})
        if qvec is None:
            items = where + [{INDEXED_FIELD: {"$in": [True, False]}}]  # items, not their further vectors
            found = [(m, m.key, _value(m.metadata), None) for m in
                     self._list(namespace, None, items, op.filter, op.offset + op.limit, now)[op.offset:]]
        else:
            found = self._ranked(query_vector(qvec, self._store.config.dim), namespace, where, op.filter,
                                 op.offset + op.limit, now)[op.offset:]
            if len(found) < op.limit:
                # As InMemoryStore: unembedded items fill the rest (offset does not apply to them).
                found += [(m, m.key, _value(m.metadata), None) for m in
                          self._list(namespace, RAW_KIND, where, op.filter, op.limit - len(found), now)]
        if touched is not None and now is not None:
            touched += [(m.namespace, key, m.metadata) for m, key, _, _ in found if TTL_FIELD in m.metadata]
        return [_search_item(m, key, value, score) for m, key, value, score in found]

    def _expired(self, metadata: dict, now: float) -> bool:
        """Whether an item's TTL has passed (then a sweep is due)."""
        expires = metadata.get(EXPIRES_FIELD)
        if expires is None or expires > now:
            return False
        self._sweep_due = True
        return True

    def _list(self, namespace: str | None, kind: str | None, where: list[dict], filt: dict | None,
              want: int, now: float | None) -> list[Any]:
        out: list[Any] = []
        cursor = None
        while len(out) < want:
            page = self._store.memories(namespace=namespace, kind=kind, where=_and(where), limit=PAGE, cursor=cursor)
            out += [m for m in page.items if (now is None or not self._expired(m.metadata, now))
                    and (not filt or matches(_value(m.metadata), filt))]
            cursor = page.next_cursor
            if cursor is None:
                break
        return out[:want]

    def _ranked(self, qvec: np.ndarray, namespace: str | None, where: list[dict], filt: dict | None,
                want: int, now: float | None) -> list[tuple[Any, str, dict, float]]:
        """The best ``want`` items as (hit, item key, value, score), each at its best vector's
        score (max pooling). Several vectors of one item and a filter checked here both need
        over-fetching: k grows until enough items pass or every candidate was seen."""
        k = want if not filt and now is None else max(2 * want, 16)
        cond = _and(where)
        while True:
            hits = self._store.search(qvec, k, namespace=namespace, kind=KIND, where=cond, mode=self.search_mode)
            seen: set[tuple[str, str]] = set()
            kept = []
            for h in hits:
                meta = h.metadata
                if now is not None and self._expired(meta, now):
                    continue
                key = meta.get(OWNER_FIELD) or h.key
                if (h.namespace, key) in seen:
                    continue  # hits come best first: the first of an item is its best
                seen.add((h.namespace, key))
                value = _value(meta)
                if not filt or matches(value, filt):
                    kept.append((h, key, value, float(h.score)))
            if len(kept) >= want or len(hits) < k:
                return kept[:want]
            k *= 4

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        if self._expiring:
            self.sweep_ttl()  # a namespace whose items all expired is gone
        names = [_ns_tuple(n) for n in self._store.namespaces() if n != MARKER_NAMESPACE]
        if op.match_conditions:
            names = [ns for ns in names if all(_matches_condition(c, ns) for c in op.match_conditions)]
        if op.max_depth is not None:
            names = sorted({ns[: op.max_depth] for ns in names})
        else:
            names = sorted(names)
        return names[op.offset: op.offset + op.limit]

    # -- TTL -----------------------------------------------------------------------------
    def sweep_ttl(self) -> int:
        """Delete every item whose TTL has passed; returns how many items were deleted."""
        if not self._expiring:
            return 0
        with self._write_lock:
            now = time.time()
            self._sweep_due = False
            self._last_sweep = now
            by_ns: dict[str, list[str]] = {}
            cursor = None
            while True:
                page = self._store.memories(where={EXPIRES_FIELD: {"$lte": now}}, limit=PAGE, cursor=cursor)
                for m in page.items:
                    by_ns.setdefault(m.namespace, []).append(m.key)
                cursor = page.next_cursor
                if cursor is None:
                    break
            for name, keys in by_ns.items():
                self._store.delete_many(keys=keys, namespace=name)
        return sum(PART_SEP not in k for keys in by_ns.values() for k in keys)

    def _sweep_if_due(self, now: float) -> None:
        interval = (self.ttl_config or {}).get("sweep_interval_minutes")
        if self._sweep_due or (interval and now - self._last_sweep >= 60.0 * interval):
            self.sweep_ttl()

    def _refresh(self, touched: list[tuple[str, str, dict]], now: float) -> None:
        """Restart the TTL clock of items a read returned (their further vectors' rows too).
        ``touched``: (store namespace, item key, the metadata the read saw)."""
        due: dict[str, list[str]] = {}
        for name, key, meta in touched:
            if _refresh_due(meta, now):
                due.setdefault(name, []).append(key)
        if not due:
            return
        with self._write_lock:
            # Re-read under the lock: a put since the read may have replaced the value or
            # dropped the TTL, and only the expiry time may change here.
            for name, keys in due.items():
                for m in self._store.get_many(keys=list(dict.fromkeys(keys)), namespace=name):
                    if not _refresh_due(m.metadata, now):
                        continue
                    parts = int(m.metadata.get(PARTS_FIELD) or 0)
                    rows = [m] + (self._store.get_many(keys=[_part_key(m.key, i) for i in range(1, parts + 1)],
                                                       namespace=name) if parts else [])
                    expires = now + 60.0 * m.metadata[TTL_FIELD]
                    for row in rows:
                        self._store.update(key=row.key, namespace=name,
                                           metadata=dict(row.metadata, **{EXPIRES_FIELD: expires}))

    # -- writing -------------------------------------------------------------------------
    def _put_texts(self, puts: dict[tuple[tuple[str, ...], str], PutOp]) -> list[list[str]]:
        """The texts embedded for each put, in put order."""
        return [self._texts_of(op) for op in puts.values()]

    def _texts_of(self, op: PutOp) -> list[str]:
        """The texts at the indexed paths of a put's value, one vector each (as InMemoryStore)."""
        if op.value is None or op.index is False or not self.embeddings:
            return []
        fields = self._fields if op.index is None else [(p, tokenize_path(p) if p != "$" else p) for p in op.index]
        return [t for _, path in fields for t in get_text_at_path(op.value, path) if isinstance(t, str) and t.strip()]

    def _old_parts(self, puts: dict[tuple[tuple[str, ...], str], PutOp]) -> dict[tuple[str, str], int]:
        """How many further vectors each put key has now (they are replaced or deleted)."""
        by_ns: dict[str, list[str]] = {}
        for ns, key in puts:
            by_ns.setdefault(_ns_name(ns), []).append(key)
        out = {}
        for name, keys in by_ns.items():
            # Most items have one vector: ask first which keys have a first further vector (a
            # key lookup that usually finds nothing), and read only those items' counts.
            firsts = self._store.get_many(keys=[_part_key(k, 1) for k in keys], namespace=name)
            owners = [m.key.partition(PART_SEP)[0] for m in firsts]
            for m in self._store.get_many(keys=owners, namespace=name) if owners else []:
                if (m.metadata or {}).get(PARTS_FIELD):
                    out[(name, m.key)] = int(m.metadata[PARTS_FIELD])
        return out

    def _write(self, puts: dict[tuple[tuple[str, ...], str], PutOp], per_put: list[list[str]],
               embedded: list[Any]) -> None:
        """Write the puts: ``per_put`` their texts (``_put_texts``), ``embedded`` the vectors
        of those texts in order."""
        with self._write_lock:
            self._write_locked(puts, per_put, embedded)

    def _write_locked(self, puts: dict[tuple[tuple[str, ...], str], PutOp], per_put: list[list[str]],
                      embedded: list[Any]) -> None:
        stamp = time.time()
        now = datetime.fromtimestamp(stamp, timezone.utc).isoformat()
        old_parts = self._old_parts(puts) if self.embeddings else {}
        vectors = iter(embedded)
        texts, vecs, names, metas, keys, kinds = [], [], [], [], [], []
        deletes: dict[str, list[str]] = {}
        for ((ns, key), op), item_texts in zip(puts.items(), per_put):
            name = _ns_name(ns)
            old = old_parts.get((name, key), 0)
            if op.value is None:
                deletes.setdefault(name, []).extend([key] + [_part_key(key, i) for i in range(1, old + 1)])
                continue
            base = dict(op.value)
            base.update({f"{LEVEL_FIELD}{i}": label for i, label in enumerate(ns)})
            base.update({CREATED_FIELD: now, UPDATED_FIELD: now})
            if len(item_texts) > 1:
                base[PARTS_FIELD] = len(item_texts) - 1  # on the further rows too: a TTL refresh finds them
            if op.ttl is not None:
                base.update({EXPIRES_FIELD: stamp + 60.0 * op.ttl, TTL_FIELD: op.ttl})
            meta = dict(base, **{INDEXED_FIELD: bool(item_texts)})
            texts.append(item_texts[0] if item_texts else json.dumps(op.value, ensure_ascii=False, default=str))
            vecs.append(next(vectors) if item_texts else self._placeholder)
            names.append(name)
            metas.append(meta)
            keys.append(key)
            kinds.append(KIND if item_texts else RAW_KIND)
            for i, t in enumerate(item_texts[1:], 1):
                texts.append(t)
                vecs.append(next(vectors))
                names.append(name)
                metas.append(dict(base, **{INDEXED_FIELD: PART, OWNER_FIELD: key}))
                keys.append(_part_key(key, i))
                kinds.append(KIND)
            stale = [_part_key(key, i) for i in range(len(item_texts), old + 1)]
            if stale:
                deletes.setdefault(name, []).extend(stale)
        if not self._expiring and any(op.ttl is not None and op.value is not None for op in puts.values()):
            # The first TTL in this store: leave the marker that tells later opens to check expiry.
            texts.append("langgraph TTL marker")
            vecs.append(self._placeholder)
            names.append(MARKER_NAMESPACE)
            metas.append({})
            keys.append(MARKER_KEY)
            kinds.append(META_KIND)
        if texts:
            self._store.add_many(texts, embeddings=np.asarray(vecs, np.float32), kinds=kinds, namespaces=names,
                                 metadata=metas, keys=keys)
            for name in set(names):
                self._note_namespace(name)
            self._expiring = self._expiring or MARKER_NAMESPACE in names
        for name, ks in deletes.items():
            self._store.delete_many(keys=ks, namespace=name)


# -- filters ---------------------------------------------------------------------------
def check_filter(filt: dict) -> None:
    """Raise ValueError naming an unsupported operator anywhere in ``filt``."""
    for field, cond in filt.items():
        if isinstance(cond, dict):
            ops = [k for k in cond if k.startswith("$")]
            for k in ops:
                if k not in OPERATORS:
                    raise ValueError(f"Unsupported operator {k!r} in the filter on {field!r} "
                                     f"(supported: {', '.join(OPERATORS)})")
            if not ops:
                check_filter(cond)


def matches(value: dict, filt: dict) -> bool:
    """Whether an item's value passes a LangGraph filter (``InMemoryStore``'s semantics)."""
    return all(_compare(value.get(k), v) for k, v in filt.items())


def _compare(item_value: Any, filter_value: Any) -> bool:
    if isinstance(filter_value, dict):
        if any(k.startswith("$") for k in filter_value):
            return all(_operator(item_value, k, v) for k, v in filter_value.items())
        return isinstance(item_value, dict) and all(_compare(item_value.get(k), v) for k, v in filter_value.items())
    if isinstance(filter_value, (list, tuple)):
        return (isinstance(item_value, (list, tuple)) and len(item_value) == len(filter_value)
                and all(_compare(a, b) for a, b in zip(item_value, filter_value)))
    return item_value == filter_value


def _operator(value: Any, op: str, target: Any) -> bool:
    if op == "$eq":
        return value == target
    if op == "$ne":
        return value != target
    a, b = _number(value), _number(target)
    if a is None or b is None:
        return False
    return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]


def _number(x: Any) -> float | None:
    # InMemoryStore compares float(x): numbers, bools and numeric strings. A value that has
    # no float (missing field, text) raises there; here it does not match.
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _pushdown(filt: dict) -> list[dict]:
    """The filter's conditions the store can apply before top-k with the same result:
    equality with a string (Python == and the store agree on strings)."""
    out = []
    for field, cond in filt.items():
        if field.startswith(RESERVED_PREFIX):
            continue
        if isinstance(cond, str):
            out.append({field: cond})
        elif isinstance(cond, dict) and isinstance(cond.get("$eq"), str):
            out.append({field: cond["$eq"]})
    return out


def _and(conds: list[dict]) -> dict | None:
    if not conds:
        return None
    return conds[0] if len(conds) == 1 else {"$and": conds}


# -- mapping ---------------------------------------------------------------------------
def _ns_name(ns: tuple[str, ...]) -> str:
    return ".".join(ns)


def _ns_tuple(name: str) -> tuple[str, ...]:
    ns = _NS_TUPLES.get(name)
    if ns is None:
        if len(_NS_TUPLES) > _CACHE_MAX:
            _NS_TUPLES.clear()
        ns = _NS_TUPLES[name] = tuple(name.split("."))
    return ns


def _part_key(key: str, i: int) -> str:
    return f"{key}{PART_SEP}{i}"


def _refresh_due(metadata: dict, now: float) -> bool:
    """Whether a read at ``now`` restarts an item's TTL: it has one, and 1% of it (at least a
    second) has passed since the last restart."""
    ttl = metadata.get(TTL_FIELD)
    if ttl is None:
        return False
    ttl_s = 60.0 * ttl
    return now + ttl_s - metadata[EXPIRES_FIELD] >= max(1.0, 0.01 * ttl_s)


def _check_ttl(ttl: Any) -> None:
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"ttl must be a positive number of minutes or None, got {ttl!r}")


def _value(metadata: dict | None) -> dict:
    return {k: v for k, v in (metadata or {}).items() if k not in RESERVED}


def _time(iso: str) -> datetime:
    # Items written by one batch share one timestamp, so parsed times repeat across hits;
    # datetimes are immutable and safe to share.
    t = _TIMES.get(iso)
    if t is None:
        if len(_TIMES) > _CACHE_MAX:
            _TIMES.clear()
        t = _TIMES[iso] = datetime.fromisoformat(iso)
    return t


def _times(metadata: dict) -> tuple[datetime, datetime]:
    return _time(metadata[CREATED_FIELD]), _time(metadata[UPDATED_FIELD])


# Small memo tables of the per-hit conversions (cleared when they grow past _CACHE_MAX).
_CACHE_MAX = 4096
_NS_TUPLES: dict[str, tuple[str, ...]] = {}
_TIMES: dict[str, datetime] = {}


def _item(m: Any) -> Item:
    created, updated = _times(m.metadata)
    return Item(value=_value(m.metadata), key=m.key, namespace=_ns_tuple(m.namespace),
                created_at=created, updated_at=updated)


def _search_item(m: Any, key: str, value: dict, score: float | None = None) -> SearchItem:
    created, updated = _times(m.metadata)
    return SearchItem(_ns_tuple(m.namespace), key, value, created, updated, score)


def _matches_condition(cond: MatchCondition, ns: tuple[str, ...]) -> bool:
    path = tuple(cond.path)
    if len(ns) < len(path):
        return False
    if cond.match_type == "prefix":
        pairs = zip(ns, path)
    elif cond.match_type == "suffix":
        pairs = zip(reversed(ns), reversed(path))
    else:
        raise ValueError(f"Unsupported match type: {cond.match_type!r}")
    return all(p == "*" or k == p for k, p in pairs)


__all__ = ["ClagStore", "check_filter", "matches"]
