"""Import: records from an export (or an importer's source) written into a store, resumably.

Identity, so a re-run (after a kill, a fixed line, anything) never stores a record twice. An
export names the store it came from (its header's ``store_id``, the same in every export of
that store):

* An export imported into a store that held no memory when the first import from its store
  began keeps its memory ids (the round trip is exact: ids, keys, times, vectors, clusters). A
  record whose id is stored already is skipped; one whose id holds another memory (another
  namespace or key: the store was written between two runs) stops the import, naming it.
* Otherwise memories get new ids and a record is known by (namespace, key). A record without
  a key gets a derived one, stable across runs: ``import:<store id>:<its id>`` for an
  export's record, ``import:<digest of namespace, kind, text and metadata>`` for others (so
  identical keyless records are stored once). A key already in its namespace is skipped.

What the first run decided (ids kept or not, which store cluster each exported cluster became)
is kept in the store's meta table under ``import:<store id>``, so later runs decide the same.

Clusters (``clusters="keep"``, the default): each exported cluster becomes a cluster of the
store with its profile (summary, tags, source, times), created in ascending exported id before
any memory, under its exported id where the index can still give it (a fresh store: the round
trip keeps cluster ids; ids are never reused, so in a store that had clusters the imported
ones get new ids). Imported clusters sit beside the store's own (near duplicates merge at the
next ``organize()``). Members keep their exported soft assignment (pairs of clusters the
export did not carry are dropped); an anchored cluster (SLM topic, template label) is anchored
at its exported centre. ``clusters="route"``, and live records without clusters, are routed by
their vector as ``add_many`` routes.

Write order per batch (as ``MemoryStore.add_many``): vectors appended (durable), their
cluster memberships and assignment records written, and only then one SQLite transaction
with the memories; the index state is saved every ``CHECKPOINT_ROWS`` rows. A kill at any
point leaves every committed record whole: the next open places the rows the saved index
state does not cover from their assignment records, so they keep their exported clusters.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from clag_fast.errors import DimensionMismatchError, MalformedRecordError
from clag_fast.store import catalog as catalog_mod
from clag_fast.store import placement, routing, threads
from clag_fast.store.catalog import join
from clag_fast.store.lexical import LexicalIndex
from clag_fast.store.state import CHECKPOINT_ROWS, StoreState
from clag_fast.store.transfer import fields as record
from clag_fast.store.transfer.fields import (ANCHOR, ANCHORED, CLUSTER_FIELDS, Batch, Checked, check,
                                              decode_vector, no_gc)

log = logging.getLogger(__name__)

#: Meta key prefix of an import's decisions (``import:<store id>``).
META_PREFIX = "import:"


@dataclass
class Source:
    """What a reader hands the importer: the export's header (None for records that are not
    an export), its cluster records, the batches of memory records, and how many records to
    expect (None: unknown)."""

    header: dict[str, Any] | None
    clusters: list[dict[str, Any]]
    batches: Iterator[Batch]
    total: int | None = None


class Import:
    """One run of an import into an open store (see the module docstring). ``embed``: texts
    -> vectors for records without one (None: such a record stops the import); ``fix_width``:
    called under the write lock with the vectors' width before the first write (a store whose
    width is pending takes it, others check it); ``width``: the store's width (None: pending);
    ``after_batch``: called after each committed batch (organisation bookkeeping)."""

    def __init__(self, state: StoreState, lexical: LexicalIndex, *, width: int | None,
                 fix_width: Callable[[int], None], embed: Callable[[list[str]], np.ndarray] | None,
                 after_batch: Callable[[], None] | None = None, clusters: str = "keep",
                 namespace: str | None = None, progress: Callable[[int, int | None], None] | None = None) -> None:
        if clusters not in ("keep", "route"):
            raise ValueError(f"clusters must be 'keep' or 'route', got {clusters!r}")
        if namespace is not None and (not isinstance(namespace, str) or not namespace):
            raise ValueError(f"namespace must be a non-empty string, got {namespace!r}")
        self.state, self.lexical = state, lexical
        self.width, self.fix_width, self.embed = width, fix_width, embed
        self.after_batch, self.clusters, self.namespace, self.progress = after_batch, clusters, namespace, progress
        self.report = {"read": 0, "imported": 0, "skipped": 0, "clusters": 0, "seconds": 0.0}
        self.source_id: str | None = None
        self.keep_ids = False
        self.cluster_map: dict[int, int] = {}
        self.cluster_records: dict[int, dict[str, Any]] = {}
        # Cluster ids skipped to give imported clusters their exported ids, at most this many
        # per run (an id far beyond any real store's is not chased).
        self._burn_left = 10_000_000

    # -- the run --------------------------------------------------------------------------
    def run(self, source: Source) -> dict[str, Any]:
        with no_gc():
            return self._run(source)

    def _run(self, source: Source) -> dict[str, Any]:
        t0 = time.perf_counter()
        self._begin(source)
        header_dim = source.header.get("dim") if source.header is not None else None
        seen = {"width": self.width if self.width is not None else header_dim}

        def read_and_check() -> Iterator[tuple[Batch, Checked, int | None, tuple[int, str] | None]]:
            for batch in source.batches:
                got, width, cut = check(batch, seen["width"])
                if width is not None:
                    seen["width"] = width
                yield batch, got, width, cut

        for batch, checked, width, cut in prefetched(read_and_check()):
            missing = np.flatnonzero(~checked.has_vector)
            if self.embed is None and len(missing):
                m = int(missing[0])
                checked = checked.take(np.arange(m))
                cut = (m, "the record has no vector and the store has no embedder (open it with one, or give "
                          "every record a vector)")
            if width is not None and checked.n:
                self._settle_width(width)
            conflict = self._write(checked, batch)
            if conflict is not None and (cut is None or conflict[0] < cut[0]):
                cut = conflict
            self.report["read"] += checked.n if conflict is None else conflict[0]
            if self.progress is not None:
                self.progress(self.report["read"], source.total)
            stop = None
            if cut is not None:
                stop = (batch.position(cut[0]), cut[1])
            elif batch.error is not None:
                stop = batch.error
            if stop is not None:
                self.report["seconds"] = time.perf_counter() - t0
                raise MalformedRecordError(
                    f"{stop[0]}: {stop[1]}. The {self.report['read']} records before it are stored (this run "
                    f"imported {self.report['imported']}, skipped {self.report['skipped']} already there); nothing "
                    "from it on was written. Fix it and run the import again: stored records are skipped",
                    stop[0], self.report["imported"])
        self.report["seconds"] = round(time.perf_counter() - t0, 3)
        return self.report

    def _begin(self, source: Source) -> None:
        header = source.header
        state = self.state
        if header is not None:
            self.source_id = str(header["store_id"])
            dim = header.get("dim")
            if dim is not None and self.width is not None and int(dim) != self.width:
                raise DimensionMismatchError(f"the export holds {int(dim)}-dimensional vectors, the store "
                                             f"{state.path} holds {self.width}-dimensional ones; nothing was imported")
        with state.lock.write():
            decided = self._decisions()
            if decided is None:
                decided = {"ids": "kept" if header is not None and state.catalog.memory_count() == 0 else "new",
                           "clusters": {}}
                self._save_decisions(decided)
            self.keep_ids = decided["ids"] == "kept"
            self.cluster_map = {int(k): int(v) for k, v in decided["clusters"].items()}
        if self.clusters == "keep" and source.clusters:
            self.cluster_records = {int(c["id"]): c for c in source.clusters}
            with state.lock.write():
                self._ensure_clusters(sorted(self.cluster_records))

    def _decisions(self) -> dict[str, Any] | None:
        if self.source_id is None:
            return None
        raw = self.state.catalog.meta(META_PREFIX + self.source_id)
        return None if raw is None else json.loads(raw)

    def _save_decisions(self, decided: dict[str, Any]) -> None:
        if self.source_id is not None:
            self.state.catalog.set_meta(META_PREFIX + self.source_id, json.dumps(decided))

    def _settle_width(self, width: int) -> None:
        if self.width is None or width != self.width:
            with self.state.lock.write():
                self.fix_width(width)
            self.width = width

    # -- one batch ------------------------------------------------------------------------
    def _write(self, checked: Checked, batch: Batch) -> tuple[int, str] | None:
        """Store the batch's records that are not stored yet. Returns (index, reason) of a
        record that conflicts with a stored memory (only the records before it are written),
        or None."""
        if checked.n == 0:
            return None
        if self.namespace is not None:
            checked.namespaces = [self.namespace] * checked.n
        state = self.state
        with state.lock.write():
            fresh, keys, conflict = self._fresh(checked)
            seen = checked.n if conflict is None else conflict[0]
            self.report["skipped"] += seen - len(fresh)
        if len(fresh) == 0:
            return conflict
        if len(fresh) == checked.n:  # the usual case: nothing stored yet, no copy
            new, new.keys = checked, keys
        else:
            new = checked.take(fresh)
            new.keys = [keys[i] for i in fresh.tolist()]
        todo = np.flatnonzero(~new.has_vector)
        if len(todo):
            vecs = np.asarray(self.embed([new.texts[i] for i in todo.tolist()]), np.float32)
            if new.vectors.shape[1] == 0:
                new.vectors = np.zeros((new.n, vecs.shape[1]), np.float32)
            new.vectors[todo] = vecs
            self._settle_width(vecs.shape[1])
        with state.lock.write():
            self._store(new)
        self.report["imported"] += new.n
        if self.after_batch is not None:
            self.after_batch()
        return conflict

    def _fresh(self, c: Checked) -> tuple[np.ndarray, list[str | None], tuple[int, str] | None]:
        """(positions of the records not stored yet, first occurrence of each; the key each
        is stored under; the first record that conflicts with a stored memory, as (index,
        reason), the positions cut before it). Under the write lock."""
        catalog = self.state.catalog
        if self.keep_ids and c.ids is not None and (c.ids >= 0).all():
            ids = c.ids
            _, first = np.unique(ids, return_index=True)
            first = np.sort(first)
            stored = catalog.ids_in_range(int(ids.min()), int(ids.max()))
            there = np.isin(ids[first], stored)
            conflict = self._conflict(c, first, there)
            fresh = first[~there]
            if conflict is not None:
                fresh = fresh[fresh < conflict[0]]
            return fresh, list(c.keys), conflict
        keys = [k if k is not None else self._derived_key(c, i) for i, k in enumerate(c.keys)]
        seen: dict[tuple[str, str], int] = {}
        for i, (ns, k) in enumerate(zip(c.namespaces, keys)):
            seen.setdefault((ns, k), i)
        by_ns: dict[str, list[str]] = {}
        for ns, k in seen:
            by_ns.setdefault(ns, []).append(k)
        stored = {(ns, k) for ns, ks in by_ns.items() for k in catalog.ids_of_keys(ns, ks)}
        fresh = sorted(i for nk, i in seen.items() if nk not in stored)
        return np.asarray(fresh, np.int64), keys, None

    def _derived_key(self, c: Checked, i: int) -> str:
        if self.source_id is not None and c.ids is not None and c.ids[i] >= 0:
            return f"import:{self.source_id}:{int(c.ids[i])}"
        digest = hashlib.blake2b(json.dumps([c.namespaces[i], c.kinds[i], c.texts[i], c.metadata[i]],
                                            ensure_ascii=False).encode("utf-8"), digest_size=16).hexdigest()
        return f"import:{digest}"

    def _conflict(self, c: Checked, first: np.ndarray, there: np.ndarray) -> tuple[int, str] | None:
        """Ids kept: the first record that would clash with a stored memory: its id held by
        another memory (another namespace or key), or its key held under another id (the
        store was written between two runs of this import). None when there is none."""
        found = self.state.catalog.identities(c.ids[first[there]].tolist()) if there.any() else {}
        bad: list[tuple[int, str]] = []
        for i in first[there].tolist():
            got = found.get(int(c.ids[i]))
            if got is not None and got[:2] != (c.namespaces[i], c.keys[i]):
                bad.append((i, f"memory id {int(c.ids[i])} is stored already as another memory (namespace "
                               f"{got[0]!r}, key {got[1]!r})"))
                break
        keyed = [i for i in first[~there].tolist() if c.keys[i] is not None]
        by_ns: dict[str, list[int]] = {}
        twice: dict[tuple[str, str], int] = {}
        for i in keyed:
            by_ns.setdefault(c.namespaces[i], []).append(i)
            j = twice.setdefault((c.namespaces[i], c.keys[i]), i)
            if j != i:
                bad.append((i, f"key {c.keys[i]!r} in namespace {c.namespaces[i]!r} is also the key of memory "
                               f"{int(c.ids[j])} (records of one export have distinct keys)"))
                break
        for ns, at in by_ns.items():
            held = self.state.catalog.ids_of_keys(ns, [c.keys[i] for i in at])
            for i in at:
                if c.keys[i] in held and held[c.keys[i]][0] != int(c.ids[i]):
                    bad.append((i, f"key {c.keys[i]!r} in namespace {ns!r} is held by memory {held[c.keys[i]][0]}"))
                    break
        if not bad:
            return None
        i, why = min(bad)
        return i, (f"{why}: the store was written to between two runs of this import; import into an empty "
                   "store, or into this one after removing that memory")

    def _store(self, c: Checked) -> None:
        """Write checked, new records (under the write lock), in the module's write order.

        The memories' SQL rows are inserted on the catalog's helper thread while this thread
        appends the vectors and places them (``Catalog.aside``, as ``add_many`` does): the
        vector rows they name are known beforehand (the file only grows, under this lock),
        and the transaction commits only after both sides are done."""
        state = self.state
        idx, cfg, catalog = state.index, state.config, state.catalog
        now = time.time()
        if self.clusters == "keep" and c.cluster_ids is not None:
            # Clusters an organisation dropped since they were created (empty until now).
            self._ensure_clusters(np.unique(c.cluster_ids[c.cluster_ids >= 0]).tolist())
        first_row = len(idx)
        rows = np.arange(first_row, first_row + c.n, dtype=np.int64)
        if self.keep_ids:
            mids = c.ids
        else:
            first = catalog.next_memory_id()
            mids = np.arange(first, first + c.n, dtype=np.int64)
        columns = [f.column for f in record.FIELDS] + ["vector_row"]
        superseded = self._superseded(c)
        values = [mids.tolist() if f.name == "id" else superseded if f.name == "superseded_by" else c.column(f)
                  for f in record.FIELDS] + [rows.tolist()]
        live = ~c.archived
        ids_k, aff_k = self._local_pairs(c, cfg.soft_k)
        placed = ids_k[:, 0] >= 0
        keep = live & placed
        route = live & ~placed
        routed = None
        with catalog.transaction():
            written = catalog.aside(lambda: catalog.import_rows(columns, zip(*values)))
            try:
                if written is None:
                    catalog.import_rows(columns, zip(*values))
                got = idx.append(c.vectors)  # durable before the transaction that references it commits
                if len(got) and int(got[0]) != first_row:
                    raise RuntimeError(f"the vector file grew under the import (row {int(got[0])}, not {first_row})")
                if keep.any():
                    idx.assign(rows[keep], routing.memberships(ids_k[keep], aff_k[keep], cfg.soft_k, cfg.spill_margin))
                if not live.all():
                    idx.unassign(rows[~live])  # archived: out of every cluster, not pending for search either
                state.assignments.write(rows, ids_k, aff_k)  # archived records keep their pairs, as get() shows them
                if route.any() and len(idx.cluster_ids()):
                    routed = placement.route_new_rows(state, rows[route], c.vectors[route])
            finally:
                if written is not None:
                    join(written)  # the connection is this thread's again, whatever happened
            if written is not None:
                written.result()  # a failed insert raises here: the transaction rolls back
            if routed is not None:
                texts = [t for t, r in zip(c.texts, route.tolist()) if r]
                placement.record_placement(state, rows[route], texts, routed, now)
        # As add_many: the index state is saved (rows synced first) and the database
        # checkpointed every so many rows, or every batch with ``fsync``. A kill before that
        # loses nothing: the next open places these rows from their assignment records
        # (``recovery.place_from_records``), which hold the exported clusters.
        state.rows_since_checkpoint += c.n
        if cfg.fsync:
            state.flush_index()
        elif state.rows_since_checkpoint > CHECKPOINT_ROWS:
            state.flush_index(durable=False)
        r = state.rows
        before = r.version
        r.set_rows(rows, mids, c.namespaces, c.kinds, c.created_at, last_accessed=c.last_accessed,
                   access_count=c.access_count.astype(np.float64), strength=c.strength, live=live)
        self._set_conversation(c, rows, mids, superseded)
        state.fields.set(rows, c.metadata)
        if live.all():
            self.lexical.add(rows, c.texts, c.namespaces)
        elif live.any():
            at = np.flatnonzero(live)
            self.lexical.add(rows[at], [c.texts[i] for i in at.tolist()], [c.namespaces[i] for i in at.tolist()])
        self.lexical.mark_synced(before, r.version)
        state.cache.clear()

    def _superseded(self, c: Checked) -> list[int | None]:
        """The records' ``superseded_by`` as stored: the ids they name where the import keeps
        ids, else none (new ids would leave them naming other memories)."""
        value = c.values.get("superseded_by")
        if value is None or not self.keep_ids:
            return [None] * c.n
        return [None if x < 0 else x for x in np.asarray(value).tolist()]

    def _set_conversation(self, c: Checked, rows: np.ndarray, mids: np.ndarray, superseded: list[int | None]) -> None:
        """The row table's conversation columns of the imported rows, linked into their threads."""
        r = self.state.rows
        threads_col = c.values.get("thread") or [None] * c.n
        turns = c.values.get("turn")
        orders = mids.astype(np.float64)
        if turns is not None:
            turns = np.asarray(turns, np.float64)
            orders = np.where(np.isnan(turns), orders, turns)
        words, asks = catalog_mod.text_shapes(c.texts)
        groups = [threads.group_key(ns, t) for ns, t in zip(c.namespaces, threads_col)]
        by = np.asarray([-1 if s is None else s for s in superseded], np.int64)
        r.set_conversation(rows, groups, orders, c.values.get("speaker"), words, asks, by, link=False)
        threads.link_new(r, rows)

    # -- clusters -------------------------------------------------------------------------
    def _ensure_clusters(self, exported: list[int]) -> None:
        """Under the write lock: a store cluster for each of the ``exported`` cluster ids that
        the export carries and that has none (never created, or dropped or lost since: an
        organisation drops empty clusters, a kill loses an unsaved index state), created in
        ascending exported id, each under its exported id while the index can still give it
        (a fresh index: ids are never reused; the ids before it are skipped). The index state
        is saved, then the clusters' rows and the export -> store map committed."""
        idx, cfg = self.state.index, self.state.config
        have = set(idx.cluster_ids().tolist())
        created = []
        for old in exported:
            record = self.cluster_records.get(old)
            if record is None or self.cluster_map.get(old) in have:
                continue  # not carried by the export (a subset exported), or there already
            cid = idx.new_cluster()
            while cid < old and self._burn_left > 0:
                idx.drop_cluster(cid)
                self._burn_left -= 1
                cid = idx.new_cluster()
            anchor = record.get(ANCHOR)
            if anchor is not None and record.get("source") in ANCHORED and self.width is not None:
                weight = max(cfg.topic_weight, 1.0) if record.get("source") == "template" else cfg.topic_weight
                idx.set_centre(cid, decode_vector(anchor, self.width), weight)
            self.cluster_map[old] = cid
            created.append((old, cid))
        if created:
            self.state.flush_index(durable=False)
            with self.state.catalog.transaction():
                self._record_clusters(created)

    def _record_clusters(self, created: list[tuple[int, int]]) -> None:
        """Inside the batch's transaction: the clusters' rows and the export -> store map."""
        state = self.state
        now = time.time()
        rows = []
        for old, cid in created:
            rec = self.cluster_records[old]
            tags = rec.get("tags") or []
            rows.append((cid, str(rec.get("summary") or ""), json.dumps(list(tags)), str(rec.get("source") or "import"),
                         float(rec.get("created_at") or now), float(rec.get("updated_at") or now),
                         int(rec.get("profiled_size") or 0), rec.get("last_hit_at")))
            state.profiles[cid] = (rows[-1][1], list(tags))
        state.catalog.import_clusters(CLUSTER_FIELDS, rows)
        self._save_decisions({"ids": "kept" if self.keep_ids else "new",
                              "clusters": {str(k): v for k, v in self.cluster_map.items()}})
        self.report["clusters"] += len(created)

    def _local_pairs(self, c: Checked, soft_k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each record's exported pairs in store cluster ids, best first, ``soft_k`` wide
        (-1 padding); pairs of clusters the store did not take are dropped."""
        n = c.n
        ids = np.full((n, soft_k), -1, np.int64)
        aff = np.zeros((n, soft_k), np.float32)
        if self.clusters != "keep" or c.cluster_ids is None:
            return ids, aff
        have = set(self.state.index.cluster_ids().tolist())
        # The export -> store map as two sorted arrays: each column mapped by one search.
        pairs = sorted((old, new) for old, new in self.cluster_map.items() if new in have)
        if not pairs:
            return ids, aff
        old_ids = np.asarray([p[0] for p in pairs], np.int64)
        new_ids = np.asarray([p[1] for p in pairs], np.int64)
        src_ids, src_aff = c.cluster_ids, c.affinities
        for j in range(src_ids.shape[1]):
            col = src_ids[:, j]
            at = np.minimum(np.searchsorted(old_ids, col), len(old_ids) - 1)
            mapped = np.where((col >= 0) & (old_ids[at] == col), new_ids[at], -1)
            # Left-pack: each record's next free column takes this pair.
            free = (ids >= 0).sum(axis=1)
            rows = np.flatnonzero((mapped >= 0) & (free < soft_k))
            ids[rows, free[rows]] = mapped[rows]
            aff[rows, free[rows]] = src_aff[rows, j]
        return ids, aff


def prefetched(items: Iterator[Any]) -> Iterator[Any]:
    """``items``, produced one ahead on a thread of their own: the next batch is read and
    checked (Python, under the GIL) while this one is written (the vector file, the index,
    SQLite: native code without the GIL). An error producing an item is raised here, where
    that item would have come; stopping early stops the thread before returning."""
    out: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    end = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((end, None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            put((end, e))

    worker = threading.Thread(target=produce, name="clag-fast-import-read", daemon=True)
    worker.start()
    try:
        while True:
            item, error = out.get()
            if item is end:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        worker.join()


def records_source(records: Iterable[dict[str, Any]], batch_size: int, what: str = "item",
                   total: int | None = None) -> Source:
    """A ``Source`` over dict records (an importer's), ``batch_size`` at a time; positions
    read "item N" (from 1)."""
    from clag_fast.store.transfer.fields import batch_from_dicts

    def batches() -> Iterator[Batch]:
        buf: list[dict[str, Any]] = []
        start = 0
        for rec in records:
            buf.append(rec)
            if len(buf) >= batch_size:
                yield batch_from_dicts(buf, _positions(what, start))
                start += len(buf)
                buf = []
        if buf:
            yield batch_from_dicts(buf, _positions(what, start))

    return Source(None, [], batches(), total)


def _positions(what: str, start: int) -> Callable[[int], str]:
    return lambda i: f"{what} {start + i + 1}"
