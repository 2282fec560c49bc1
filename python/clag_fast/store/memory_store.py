"""MemoryStore: the public API joining the native index, the embedder and the SLM organiser.

One directory holds a store:
  memories.db   SQLite (WAL): texts, metadata, cluster profiles, links
  index/        the native VectorIndex (memory-mapped vectors + cluster state), the soft
                assignment records (assignments.bin) and the lexical index
  LOCK          the writer's lock file

Write order (why a crash never loses a returned add): the vector row is appended first, then
the SQLite transaction that references it commits, then ``add`` returns. A crash between the
two leaves an unreferenced vector row, which is ignored. Cluster state is saved at explicit
organisations, at a periodic one once ``organize.SAVE_ROWS`` rows were added since the last
save, at flushes and close; on open ``recovery.reconcile`` re-routes whatever the last saved
cluster state does not cover, so SQLite and the index always agree after a restart.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from clag_fast._deprecated import STATS_RENAMES, RenamedKeys, renamed_kwargs
from clag_fast.arguments import batch_namespaces
from clag_fast.config import StoreConfig
from clag_fast.errors import DimensionMismatchError, StoreFormatError
from clag_fast.index import VectorIndex
from clag_fast.results import ClusterInfo, ClusterPage, Hit, Hits, Memory, MemoryPage
from clag_fast.store.slm_scheduler import SLMScheduler
from clag_fast.store import catalog as catalog_mod
from clag_fast.store import conversation, dimension, filters, forgetting, organize, placement, recovery, topics
from clag_fast.store import threads as threads_mod
from clag_fast.store.catalog import Catalog
from clag_fast.store.fields import FieldTable
from clag_fast.store.rowtable import RowTable
from clag_fast.store.search import Searcher, check_finite_query
from clag_fast.store.locks import WriterLock
from clag_fast.store.recovery import DB_NAME, INDEX_DIR
from clag_fast.store.assignments import Assignments
from clag_fast.store.state import ASSIGNMENTS, CHECKPOINT_ROWS, StoreState

log = logging.getLogger(__name__)

_F32 = np.dtype(np.float32)  # numpy's float32 descriptor is a singleton: `is` compares it

#: Longest key ``add(key=...)`` accepts, in characters.
MAX_KEY_CHARS = 512
# Database meta key: vectors were given to this store without the embedder that made them.
FOREIGN_META = "foreign_vectors"

# Batches from this size on write their SQLite rows on the catalog's writer thread while they
# are routed (``_route_while``); smaller ones stay on one thread: the overlap gains them
# nothing measurable (BENCHMARKS.md, Ingest).
OVERLAP_ROWS = 1024


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
    @renamed_kwargs(llm="slm")
    def open(
        cls,
        path: str | Path,
        *,
        config: StoreConfig | None = None,
        embedder: Any = None,
        slm: Any = None,
        read_only: bool = False,
    ) -> "MemoryStore":
        """Create or reopen the store in directory ``path``.

        config: a ``StoreConfig`` (its ``slm=SLMConfig(...)`` holds the organiser's knobs).
        embedder: None (the default ONNX MiniLM Embedder, loaded on first use), an object
          with ``encode(list[str]) -> float32[n, dim]``, or False (bring your own vectors).
        slm: the small language model that organises: None (a managed SmolLM2 llama.cpp server
          when ``config.slm.mode == "auto"`` and it is installed, started on first need), a
          server base URL, an ``LLMClient``, or False (vector-only organisation). ``llm=`` is
          its deprecated spelling.
        """
        self = object.__new__(cls)
        self._init(Path(path), config, embedder, slm, read_only)
        return self

    def _init(self, path: Path, config: StoreConfig | None, embedder: Any, slm: Any, read_only: bool) -> None:
        self.path = path
        self.read_only = read_only
        self._closed = True
        self._writer_lock: WriterLock | None = None
        self._catalog: Catalog | None = None
        self._state: StoreState | None = None
        self._slm: SLMScheduler | None = None
        _check_store_dir(path, read_only)
        db_file = path / DB_NAME
        db_was_blank = not db_file.exists() or db_file.stat().st_size == 0
        if not read_only:
            path.mkdir(parents=True, exist_ok=True)
            self._writer_lock = WriterLock(path / "LOCK")
        try:
            if db_was_blank:
                recovery.refuse_blank_database(path, True)
            self._catalog = Catalog(db_file, read_only=read_only)
            recovery.refuse_blank_database(path, self._catalog.meta("dim") is None)
            self.config, self._dim, self._dim_pending = dimension.settle(
                self._catalog, path, config, embedder, _embedder_name(embedder), read_only)
            self._query_shape = (self._dim,)
            self._settle_embedder_name(embedder)
            index = recovery.open_index(path, self._dim, read_only,
                                        rows_needed=self._catalog.max_vector_row() + 1)
            self._state = StoreState(path, self.config, read_only, self._catalog, index)
            self._embedder_arg = embedder
            if self._dim_pending and not read_only and (wanted := dimension.wanted_width(config, embedder)):
                self._fix_width(wanted)
            self._embedder = embedder if embedder not in (None, False) else None
            self._embed_precision = self._settle_precision() if embedder is None else None
            lexical = recovery.LexicalPreload(recovery.lexical_path(path))
            self._load_rows()
            self._searcher = Searcher(self._state, recovery.open_lexical(self._state, lexical))
            # Vectors the caller gave while the store's embedder was the default one may come
            # from another model: then nothing is embedded to be compared with them.
            self._foreign = self._catalog.meta(FOREIGN_META) is not None
            self._slm = SLMScheduler(self._state, slm, lambda texts: self._vectors(texts, None), self._same_space)
            self._closed = False
            with self._state.lock.write():
                recovery.adopt_legacy_assignments(self._state)
                if not read_only:
                    recovery.rebuild_clusters(self._state)
                    recovery.reconcile(self._state)
        except BaseException:
            self._release()
            raise
        # The int8 member copies that stage 2 scans are built by the first search probing each
        # cluster: a first-query tail (p99 5.7x p50 over the first 300 queries at 200k). One
        # background thread builds them now, leaving the other core to the caller.
        threading.Thread(target=_warm, args=(self._state.index,), name="clag-fast-warm", daemon=True).start()

    def _fix_width(self, width: int) -> None:
        """Under the write lock (or at open): vectors of ``width`` are about to be written. A
        store whose width is pending takes it (``store.dimension``); any other store refuses
        another width, naming both."""
        if not self._dim_pending:
            if width != self._dim:
                raise DimensionMismatchError(f"store {self.path} holds {self._dim}-dimensional vectors, "
                                             f"got {width}-dimensional ones")
            return
        dimension.fix(self._state, int(width))
        self.config = self._state.config
        self._dim, self._query_shape, self._dim_pending = int(width), (int(width),), False
        if self._embedder_arg is None and width != dimension.PROVISIONAL_DIM:
            # Vectors of another model, brought to a store opened with the default embedder:
            # the store records brought vectors, and any embedder of this width may open it.
            self._catalog.set_meta("embedder", _embedder_name(False))

    def _settle_embedder_name(self, embedder: Any) -> None:
        """Record the embedder's name at creation; refuse another embedder after.

        ``embedder=False`` (vectors brought by the caller) opens any store, and a store created
        with it ("none") accepts any embedder: the store cannot know where brought vectors came
        from. Stores created before names were recorded record the first one that opens them
        while empty, and check nothing otherwise."""
        name = _embedder_name(embedder)
        stored = self._catalog.meta("embedder")
        if stored is None:
            if not self.read_only and self._catalog.max_vector_row() < 0:
                self._catalog.set_meta("embedder", name)
            return
        if embedder is False or stored == "none" or stored == name:
            return
        raise DimensionMismatchError(
            f"store {self.path} was created with the embedder {stored!r}, opened with {name!r}: "
            "their vectors are not comparable (pass the same embedder, or embedder=False with "
            "your own vectors)")

    def _same_space(self) -> bool:
        """Whether the store's embedder puts texts in the space of its vectors: there is one,
        and it is the one the caller gave, or every vector came from it (the default MiniLM
        with no vectors given). Label phrases, topics and label checks are embedded only then."""
        return self._embedder_arg is not False and (self._embedder_arg is not None or not self._foreign)

    def _lexical_gc(self) -> None:
        """After rows died (deletes, updates, archives): take them out of the term statistics,
        and drop their postings once dead rows outnumber live ones."""
        rows = self._state.rows
        live = rows.live[: rows.n]
        lexical = self._searcher.lexical
        lexical.sync(live, rows.version)
        n_live = int(live.sum())
        if rows.n - n_live > max(n_live, 10_000):
            lexical.compact(live)

    def _settle_precision(self) -> str:
        """The default embedder's precision, fixed for the life of the store.

        ``Embedder()`` picks int8 or fp32 by CPU, so without this a store created on one
        machine would mix int8 and fp32 vectors after moving to another (or after the
        default changed). Stores written before the key existed hold fp32 vectors.
        """
        stored = self._catalog.meta("embed_precision")
        if stored is not None:
            return stored
        if len(self._state.index) > 0:
            precision = "fp32"
        else:
            from clag_fast.embed.embedder import resolve_precision

            precision = resolve_precision()
        if not self.read_only:
            self._catalog.set_meta("embed_precision", precision)
        return precision

    def _load_rows(self) -> None:
        state = self._state
        n_vectors = len(state.index)
        state.rows.ensure(n_vectors)
        data = self._catalog.row_columns()
        if len(data):
            rows_a = data["vector_row"]
            if rows_a.max() >= n_vectors:
                raise StoreFormatError(
                    f"{self.path}: the database references vector row {int(rows_a.max())} but the "
                    f"vector file holds {n_vectors} rows (vector file truncated or replaced)"
                )
            state.rows.set_rows(
                rows_a,
                data["id"],
                data["namespace"],
                data["kind"],
                data["created_at"],
                last_accessed=data["last_accessed"],
                access_count=data["access_count"],
                strength=data["strength"],
                live=data["state"] == catalog_mod.LIVE,
            )
            turns = data["turn"]
            state.rows.set_conversation(
                rows_a,
                [threads_mod.group_key(ns, th) for ns, th in zip(data["namespace"].tolist(), data["thread"].tolist())],
                np.where(np.isnan(turns), data["id"], turns),
                data["speaker"].tolist(),
                data["words"],
                data["asks"].astype(bool),
                data["superseded_by"],
                link=False,
            )
            threads_mod.link_all(state.rows)
        state.profiles = self._catalog.profiles()

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
        if self._state is not None:
            self._state.close_index()
        if self._catalog is not None:
            self._catalog.close()
        if self._writer_lock is not None:
            self._writer_lock.release()

    def __enter__(self) -> "MemoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._state)} memories"
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
        key: str | None = None,
        kind: str = "user_input",
        namespace: str = "default",
        metadata: dict[str, Any] | None = None,
        embedding: np.ndarray | None = None,
        thread: str | None = None,
        turn: float | None = None,
        speaker: str | None = None,
        supersedes: int | None = None,
    ) -> int:
        """Store one memory and return its id. With a ``key`` already in ``namespace``, replace
        that memory instead (same id). ``thread``, ``turn``, ``speaker`` and ``supersedes``:
        its place in a conversation and the older memory it updates (see ``add_many``)."""
        _check_keys([key], 1, single=True)
        emb = None if embedding is None else np.asarray(embedding)[None, ...]
        return self.add_many([text], embeddings=emb, kinds=[kind], namespaces=[namespace],
                             metadata=[metadata], keys=[key], thread=thread,
                             turns=None if turn is None else [turn], speaker=speaker,
                             supersedes=None if supersedes is None else [supersedes])[0]

    def add_many(
        self,
        texts: Sequence[str],
        embeddings: np.ndarray | None = None,
        kinds: Sequence[str] | str | None = None,
        namespaces: Sequence[str] | str | None = None,
        metadata: Sequence[dict[str, Any] | None] | None = None,
        *,
        keys: Sequence[str | None] | None = None,
        defer_organize: bool = False,
        namespace: str | None = None,
        thread: str | None = None,
        threads: Sequence[str | None] | None = None,
        turns: Sequence[float | None] | None = None,
        speaker: str | None = None,
        speakers: Sequence[str | None] | None = None,
        supersedes: Sequence[int | None] | None = None,
    ) -> list[int]:
        """Store memories (embedding them unless ``embeddings`` is given) and return their ids.

        ``namespace``: one namespace for the whole batch (as ``add`` spells it);
        ``namespaces``: one per item (or one string for all). Giving both is a ValueError.

        Conversation structure (all optional): ``thread`` (the whole batch) or ``threads``
        (per memory) names the conversation or session a memory belongs to within its
        namespace (None: the namespace's own thread); ``turns`` orders memories within their
        thread (None: insertion order; give turns for all of a thread's memories or for none);
        ``speaker``/``speakers`` say who said it. Text search uses them: a turn that asks a
        question passes score to the turns after it, a question naming a speaker favours that
        speaker's memories, and ``search(..., context=n)`` returns a hit's adjacent turns.
        ``supersedes``: per memory the id of an older memory of its namespace that it updates
        (a changed fact): searches then rank the newer one first and mark the older hit with
        ``superseded_by`` (``search(..., as_of=t)`` answers as of a time).

        ``keys``: an optional user-chosen key per memory (None = no key), unique within its
        namespace. A key already present in the namespace is an upsert: that memory's text,
        kind, metadata and vector are replaced, it is re-routed (and made live again if it was
        archived), and it keeps its id, which is the id returned. When a key appears several
        times in one batch, the last occurrence wins and every occurrence returns the same id.
        Keys are non-empty strings of at most ``MAX_KEY_CHARS`` characters without NUL;
        anything else is a ValueError naming its position, and nothing is written. The
        batch is atomic: a refused batch writes nothing.

        Each memory is routed to its clusters by vectors before this returns; SLM decisions
        (ambiguous routes, profiles, re-organisation) are applied when they arrive, from a
        background worker (``SLMConfig.background``, the default). A failing SLM never fails
        an add.

        ``defer_organize`` (bulk loads): the batch is stored and routed as usual, and the cold
        start still runs when due (labelling at most ``LABELS_PER_PASS`` clusters: they are
        the first batch's, soon grown and split), but a periodic, drift or confusion
        re-organisation that falls due is put off (and recorded in the database) until
        ``organize_deferred()``, the next write without it, or an ``organize()``. A load in
        many batches then pays for one re-organisation at the end instead of one every few
        batches, and ends with every row assigned and clusters of the same sizes; fewer of
        them are labelled until later passes or an explicit ``organize()`` label the rest
        (BENCHMARKS.md, Ingest).
        """
        self._check_open(write=True)
        t0 = time.perf_counter()
        texts = _check_texts(texts)
        n = len(texts)
        kinds_l = _per_item(kinds, n, "user_input", "kinds")
        namespaces_l = _per_item(batch_namespaces(namespace, namespaces), n, "default", "namespaces")
        meta_json = _metadata_json(metadata, n)
        keys_l = _check_keys(keys, n)
        conv = conversation.check(n, thread=thread, threads=threads, turns=turns, speaker=speaker,
                                  speakers=speakers, supersedes=supersedes)
        vectors = self._vectors(texts, embeddings, remember=False, any_width=self._dim_pending)
        if n == 0:
            return []
        if self.config.labels is not None and not self._catalog.template_clusters():
            self.set_label_vectors(self._label_vectors())
        state = self._state
        with state.lock.write():
            superseded = conversation.check_superseded(self._catalog, conv, namespaces_l)
            if vectors.shape[1] != self._dim or self._dim_pending:
                self._fix_width(vectors.shape[1])
            # Label work in this write is paid for by what the write costs (``store.label_budget``).
            self._slm.labels.earn(vectors=n if embeddings is not None else 0, texts=n if embeddings is None else 0)
            if keys_l is None:
                ids = self._insert(texts, vectors, kinds_l, namespaces_l, meta_json, conv=conv,
                                   superseded=superseded)
            else:
                ids = self._upsert(texts, vectors, kinds_l, namespaces_l, meta_json, keys_l, conv, superseded)
            if embeddings is not None and not self._foreign and (self._embedder_arg is None or self._embedder_arg is False):
                # Vectors given without the embedder they came from (a store opened with its
                # own embedder trusts the caller's vectors to be that embedder's).
                self._catalog.set_meta(FOREIGN_META, "1")
                self._foreign = True
            state.count("adds", n)
            state.count("add_s", time.perf_counter() - t0)
        self._slm.after_add(defer=defer_organize)
        return ids

    def _upsert(self, texts, vectors, kinds, namespaces, meta_json, keys, conv, superseded) -> list[int]:
        """``_insert`` for a batch with keys: the last occurrence of each (namespace, key) is
        written, as a new memory or over the memory holding that key."""
        last = {(ns, k): i for i, (ns, k) in enumerate(zip(namespaces, keys)) if k is not None}
        write = [i for i, (ns, k) in enumerate(zip(namespaces, keys)) if k is None or last[(ns, k)] == i]
        by_ns: dict[str, list[str]] = {}
        for ns, k in last:
            by_ns.setdefault(ns, []).append(k)
        existing = {(ns, k): found for ns, ks in by_ns.items()
                    for k, found in self._catalog.ids_of_keys(ns, ks).items()}
        if len(write) < len(texts):
            vectors = vectors[write]
        replaces = [existing.get((namespaces[i], keys[i])) if keys[i] is not None else None for i in write]
        position = {i: j for j, i in enumerate(write)}
        ids = self._insert(_take(texts, write), vectors, _take(kinds, write), _take(namespaces, write),
                           _take(meta_json, write), _take(keys, write), replaces, conv.take(write),
                           {position[i]: row for i, row in superseded.items() if i in position})
        id_of = dict(zip(write, ids))
        return [id_of[i] if k is None else id_of[last[(ns, k)]] for i, (ns, k) in enumerate(zip(namespaces, keys))]

    def _insert(self, texts, vectors, kinds, namespaces, meta_json, keys=None, replaces=None,
                conv: conversation.Conversation = conversation.NONE, superseded: dict[int, int] | None = None) -> list[int]:
        """Write a batch: vectors first (durable), then one SQLite transaction, then the
        in-memory state. ``replaces[i]``: (memory id, old vector row, state) of the memory
        that item ``i`` replaces (an upsert by key), or None for a new memory. ``conv``: the
        batch's conversation arguments; ``superseded``: item -> row of the memory it updates."""
        state = self._state
        now = time.time()
        rows = state.index.append(vectors)  # validated + durable before SQLite references it
        fresh = [i for i in range(len(texts)) if not replaces or replaces[i] is None]
        first = self._catalog.next_memory_id()
        ids = [0] * len(texts)
        for j, i in enumerate(fresh):
            ids[i] = first + j
        old = [i for i in range(len(texts)) if replaces and replaces[i] is not None]
        for i in old:
            ids[i] = replaces[i][0]

        def write_rows() -> None:
            if len(fresh) == len(texts):  # ids are first, first + 1, ...: say so with a range
                self._catalog.insert_memories(range(first, first + len(texts)), texts, kinds, namespaces,
                                              meta_json, now, rows, keys, conv.columns())
            else:
                self._catalog.insert_memories(_take(ids, fresh), _take(texts, fresh), _take(kinds, fresh),
                                              _take(namespaces, fresh), _take(meta_json, fresh), now,
                                              rows[fresh], _take(keys, fresh), conv.columns(fresh))
                self._catalog.replace_memories(_take(ids, old), _take(texts, old), _take(kinds, old),
                                               _take(meta_json, old), rows[old].tolist(), conv.columns(old))
            if superseded:
                self._catalog.set_superseded([(int(state.rows.memory_id[row]), ids[i]) for i, row in superseded.items()])

        with self._catalog.transaction():
            placed = self._route_while(write_rows, rows)
            placement.record_placement(state, rows, texts, placed, now, self._slm.labels)
        self._searcher.lexical.add(rows, texts, namespaces)  # after the commit; replayed from SQLite on open
        r = state.rows
        r.settle_access()  # the replaced memories' counts are read below
        before = r.version
        created = np.full(len(ids), now)
        counts = np.zeros(len(ids))
        last_accessed = np.full(len(ids), np.nan)
        old_rows = np.asarray([replaces[i][1] for i in old], np.int64)
        if len(old):
            # A replaced memory keeps its age and its use; its old row dies.
            created[old] = r.created_at[old_rows]
            counts[old] = r.access_count[old_rows]
            last_accessed[old] = r.last_accessed[old_rows]
        r.set_rows(rows, np.asarray(ids, np.int64), namespaces, kinds, created,
                   last_accessed=last_accessed, access_count=counts)
        self._set_conversation(rows, ids, texts, namespaces, conv, old, old_rows)
        if superseded:
            at = np.fromiter(superseded.values(), np.int64, len(superseded))
            r.superseded_by[at] = [ids[i] for i in superseded]
            r.successor_rows.update((ids[i], int(rows[i])) for i in superseded)
            r.touch(at)
        state.fields.set(rows, meta_json)
        if len(old):
            r.carry_access(old_rows, rows[old])
            state.index.unassign(old_rows[r.live[old_rows]])
            r.kill(old_rows)
            r.memory_id[old_rows] = -1
            self._lexical_gc()
        else:
            self._searcher.lexical.mark_synced(before, r.version)  # only rows added, all counted
        state.cache.clear()
        self._slm.note_routes(ids, rows, texts, placed)
        state.rows_since_checkpoint += len(ids)
        if self.config.fsync:
            state.flush_index()
        elif state.rows_since_checkpoint > CHECKPOINT_ROWS:
            state.flush_index(durable=False)
        return ids

    def _set_conversation(self, rows: np.ndarray, ids: list[int], texts: list[str], namespaces: list[str],
                          conv: conversation.Conversation, old: list[int], old_rows: np.ndarray) -> None:
        """The row table's conversation columns of a written batch, linked into their threads:
        new memories join their threads; a replaced memory's new row takes its old row's place
        (keeping its thread, turn and speaker where the batch gives none)."""
        r = self._state.rows
        n = len(ids)
        orders = np.asarray(ids, np.float64)
        if conv.turns is not None:
            given = [i for i, t in enumerate(conv.turns) if t is not None]
            orders[given] = [conv.turns[i] for i in given]
        words, asks = catalog_mod.text_shapes(texts)
        if conv.threads is None and not old and len(set(namespaces)) == 1:
            # The usual add (one namespace, no threads, nothing replaced): C-level passes only,
            # as this runs for every add, at 10k-row batches too.
            r.set_conversation(rows, threads_mod.group_key(namespaces[0], None), orders, conv.speakers, words,
                               asks, link=False)
            threads_mod.link_new(r, rows)
            return
        threads_l = conv.threads or [None] * n
        speakers_l = conv.speakers or [None] * n
        groups = [threads_mod.group_key(ns, th) for ns, th in zip(namespaces, threads_l)]
        speaker_names = r.names("speaker")
        carried = np.full(n, -1, np.int64)
        for j, i in enumerate(old):  # a replaced memory keeps what the batch does not give
            o = int(old_rows[j])
            if threads_l[i] is None and r.group[o] >= 0:
                groups[i] = r.names("group")[int(r.group[o])]
            if conv.turns is None or conv.turns[i] is None:
                orders[i] = r.order[o]
            if speakers_l[i] is None and r.speaker[o] >= 0:
                speakers_l = list(speakers_l)
                speakers_l[i] = speaker_names[int(r.speaker[o])]
            carried[i] = r.superseded_by[o]
        fresh = np.ones(n, bool)
        fresh[old] = False
        r.set_conversation(rows, groups, orders, speakers_l, words, asks, carried, link=False)
        threads_mod.link_new(r, rows[fresh])
        if len(old):
            threads_mod.take_place(r, old_rows, rows[old])

    def _route_while(self, write_rows: Callable[[], None], rows: np.ndarray) -> "placement.Placement":
        """Route fresh ``rows`` while ``write_rows`` (their SQLite rows, inside the caller's
        transaction) runs. From ``OVERLAP_ROWS`` rows on, the write runs on the catalog's
        writer thread meanwhile: both sides spend most of their time without the GIL
        (``sqlite3_step``, the native soft assignment), and routing touches no SQL
        (measured: BENCHMARKS.md, Ingest)."""
        state = self._state
        vectors = state.index.vectors()[rows]
        written = None
        try:
            # None: a small batch, or no writer thread (closing, interpreter shutdown).
            written = self._catalog.aside(write_rows) if len(rows) >= OVERLAP_ROWS else None
            if written is None:
                write_rows()
                return placement.route_new_rows(state, rows, vectors)
            placed = placement.route_new_rows(state, rows, vectors)
        finally:
            # Whatever happened here (a routing error, Ctrl-C), the caller's transaction ends
            # only once the writer thread's statements have: the connection is the caller's again.
            if written is not None:
                catalog_mod.join(written)
        written.result()  # a failed write raises here, and the caller's transaction rolls back
        return placed

    def update(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default",
               text: str | None = None, metadata: dict[str, Any] | None = None,
               embedding: np.ndarray | None = None) -> None:
        """Change a memory's text (re-embedded and re-routed) and/or metadata. The memory is
        named by its id or by its ``key`` in ``namespace`` (KeyError when there is none)."""
        self._check_open(write=True)
        if text is None and metadata is None:
            raise ValueError("update needs text= and/or metadata=")
        vectors = None
        if text is not None:
            text = _check_texts([text])[0]
            vectors = self._vectors([text], None if embedding is None else np.asarray(embedding)[None, ...],
                                    remember=False)
        meta = None if metadata is None else _metadata_json([metadata], 1)[0]
        state = self._state
        with state.lock.write():
            memory_id = self._resolve(memory_id, key, namespace)
            old_row = self._row_of(memory_id)
            with self._catalog.transaction():
                if meta is not None:
                    self._catalog.set_metadata(memory_id, meta)
                if vectors is not None:
                    new_row = state.index.append(vectors)
                    placed = placement.route_new_rows(state, new_row, state.index.vectors()[new_row])
                    self._catalog.set_text(memory_id, text, int(new_row[0]))
                    placement.record_placement(state, new_row, [text], placed, time.time())
            if vectors is not None:
                r = state.rows
                self._searcher.lexical.add(new_row, [text], [r.name("namespace", old_row)])
                state.index.unassign(np.asarray([old_row]))
                r.settle_access()
                r.set_rows(new_row, np.asarray([memory_id]), [r.name("namespace", old_row)], [r.name("kind", old_row)],
                           r.created_at[[old_row]], last_accessed=r.last_accessed[[old_row]],
                           access_count=r.access_count[[old_row]])
                self._set_conversation(new_row, [memory_id], [text], [r.name("namespace", old_row)],
                                       conversation.NONE, [0], np.asarray([old_row]))
                r.carry_access(np.asarray([old_row]), new_row)
                r.kill(np.asarray([old_row]))
                r.memory_id[old_row] = -1
                self._lexical_gc()
            if state.fields.active:
                row = int(new_row[0]) if vectors is not None else old_row
                state.fields.set([row], [meta if meta is not None else self._catalog.metadata_of(memory_id)])
            state.cache.clear()

    def delete(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default") -> None:
        """Remove a memory (its text, metadata, assignments and links), named by its id or by
        its ``key`` in ``namespace``; KeyError when there is none."""
        self._check_open(write=True)
        with self._state.lock.write():
            memory_id = self._resolve(memory_id, key, namespace)
            row = self._row_of(memory_id, include_archived=True)
            self._state.delete_rows([memory_id], np.asarray([row]))
            self._lexical_gc()

    def delete_many(self, memory_ids: Sequence[int] | None = None, *, keys: Sequence[str] | None = None,
                    namespace: str = "default") -> int:
        """Remove the memories with these ids, or with these ``keys`` in ``namespace``, in one
        atomic step; unknown ones are ignored. Returns how many were removed."""
        self._check_open(write=True)
        if (memory_ids is None) == (keys is None):
            raise ValueError("delete_many needs memory_ids or keys (exactly one)")
        with self._state.lock.write():
            if keys is not None:
                found = self._catalog.ids_of_keys(namespace, _check_keys(keys, len(list(keys)), allow_none=False))
                pairs = sorted({(mid, row) for mid, row, _ in found.values()})
            else:
                pairs = []
                for m in dict.fromkeys(_check_id(m) for m in memory_ids):
                    at = self._catalog.row_of(m)
                    if at is not None:
                        pairs.append((m, at[0]))
            if pairs:
                self._state.delete_rows([m for m, _ in pairs], np.asarray([r for _, r in pairs], np.int64))
                self._lexical_gc()
            return len(pairs)

    def delete_namespace(self, namespace: str) -> int:
        """Remove every memory of ``namespace``; other namespaces are untouched. Returns the count."""
        self._check_open(write=True)
        with self._state.lock.write():
            data = self._catalog.namespace_rows(namespace)
            if data:
                mids, rows = zip(*data)
                self._state.delete_rows(list(mids), np.asarray(rows, np.int64))
                self._lexical_gc()
            return len(data)

    def set_label_vectors(self, vectors: np.ndarray) -> list[int]:
        """Templated-labels mode: create one cluster per ``config.labels`` entry, centred on
        the given label embeddings (the store embeds the labels itself when it has an
        embedder). Memories are then routed among these labels only."""
        self._check_open(write=True)
        labels = self.config.labels
        if labels is None:
            raise ValueError("set_label_vectors needs StoreConfig(labels=...)")
        vecs = self._vectors(list(labels), vectors, any_width=self._dim_pending)
        with self._state.lock.write():
            if vecs.shape[1] != self._dim or self._dim_pending:
                self._fix_width(vecs.shape[1])
            if self._catalog.template_clusters():
                raise ValueError("the label clusters exist already")
            return organize.create_label_clusters(self._state, list(labels), vecs)

    def _label_vectors(self) -> np.ndarray:
        if self._embedder_arg is False:
            raise ValueError("templated labels with embedder=False: call set_label_vectors(vectors) first")
        return self._vectors(list(self.config.labels), None)

    def organize(self, task_context: str | None = None, *,
                 progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
        """Re-organise now: cold-start clustering, SLM topics from ``task_context``, split
        oversized and merge redundant clusters, refresh profiles. Returns what was done.

        Vector profiles are written at once; SLM profiles for at most
        ``SLMConfig.profile_budget_s``, the rest afterwards in the background (the report's
        ``profiles_deferred``). ``progress(stage, done, total)`` is called as stages finish.
        """
        self._check_open(write=True)
        return self._slm.organize(task_context, "explicit", progress=progress)

    def organize_deferred(self) -> dict[str, Any] | None:
        """Run the re-organisation that ``add_many(defer_organize=True)`` put off, if one fell
        due: one pass on this thread, as the write that found it due would have run (every
        unassigned row assigned, oversized clusters split, redundant ones merged, at most
        ``store.slm_scheduler.LABELS_PER_PASS`` clusters labelled). Returns its report, or None
        when nothing is owed. A store reopened after a bulk load died still owes it."""
        self._check_open(write=True)
        return self._slm.run_owed()

    def forget(self, now: float | None = None) -> dict[str, Any]:
        """Apply the forgetting policy now: prune faded memories, archive stale clusters."""
        self._check_open(write=True)
        with self._state.lock.write():
            report = forgetting.forget(self._state, time.time() if now is None else now)
            self._lexical_gc()
            return report

    def flush(self) -> None:
        """Wait for background organisation, then persist everything durably."""
        self._check_open(write=True)
        self._slm.drain()
        with self._state.lock.write():
            self._state.flush_access()
            self._state.flush_index()
            self._save_lexical()

    def _save_lexical(self) -> None:
        """Save the lexical index (when it changed) after the vectors it covers are durable.
        It is derived state: a failed save is logged, and the next open replays more rows."""
        try:
            self._searcher.lexical.save(recovery.lexical_path(self.path))
        except OSError as e:
            log.warning("%s: the lexical index was not saved (%s)", self.path, e)

    # -- export and import -------------------------------------------------------------
    def export(self, out: str | Path | Any, *, format: str | None = None, namespace: str | None = None,
               cluster: int | None = None, progress: Callable[[int, int | None], None] | None = None) -> dict[str, Any]:
        """Write the store's memories (texts, keys, namespaces, kinds, metadata, times,
        access counts, strength, archived state, vectors as stored, soft cluster assignments)
        and its clusters (profiles, anchors) to ``out``: a path ending in .jsonl or .parquet
        (or ``format=``), or a file object, binary or text (JSONL). ``namespace`` / ``cluster``: only the
        memories of that namespace / whose primary cluster that is. Writes wait while it reads
        (one consistent state). Format and fields: ``clag_fast.store.transfer``; returns counts."""
        from clag_fast.store import transfer

        self._check_open()
        fmt = transfer.format_of(Path(out), format) if isinstance(out, (str, Path)) else (format or "jsonl")
        if not self.read_only:
            with self._state.lock.write():
                self._state.flush_access()  # the access counts searches made since the last flush
                source_id = transfer.store_id(self._catalog, False)
        else:
            source_id = transfer.store_id(self._catalog, True)
        with self._state.lock.read():
            return transfer.export(self._state, self._catalog.readers(), out, fmt=fmt, source_id=source_id,
                                   namespace=namespace, cluster=cluster, progress=progress)

    def import_(self, source: Any, *, format: str | None = None, namespace: str | None = None,
                clusters: str = "keep", progress: Callable[[int, int | None], None] | None = None,
                batch_size: int | None = None) -> dict[str, Any]:
        """Import records: an export (path or JSONL file object), or an iterable of record
        dicts (``clag_fast.store.transfer.from_chroma`` / ``from_mem0`` / ``from_langgraph``).
        Resumable and idempotent: a record already stored (by id for an export imported into
        an empty store, which keeps ids; by namespace and key otherwise, keyless records under
        a derived key) is skipped, so a re-run after a kill or a fixed line stores each record
        once. A malformed record raises ``MalformedRecordError`` naming its position; the
        records before it are stored, nothing from it on. ``namespace``: put every record
        there. ``clusters``: "keep" (exported clusters become the store's, with their profiles
        and members) or "route" (route by vectors as ``add_many`` does). Records without a
        vector are embedded. Returns counts (read, imported, skipped, clusters)."""
        from clag_fast.store import transfer

        self._check_open(write=True)
        src, close = transfer.open_source(source, format, batch_size or transfer.BATCH)
        embed = None if self._embedder_arg is False else (
            lambda texts: self._vectors(texts, None, remember=False, any_width=self._dim_pending))
        run = transfer.Import(self._state, self._searcher.lexical, width=None if self._dim_pending else self._dim,
                              fix_width=self._fix_width, embed=embed, after_batch=lambda: self._slm.after_add(defer=True),
                              clusters=clusters, namespace=namespace, progress=progress)
        try:
            report = run.run(src)
        finally:
            close()
            self._slm.run_owed()
            self.flush()
        return report

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
        lexical_weight: float | None = None,
        where: dict[str, Any] | None = None,
        as_of: float | None = None,
        context: int = 0,
    ) -> Hits:
        """The ``k`` memories most similar to ``query`` (a text, or a vector of ``dim``).

        two_stage: the clusters nearest the query (``n_probe`` of them; None = the store's
        automatic rule), then an exact scan of their members only (flat while the store is
        not clustered yet); flat: exact scan of every eligible memory. Filters: namespace,
        kind, created_at in [since, until), and ``where``, a metadata filter
        (``{"field": value}``, ``$eq $ne $gt $gte $lt $lte $in $nin $and $or``; grammar and
        semantics in ``clag_fast.store.filters``). Filters apply before the top k: when k
        eligible memories exist, k come back (a selective filter is searched exactly).

        A text query is hybrid: vector similarity fused with BM25 over the memories' words
        (term statistics from ``namespace`` alone), weighted by ``lexical_weight`` (None = the
        store's ``StoreConfig.lexical_weight``; 0 = vectors only). Two-stage hybrid search also
        probes the clusters whose members match the query's words. Hit scores are then fused
        scores. A vector query, or a text with no indexable word, is searched by vectors only.
        Text search also ranks by conversation structure (``StoreConfig.ranking``; see
        ``add_many``'s thread, turn, speaker and supersedes).

        as_of: answer as of this time (seconds since the epoch, or a ``datetime``): only memories
        created by then, and an update counts only if it was made by then. context: each hit
        carries its neighbouring turns, up to this many before and after it in its thread
        (``Hit.context``), outside the ``k`` hits.
        """
        self._check_open()
        t0 = time.perf_counter()
        k, n_probe = _check_search_args(k, mode, n_probe)
        if as_of is not None or context:
            until = _until_as_of(until, as_of)
            context = _check_context(context)
        lw = self.config.lexical_weight if lexical_weight is None else self._lexical_weight(lexical_weight)
        cond = None if where is None else filters.parse(where)
        state = self._state
        filt = (namespace, kind, since, until, cond)
        if not isinstance(query, str):
            # A vector query: never cached, never hybrid, no SLM cluster pick; the searcher's
            # single-vector path (search_vector) serves it. Kept short on purpose: with a cold
            # CPU cache (a search among other work) every Python call on the way costs
            # microseconds, and this is the path agent loops call most. An embedder's output
            # (float32[dim], contiguous) is taken as it is; NaN and infinity are refused by
            # the search itself.
            if (type(query) is np.ndarray and query.dtype is _F32 and query.shape == self._query_shape
                    and query.flags.c_contiguous):
                qvec = query
            elif self._dim_pending:
                return self._searched(Hits(mode=mode), t0)  # no vector yet: nothing to find
            else:
                qvec = self._query_vector(query, core_checks_finite=True)
            nested = state.lock.acquire_read()
            try:
                hits = self._searcher.search_vector(qvec, k, filt, mode, n_probe, context)
            finally:
                state.lock.release_read(nested)
            return self._searched(hits, t0)
        if not query.strip():
            raise ValueError("query text is empty")
        key = None
        if self.config.cache_size:
            key = _cache_key(query, k, namespace, kind, since, until, mode, n_probe, lw, cond, context)
            cached = state.cache.get(key)
            if cached is not None:
                state.count("cache_hits")
                return _from_cache(cached)
        qvec = self._query_vector(query)
        selected = None
        if mode == "two_stage" and self.config.slm.select_clusters:
            selected = self._slm.select_clusters(query, qvec, n_probe or self.config.n_probe or self._searcher.auto_probe())
        nested = state.lock.acquire_read()
        try:
            generation = state.cache.generation  # no write clears the cache while we read
            hits = self._searcher.search(qvec[None, :], k, filt, mode, n_probe, selected, [query], lw, context)[0]
        finally:
            state.lock.release_read(nested)
        self._searched(hits, t0)
        if key is not None:
            state.cache.put(key, hits, generation)
        return hits

    def _searched(self, hits: Hits, t0: float) -> Hits:
        """Book a finished search (latency, counters, the confusion trigger); returns ``hits``."""
        latency = hits.latency_s = time.perf_counter() - t0
        counters = self._state.counters  # StoreState.count, inlined: this runs per search
        counters["searches"] += 1
        counters["search_s"] += latency
        self._slm.after_search(hits[0].score if hits else float("-inf"))
        return hits

    def search_many(
        self,
        queries: Sequence[str] | np.ndarray,
        k: int = 5,
        *,
        namespace: str | None = None,
        kind: str | None = None,
        since: float | None = None,
        until: float | None = None,
        mode: str = "two_stage",
        n_probe: int | None = None,
        lexical_weight: float | None = None,
        where: dict[str, Any] | None = None,
        as_of: float | None = None,
        context: int = 0,
    ) -> list[Hits]:
        """``search`` for a batch of queries (texts, embedded in one call, or a (q, dim)
        array) with the same filters (``where`` included): one native call that spreads the queries over the
        cores. Returns one ``Hits`` per query, in order. Text queries are hybrid as in
        ``search`` (``lexical_weight``, ``as_of``, ``context``) and share its retrieval cache:
        a text asked before since the last write is answered from it (``cached=True``), not
        embedded again."""
        self._check_open()
        t0 = time.perf_counter()
        k, n_probe = _check_search_args(k, mode, n_probe)
        until = _until_as_of(until, as_of)
        context = _check_context(context)
        lw = self._lexical_weight(lexical_weight)
        cond = filters.parse(where)
        texts = None
        if isinstance(queries, np.ndarray):
            q = np.asarray(queries)
            if q.ndim == 2 and self._dim_pending:
                return [Hits(mode=mode) for _ in range(len(q))]  # no vector yet: nothing to find
            if q.ndim != 2 or q.shape[1] != self._dim:
                error = DimensionMismatchError if q.ndim == 2 else ValueError
                raise error(f"queries must have shape (q, {self._dim}), got {q.shape}")
            qvecs = self._vectors([""] * len(q), q)
        else:
            texts = list(queries)
            if isinstance(queries, str):
                raise TypeError("search_many takes a list of queries, not one string (use search)")
            for i, t in enumerate(texts):
                if not isinstance(t, str) or not t.strip():
                    raise ValueError(f"query {i} is empty or not a string")
        state = self._state
        # Text queries go through search()'s cache (same key), unless the SLM picks clusters
        # per query (search() does, search_many does not: their results differ).
        use_cache = texts is not None and bool(self.config.cache_size) and not self.config.slm.select_clusters
        keys = [_cache_key(t, k, namespace, kind, since, until, mode, n_probe, lw, cond, context)
                for t in texts] if use_cache else []
        found: dict[int, Hits] = {}
        if use_cache:
            for i, key in enumerate(keys):
                cached = state.cache.get(key)
                if cached is not None:
                    found[i] = _from_cache(cached)
            if found:
                state.count("cache_hits", len(found))
                if len(found) == len(texts):
                    return [found[i] for i in range(len(texts))]
        if texts is not None:
            todo = [i for i in range(len(texts)) if i not in found]
            fresh_texts = [texts[i] for i in todo] if found else texts
            qvecs = self._vectors(fresh_texts, None) if texts else np.empty((0, self._dim), np.float32)
        else:
            todo, fresh_texts = list(range(len(qvecs))), None
        if len(qvecs) == 0:
            return []
        with state.lock.read():
            generation = state.cache.generation  # no write clears the cache while we read
            fresh = self._searcher.search(qvecs, k, (namespace, kind, since, until, cond), mode, n_probe,
                                          texts=fresh_texts, lexical_weight=lw, context=context)
        latency = time.perf_counter() - t0
        for i, hits in zip(todo, fresh):
            hits.latency_s = latency / len(fresh)
            self._slm.after_search(hits[0].score if hits else float("-inf"))
            if use_cache:
                state.cache.put(keys[i], hits, generation)
        state.count("searches", len(fresh))
        state.count("search_s", latency)
        if not found:
            return fresh
        out = dict(found)
        out.update(zip(todo, fresh))
        return [out[i] for i in range(len(texts))]

    def get(self, memory_id: int | None = None, *, key: str | None = None, namespace: str = "default") -> Memory:
        """The memory with this id, or with this ``key`` in ``namespace`` (exactly one of the
        two); KeyError naming it when there is none. Archived memories are returned too."""
        self._check_open()
        readers = self._catalog.readers()  # no lock: committed data, never an organisation's wait
        found = self._memories([self._resolve(memory_id, key, namespace, readers)], readers)
        if not found:
            raise KeyError(f"no memory with id {memory_id}")
        return found[0]

    def get_many(self, memory_ids: Sequence[int] | None = None, *, keys: Sequence[str] | None = None,
                 namespace: str = "default") -> list[Memory]:
        """The memories with these ids, or with these ``keys`` in ``namespace``, in the order
        asked; missing ones are skipped."""
        self._check_open()
        if (memory_ids is None) == (keys is None):
            raise ValueError("get_many needs memory_ids or keys (exactly one)")
        readers = self._catalog.readers()  # no lock: committed data, never an organisation's wait
        if keys is not None:
            keys = _check_keys(keys, len(list(keys)), allow_none=False)
            found = readers.ids_of_keys(namespace, keys)
            ids = [found[k][0] for k in keys if k in found]
        else:
            ids = [_check_id(m) for m in memory_ids]
        return self._memories(ids, readers)

    def memories(self, namespace: str | None = None, cluster: int | None = None,
                 where: dict[str, Any] | None = None, kind: str | None = None, limit: int = 100,
                 cursor: str | None = None) -> MemoryPage:
        """List live memories by id ascending, ``limit`` per page: those of ``namespace``,
        ``kind``, whose primary cluster is ``cluster`` and whose metadata matches ``where``
        (as in ``search``); None = any. Pass the page's ``next_cursor`` back to get the next
        page (None on the last). Archived memories are not listed."""
        self._check_open()
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        after = _parse_cursor(cursor)
        cond = filters.parse(where)
        state = self._state
        with state.lock.read():
            mask, count = self._searcher.eligible((namespace, kind, None, None, cond))
            if count == 0:
                return MemoryPage([], None)
            rows = state.rows
            mids = rows.memory_id[: rows.n][rows.live[: rows.n] if mask is None else mask]
            if cluster is not None:
                cid = _check_id(cluster)
                known = cid in set(state.index.cluster_ids().tolist())
                members = state.index.members(cid) if known else np.empty(0, np.int64)
                mids = np.intersect1d(mids, rows.memory_id[members])
            mids = mids[mids > after]
            if len(mids) > limit:
                mids = np.partition(mids, limit)[: limit + 1]
            mids = np.sort(mids)
            page = mids[:limit].tolist()
            items = self._memories(page)
        more = len(mids) > limit
        return MemoryPage(items, _make_cursor(page[-1]) if more and page else None)

    def namespaces(self) -> list[str]:
        """The namespaces holding at least one live memory, sorted."""
        self._check_open()
        state = self._state
        with state.lock.read():
            rows = state.rows
            codes = np.unique(rows.namespace[: rows.n][rows.live[: rows.n]])
            names = rows.names("namespace")
        return sorted(names[c] for c in codes.tolist())

    def links(self, memory_id: int) -> list[tuple[int, str]]:
        """(other memory id, relation) pairs linked from this memory (localized evolution)."""
        self._check_open()
        readers = self._catalog.readers()
        self._row_of(memory_id, include_archived=True, catalog=readers)
        return readers.links(memory_id)

    def clusters(self) -> list[ClusterInfo]:
        """Every live cluster with its profile and size, largest first."""
        self._check_open()
        with self._state.lock.read():
            _, sizes = self._state.cluster_table()
            data = self._catalog.cluster_rows()
        out = [ClusterInfo(c, s, t, sizes[c], src, ca, ua) for c, s, t, src, ca, ua in data if c in sizes]
        return sorted(out, key=lambda c: (-c.size, c.id))

    # -- topics ------------------------------------------------------------------------
    def cluster(self, cluster_id: int, *, namespace: str | None = None, limit: int = 100,
                cursor: str | None = None) -> ClusterPage:
        """Cluster ``cluster_id``: its profile and size, and a page of its members (of
        ``namespace`` only, when given), ``limit`` at a time (``next_cursor`` fetches the
        next). KeyError when there is no such cluster."""
        self._check_open()
        with self._state.lock.read():
            cid = topics.check_cluster(self._state, cluster_id)
        info = next((c for c in self.clusters() if c.id == cid), None)
        if info is None:
            raise KeyError(f"no cluster with id {cluster_id}")
        page = self.memories(namespace=namespace, cluster=cid, limit=limit, cursor=cursor)
        return ClusterPage(info, page.items, page.next_cursor)

    def forget_cluster(self, cluster_id: int, *, action: str = "archive", namespace: str | None = None) -> int:
        """Forget a topic: archive (kept, never searched; ``get`` still returns them) or
        delete (``action="delete"``) every member of ``cluster_id`` (of ``namespace`` only, when
        given). The cluster goes with its last member. Returns the memories forgotten."""
        self._check_open(write=True)
        with self._state.lock.write():
            n = topics.forget(self._state, cluster_id, action, namespace)
            self._lexical_gc()
            return n

    def move_cluster(self, cluster_id: int, to: int, *, memory_ids: Sequence[int] | None = None,
                     namespace: str | None = None) -> int:
        """Move the members of ``cluster_id`` (all, those of ``namespace``, or the listed
        ``memory_ids``) to cluster ``to``; a cluster left empty is dropped. Returns how many
        moved. A later organisation may still re-route them by their vectors."""
        self._check_open(write=True)
        with self._state.lock.write():
            return topics.move(self._state, cluster_id, to, None if memory_ids is None else list(memory_ids), namespace)

    def merge_clusters(self, keep: int, absorb: int) -> int:
        """Merge cluster ``absorb`` into ``keep`` (which keeps its profile); returns how many
        members joined ``keep``."""
        self._check_open(write=True)
        with self._state.lock.write():
            return topics.merge(self._state, keep, absorb)

    def cluster_centres(self) -> tuple[np.ndarray, np.ndarray]:
        """(cluster ids, their unit centres as an (n, dim) float32 array), in the same order."""
        self._check_open()
        with self._state.lock.read():
            return self._state.index.cluster_ids().copy(), np.array(self._state.index.centres(), np.float32)

    def label_quality(self, max_members: int = 200) -> dict[str, Any]:
        """Copy rate, groundedness and self@1 of the cluster labels (``clag_fast.labels.measures``),
        computed now: reads up to ``max_members`` members per cluster (those nearest its
        centre) and embeds each label once. self@1 is left out without an embedder."""
        from clag_fast.labels.measures import ClusterLabel, measure

        self._check_open()
        state = self._state
        with state.lock.read():
            ids = state.index.cluster_ids().tolist()
            centres = np.array(state.index.centres(), np.float32)
            picked = {c: organize.example_ids(state, c, max_members, centres[i]) for i, c in enumerate(ids)}
            texts = self._catalog.texts([m for mids in picked.values() for m in mids])
            profiles = dict(state.profiles)
        clusters = [ClusterLabel(c, profiles.get(c, ("", []))[0], list(profiles.get(c, ("", []))[1]),
                                 [texts[m] for m in picked[c] if m in texts]) for c in ids]
        embed = (lambda t: self._vectors(t, None)) if self._same_space() else None
        return measure(clusters, centres, embed)

    def __len__(self) -> int:
        return len(self._state)

    def stats(self) -> dict[str, Any]:
        """Counts, cluster sizes, SLM calls and tokens, and timings.

        ``slm``: the SLM in words; ``slm_usage``: its calls, tokens, decisions and errors;
        ``slm_calls_per_memory``; ``slm_pending``: its work not applied yet. ``labels``:
        cluster labels written since open, by kind (SLM pick, vector keyphrases, neutral, SLM
        picks replaced); their quality is measured on demand by :meth:`label_quality`. The
        old keys ``llm`` and ``llm_calls_per_memory`` still read, with a DeprecationWarning.
        """
        self._check_open()
        state = self._state
        c = state.counters
        sizes = state.index.cluster_sizes()
        usage = self._slm.usage()
        return RenamedKeys({
            "memories": len(state),
            "archived": self._catalog.readers().count_state(catalog_mod.ARCHIVED),
            "vector_rows": len(state.index),
            "clusters": int(len(sizes)),
            "cluster_size": _distribution(sizes),
            "adds": c["adds"],
            "searches": c["searches"],
            "cache_hits": c["cache_hits"],
            "embed_cache": {"hits": state.embed_cache.hits, "misses": state.embed_cache.misses,
                            "size": len(state.embed_cache)},
            "organizations": c["organizations"],
            "routing": {k[7:]: v for k, v in c.items() if k.startswith("routed_")},
            "slm": self._slm.describe(),
            "slm_usage": usage,
            "slm_calls_per_memory": (usage.get("calls", 0) / c["adds"]) if c["adds"] else 0.0,
            "slm_pending": self._slm.pending(),
            "labels": self._slm.label_stats(),
            # The label work the writes earned and spent (``store.label_budget``), and what all
            # label passes did, in units (a text ranked 1, a phrase embedded ``EMBED_COST``).
            "label_work": {**self._slm.labels.snapshot(), "units": round(c["label_units"], 1)},
            # "add": embedding, routing and writing (new clusters' first labels included);
            # "organize": re-organisations and the profiles they write, periodic ones inside
            # add() included (not counted in "add"); "labels": label work in either (first
            # labels, phrase ranking and embedding, SLM picks).
            "timings_s": {"embed": c["embed_s"], "add": c["add_s"], "search": c["search_s"],
                          "organize": c["organize_s"], "labels": c["label_s"]},
        }, STATS_RENAMES, "MemoryStore.stats()")

    def refresh(self) -> None:
        """Read-only stores: reload to see what the writer has committed since open."""
        self._check_open()
        if not self.read_only:
            return
        state = self._state
        with state.lock.write():
            self.config, self._dim, self._dim_pending = dimension.current(self._catalog, self.config)
            self._query_shape = (self._dim,)
            state.config = self.config
            state.close_index()
            state.index = recovery.open_index(self.path, self._dim, True,
                                              rows_needed=self._catalog.max_vector_row() + 1)
            state.assignments = Assignments(self.path / ASSIGNMENTS, self.config.soft_k, True)
            recovery.adopt_legacy_assignments(state)
            state.rows = RowTable()
            state.fields = FieldTable()
            state.cache.clear()
            self._catalog.forget_cached()
            self._load_rows()
            self._searcher = Searcher(state, recovery.open_lexical(state))

    # -- internals ---------------------------------------------------------------------
    def _vectors(self, texts: list[str], embeddings: np.ndarray | None, remember: bool = True,
                 any_width: bool = False) -> np.ndarray:
        """Vectors of ``texts``: ``embeddings`` checked, or the embedder's through the store's
        cache of texts' vectors (``remember=False``: adds, looked up but not kept).
        ``any_width``: the first vectors of a store whose width is pending (they fix it)."""
        if embeddings is None:
            t0 = time.perf_counter()
            vecs = self._state.embed_cache.encode(texts, self._get_embedder().encode, self._dim, remember)
            self._state.count("embed_s", time.perf_counter() - t0)
            vecs = np.ascontiguousarray(vecs, dtype=np.float32)
            if vecs.shape != (len(texts), self._dim) and not (any_width and vecs.ndim == 2 and len(vecs) == len(texts)):
                raise DimensionMismatchError(
                    f"the embedder {_embedder_name(self._embedder_arg)!r} returned shape {vecs.shape}, the store "
                    f"holds {self._dim}-dimensional vectors (pass embeddings= / a query vector of that width, "
                    "or open the store with an embedder of that width)")
            return vecs
        vecs = np.asarray(embeddings)
        if vecs.ndim != 2 or vecs.shape != (len(texts), self._dim):
            if any_width and vecs.ndim == 2 and len(vecs) == len(texts) and vecs.shape[1] > 0:
                pass  # the first vectors of a store whose width is pending
            else:
                error = DimensionMismatchError if vecs.ndim == 2 and len(vecs) == len(texts) else ValueError
                raise error(f"embeddings must have shape ({len(texts)}, {self._dim}), got {vecs.shape}")
        if not np.issubdtype(vecs.dtype, np.floating):
            raise ValueError(f"embeddings must be floating point, got {vecs.dtype}")
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def _query_vector(self, query: str | np.ndarray, core_checks_finite: bool = False) -> np.ndarray:
        """The query as float32[dim]. ``core_checks_finite``: the caller hands a float32 vector
        to ``Searcher.search_vector``, which refuses NaN and infinity itself (the native search
        checks every query it normalises), so no numpy pass is spent on it here."""
        if isinstance(query, str):
            return self._vectors([query], None)[0]
        q = np.asarray(query)
        if q.ndim != 1 or q.shape[0] != self._dim:
            error = DimensionMismatchError if q.ndim == 1 else ValueError
            raise error(f"query vector must have shape ({self._dim},), got {q.shape}")
        if q.dtype == np.float32 and q.flags.c_contiguous:
            # The common case (vectors from an embedder): nothing to convert.
            if not core_checks_finite:
                check_finite_query(q)
            return q
        if not np.isfinite(q).all():
            raise ValueError("query vector holds NaN or infinity")
        return self._vectors([""], q[None, :])[0]

    def _lexical_weight(self, value: float | None) -> float:
        if value is None:
            return self.config.lexical_weight
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"lexical_weight must be a number in [0, 1], got {value!r}")
        return float(value)

    def _get_embedder(self) -> Any:
        if self._embedder is None:
            if self._embedder_arg is False:
                raise ValueError("this store was opened with embedder=False: pass embeddings / a query vector")
            from clag_fast.embed.embedder import Embedder

            self._embedder = Embedder(precision=self._embed_precision or "auto")
        return self._embedder

    def _memories(self, memory_ids: list[int], catalog: Catalog | None = None) -> list[Memory]:
        """The memories of ``memory_ids`` that exist, in the order asked, each with its
        clusters and affinities from the assignment records (clusters the database no longer
        lists are left out: a dropped cluster's pairs stay in the records until re-assignment).
        ``catalog``: where to read them (``Catalog.readers()`` for callers without the lock)."""
        catalog = catalog or self._catalog
        found = catalog.memories(memory_ids)
        pairs = self._state.assignments.pairs([r[10] for r in found])
        listed = catalog.listed_clusters([c for p in pairs for c, _ in p])
        return [_memory(r, [(c, a) for c, a in p if c in listed]) for r, p in zip(found, pairs)]

    def _resolve(self, memory_id: int | None, key: str | None, namespace: str,
                 catalog: Catalog | None = None) -> int:
        """The memory id named by an id or by a key in a namespace (exactly one given)."""
        if (memory_id is None) == (key is None):
            raise ValueError("name the memory by its id or by key= (exactly one)")
        if memory_id is not None:
            return _check_id(memory_id)
        mid = (catalog or self._catalog).id_of_key(namespace, _check_keys([key], 1, allow_none=False, single=True)[0])
        if mid is None:
            raise KeyError(f"no memory with key {key!r} in namespace {namespace!r}")
        return mid

    def _row_of(self, memory_id: int, include_archived: bool = False, catalog: Catalog | None = None) -> int:
        r = (catalog or self._catalog).row_of(_check_id(memory_id))
        if r is None or (r[1] != catalog_mod.LIVE and not include_archived):
            raise KeyError(f"no memory with id {memory_id}")
        return r[0]


# -- helpers ----------------------------------------------------------------------------
def _warm(index: VectorIndex) -> None:
    try:
        index.warm()
    except OSError:  # the store was closed meanwhile: nothing left to warm
        pass


def _cache_key(text: str | None, k: int, namespace: str | None, kind: str | None, since: float | None,
               until: float | None, mode: str, n_probe: int | None, lexical_weight: float, cond: Any,
               context: int = 0) -> tuple:
    """The retrieval cache's key: the query text and every argument that changes the result,
    checked and normalised; ``search`` and ``search_many`` share entries through it."""
    return (text, k, namespace, kind, since, until, mode, n_probe, lexical_weight, cond, context)


def _from_cache(cached: Hits) -> Hits:
    """A cached search's hits as a new ``Hits`` (its own list, ``cached=True``)."""
    return Hits(list(cached), scanned=cached.scanned, candidates=cached.candidates,
                clusters_probed=list(cached.clusters_probed), mode=cached.mode, latency_s=0.0, cached=True)


def _check_search_args(k: Any, mode: str, n_probe: Any) -> tuple[int, int | None]:
    if type(k) is int and k >= 1 and n_probe is None and mode == "two_stage":
        return k, None  # the common call, answered without the checks below
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if mode not in ("two_stage", "flat"):
        raise ValueError(f"mode must be 'two_stage' or 'flat', got {mode!r}")
    if n_probe is not None and (not isinstance(n_probe, (int, np.integer)) or isinstance(n_probe, bool)
                                or n_probe < 1):
        raise ValueError(f"n_probe must be a positive integer, got {n_probe!r}")
    return int(k), None if n_probe is None else int(n_probe)


#: Most neighbouring turns a hit may carry on each side (``search(context=...)``).
MAX_CONTEXT = 16


def _check_context(context: Any) -> int:
    if isinstance(context, bool) or not isinstance(context, (int, np.integer)) or not 0 <= context <= MAX_CONTEXT:
        raise ValueError(f"context must be an integer from 0 to {MAX_CONTEXT} (turns each side), got {context!r}")
    return int(context)


def _until_as_of(until: float | None, as_of: Any) -> float | None:
    """The search's ``until`` bound once ``as_of`` (inclusive: memories created at ``as_of``
    count) is applied; ValueError naming ``as_of`` when it is not a time."""
    if as_of is None:
        return until
    if isinstance(as_of, datetime.datetime):
        as_of = as_of.timestamp()
    if isinstance(as_of, bool) or not isinstance(as_of, (int, float, np.integer, np.floating)):
        raise ValueError(f"as_of must be a time (seconds since the epoch, or a datetime), got {type(as_of).__name__}")
    as_of = float(as_of)
    if not math.isfinite(as_of) or as_of < 0:
        raise ValueError(f"as_of must be a finite time at or after the epoch, got {as_of!r}")
    bound = math.nextafter(as_of, math.inf)
    return bound if until is None else min(until, bound)


def _check_store_dir(path: Path, read_only: bool) -> None:
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")
    if path.is_dir():
        entries = {p.name for p in path.iterdir()}
        # A directory with vectors but no database is a lost database: recovery refuses it
        # naming both files.
        if entries and DB_NAME not in entries and INDEX_DIR not in entries:
            raise StoreFormatError(
                f"{path} is not empty and holds no clag_fast store ({DB_NAME} missing)"
            )
    elif read_only:
        raise FileNotFoundError(f"no store at {path}")


def _check_texts(texts: Iterable[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("add_many takes a list of texts, not one string (use add)")
    out = list(texts)
    # The common case checked in C loops: every text a non-blank ASCII str (an ASCII string
    # holds no lone surrogate, so it encodes). Anything else falls through to the loop below,
    # which checks each text and names the first bad one.
    try:
        if all(map(str.strip, out)) and all(map(str.isascii, out)):
            return out
    except TypeError:  # not a str
        pass
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


def _check_keys(keys: Sequence[str | None] | None, n: int, allow_none: bool = True,
                single: bool = False) -> list[str | None] | None:
    """The keys of a batch, checked (None when no item has one). ``single``: errors name
    "key" (one key passed as ``key=``) instead of its position in ``keys``."""
    if keys is None:
        return None
    if isinstance(keys, str):
        raise TypeError("keys must be a list of keys, not one string")
    out = list(keys)
    if len(out) != n:
        raise ValueError(f"keys has {len(out)} items for {n} texts")
    for i, k in enumerate(out):
        if k is None and allow_none:
            continue
        name = "key" if single else f"keys[{i}]"
        if not isinstance(k, str):
            raise ValueError(f"{name} must be a string{' or None' if allow_none else ''}, got {type(k).__name__}")
        if not k:
            raise ValueError(f"{name} is empty")
        if len(k) > MAX_KEY_CHARS:
            raise ValueError(f"{name} has {len(k)} characters, more than {MAX_KEY_CHARS}")
        if "\x00" in k:
            raise ValueError(f"{name} contains a NUL character")
        try:
            k.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{name} is not valid unicode ({e.reason})") from None
    return out if any(k is not None for k in out) else None


def _take(items: Sequence[Any], at: Sequence[int]) -> list[Any]:
    return [items[i] for i in at]


def _memory(r: tuple, clusters: list[tuple[int, float]]) -> Memory:
    """A ``Memory`` from ``Catalog.memories``' tuple and its (cluster, affinity) pairs."""
    return Memory(*r[:9], r[9] != catalog_mod.LIVE, clusters, *r[11:16])


def _make_cursor(memory_id: int) -> str:
    return f"m{memory_id}"


def _parse_cursor(cursor: str | None) -> int:
    """The memory id a page ended at (0 before the first page)."""
    if cursor is None:
        return 0
    if not isinstance(cursor, str) or not cursor.startswith("m") or not cursor[1:].isdigit():
        raise ValueError(f"cursor {cursor!r} is not one that memories() returned")
    return int(cursor[1:])


def _embedder_name(embedder: Any) -> str:
    """How a store records its embedder: "none" for brought vectors, the default model's name
    for the built-in embedder, else the object's ``name`` attribute or its class name."""
    if embedder is False:
        return "none"
    if embedder is None:
        from clag_fast.embed.modelfiles import DEFAULT_MODEL

        return DEFAULT_MODEL
    name = getattr(embedder, "name", None)
    return name if isinstance(name, str) and name else type(embedder).__name__


def _check_id(memory_id: Any) -> int:
    if isinstance(memory_id, bool) or not isinstance(memory_id, (int, np.integer)):
        raise TypeError(f"memory id must be an int, got {type(memory_id).__name__}")
    return int(memory_id)


def _distribution(sizes: np.ndarray) -> dict[str, float]:
    if len(sizes) == 0:
        return {"min": 0, "median": 0, "max": 0, "mean": 0.0}
    return {"min": int(sizes.min()), "median": float(np.median(sizes)), "max": int(sizes.max()),
            "mean": float(sizes.mean())}

