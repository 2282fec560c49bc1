"""The store's SQLite database: schema, migrations and every SQL statement the store runs.

The database holds memory texts and metadata, cluster profiles and links. Vectors and cluster
centres live in the native index beside it (``VectorIndex``), soft assignments in their
per-row records (``store.assignments``); ``memories.vector_row`` is the join key. No other module writes SQL: they
call :class:`Catalog`'s methods, so a schema change touches this file only.
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from clag_fast.errors import StoreFormatError

APP_ID = "clag_fast"
SCHEMA_VERSION = 5

# Memory states. Archived memories are kept but never searched; deleted ones keep their row
# only so that their vector row is never reused.
LIVE, ARCHIVED, DELETED = 0, 1, 2

# Catalog.row_columns' record: a NULL last_accessed (never accessed) or turn becomes NaN, a
# NULL superseded_by -1; ``words`` and ``asks`` are read off the text (``text_shapes``).
_ROW_COLUMNS = np.dtype([("id", np.int64), ("vector_row", np.int64), ("namespace", object), ("kind", object),
                         ("created_at", np.float64), ("last_accessed", np.float64), ("access_count", np.float64),
                         ("strength", np.float32), ("state", np.int64), ("thread", object), ("turn", np.float64),
                         ("speaker", object), ("superseded_by", np.int64), ("words", np.int64), ("asks", np.int64)])

#: The conversation columns an insert may give per memory (None: not given).
CONVERSATION = ("thread", "turn", "speaker")


def text_shapes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(words, asks) of memory texts: spaces + 1, and whether each holds a question mark. The
    row table reads them at open with the same definition in SQL (``row_columns``), so both
    agree to the word. Two C-level passes: no Python frame per text."""
    n = len(texts)
    words = np.fromiter(map(str.count, texts, itertools.repeat(" ")), np.int32, n) + 1
    asks = np.fromiter(map(str.__contains__, texts, itertools.repeat("?")), bool, n)
    return words, asks

# The assignments table as schemas 1-3 had it (one row per memory and rank; v4 packs it, and
# the store now keeps assignments in index/assignments.bin: ``Catalog.legacy_assignments``).
ASSIGNMENTS_V1 = """
CREATE TABLE assignments (
    memory_id  INTEGER NOT NULL REFERENCES memories (id),
    rank       INTEGER NOT NULL,
    cluster_id INTEGER NOT NULL,
    affinity   REAL    NOT NULL,
    PRIMARY KEY (memory_id, rank)
) WITHOUT ROWID;
"""

_V1 = """
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE memories (
    id            INTEGER PRIMARY KEY,
    text          TEXT    NOT NULL,
    kind          TEXT    NOT NULL,
    namespace     TEXT    NOT NULL,
    metadata      TEXT,
    created_at    REAL    NOT NULL,
    last_accessed REAL,
    access_count  INTEGER NOT NULL DEFAULT 0,
    strength      REAL    NOT NULL DEFAULT 1.0,
    state         INTEGER NOT NULL DEFAULT 0,
    vector_row    INTEGER NOT NULL UNIQUE
);
CREATE INDEX memories_namespace ON memories (namespace, state);
CREATE TABLE clusters (
    id            INTEGER PRIMARY KEY,
    summary       TEXT    NOT NULL DEFAULT '',
    tags          TEXT    NOT NULL DEFAULT '[]',
    source        TEXT    NOT NULL,
    created_at    REAL    NOT NULL,
    updated_at    REAL    NOT NULL,
    archived      INTEGER NOT NULL DEFAULT 0,
    profiled_size INTEGER NOT NULL DEFAULT 0,
    last_hit_at   REAL
);""" + ASSIGNMENTS_V1 + """CREATE INDEX assignments_cluster ON assignments (cluster_id);
CREATE TABLE links (
    src        INTEGER NOT NULL REFERENCES memories (id),
    dst        INTEGER NOT NULL REFERENCES memories (id),
    relation   TEXT    NOT NULL,
    created_at REAL    NOT NULL,
    PRIMARY KEY (src, dst, relation)
) WITHOUT ROWID;
INSERT INTO meta (key, value) VALUES ('app', 'clag_fast');
"""

# v2: no index on assignments.cluster_id. Every add inserts soft_k assignment rows, and that
# index turned them into random B-tree inserts whose cost grew with the store (ingest fell from
# 14k to 4k memories/s between 200k and 1M memories). Nothing reads assignments by cluster on a
# hot path: a dropped cluster's rows are left behind and ignored by readers (cluster ids are
# never reused), and recovery renumbers clusters in one scan.
_V2 = "DROP INDEX IF EXISTS assignments_cluster;"

# v3: an optional user-chosen key per memory, unique within its namespace (upserts and
# lookups by key). A partial index: memories added without a key cost no index write.
_V3 = """
ALTER TABLE memories ADD COLUMN key TEXT;
CREATE UNIQUE INDEX memories_key ON memories (namespace, key) WHERE key IS NOT NULL;
"""

# v4: one assignments row per memory, its soft assignment packed in a blob (``_pack``), instead
# of one row per (memory, rank). Every add writes its memories' assignments and every split,
# merge and drift re-assignment rewrites its members' ones: a third of the B-tree rows made
# fresh inserts 2.7x and rewrites 3x cheaper (6.2 -> 2.3 and 13.5 -> 4.5 us per memory), and
# at 1M blob vectors those rewrites were the largest cost of ingest. Converted in Python
# (``_migrate_v4``): SQL cannot pack floats.
_V4 = """
CREATE TABLE assignments_v4 (
    memory_id INTEGER PRIMARY KEY REFERENCES memories (id),
    pairs     BLOB    NOT NULL
);
"""


def _migrate_v4(conn: sqlite3.Connection) -> None:
    if "pairs" in {r[1] for r in conn.execute("PRAGMA table_info(assignments)")}:
        return  # already packed (a database whose version was set back by hand)
    conn.execute(_V4)
    insert = "INSERT INTO assignments_v4 (memory_id, pairs) VALUES (?, ?)"
    batch: list[tuple[int, bytes]] = []
    mid, pairs = None, []
    for m, c, a in conn.execute("SELECT memory_id, cluster_id, affinity FROM assignments ORDER BY memory_id, rank"):
        if m != mid:
            if mid is not None:
                batch.append((mid, _pack_pairs(pairs)))
            if len(batch) >= 100_000:
                conn.executemany(insert, batch)
                batch = []
            mid, pairs = m, []
        pairs.append((c, a))
    if mid is not None:
        batch.append((mid, _pack_pairs(pairs)))
    conn.executemany(insert, batch)
    conn.execute("DROP TABLE assignments")
    conn.execute("ALTER TABLE assignments_v4 RENAME TO assignments")


# v5: conversation structure. A memory may name its thread (a conversation or session within
# its namespace), its turn (order within the thread; NULL: insertion order) and its speaker;
# ``superseded_by`` holds the id of a newer memory that updates it (``store.threads``).
_V5_COLUMNS = (("thread", "TEXT"), ("turn", "REAL"), ("speaker", "TEXT"), ("superseded_by", "INTEGER"))


def _migrate_v5(conn: sqlite3.Connection) -> None:
    have = {r[1] for r in conn.execute("PRAGMA table_info(memories)")}
    for name, kind in _V5_COLUMNS:
        if name not in have:  # a database whose version was set back by hand has them
            conn.execute(f"ALTER TABLE memories ADD COLUMN {name} {kind}")


# MIGRATIONS[v] upgrades a database at version v to v + 1 (SQL, or a function of the
# connection run inside the migration's transaction). Version 0 is an empty file.
MIGRATIONS: dict[int, Any] = {0: _V1, 1: _V2, 2: _V3, 3: _migrate_v4, 4: _migrate_v5}

# An assignments blob: (cluster id, affinity) pairs, best first; -1 ids are padding.
_PAIR = np.dtype([("cluster", "<i8"), ("affinity", "<f4")])


def _pack_pairs(pairs: Sequence[tuple[int, float]]) -> bytes:
    rec = np.empty(len(pairs), _PAIR)
    if pairs:
        rec["cluster"], rec["affinity"] = zip(*pairs)
    return rec.tobytes()


def _unpack(blob: bytes) -> list[tuple[int, float]]:
    """(cluster id, affinity) pairs of a blob, best first, padding dropped."""
    rec = np.frombuffer(blob, _PAIR)
    return [(c, a) for c, a in zip(rec["cluster"].tolist(), rec["affinity"].tolist()) if c >= 0]


def connect(path: Path, *, read_only: bool = False) -> sqlite3.Connection:
    """Open (creating and migrating when writable) the store database at ``path``."""
    if read_only:
        uri = f"file:{path}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
    else:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys=ON")
        # Checked before anything is written: a damaged or foreign file is refused exactly as
        # it was (switching it to WAL first would rewrite another application's database).
        _check_and_migrate(conn, path, read_only)
        if not read_only:
            # WAL lets readers in other processes see committed data while one process writes.
            conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives a process crash (SIGKILL) at any point; only an OS
            # crash or power loss can lose the last transactions (StoreConfig.fsync covers that).
            conn.execute("PRAGMA synchronous=NORMAL")
            # No automatic checkpoints: a checkpoint makes the database durable, and it must
            # not reference vector rows that are not (the store's rows are synced first, then
            # ``Catalog.checkpoint``, at every organisation, flush and close, and after
            # ``store.state.CHECKPOINT_ROWS`` added rows). Fewer, larger checkpoints also write
            # each page once instead of at every 4 MB of log.
            conn.execute("PRAGMA wal_autocheckpoint=0")
            # A 64 MiB page cache (the default is 2 MiB): a million-memory store's tables and
            # indexes then stay in SQLite's cache while batches are inserted. Pages are only
            # allocated as used, so a small store does not pay for it.
            conn.execute("PRAGMA cache_size=-65536")
    except BaseException:
        conn.close()
        raise
    return conn


def _check_and_migrate(conn: sqlite3.Connection, path: Path, read_only: bool) -> None:
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as e:
        raise StoreFormatError(f"{path} is not a clag_fast store database: {e}") from None
    if version == 0 and tables:
        raise StoreFormatError(f"{path} is an SQLite database of another application")
    if version > SCHEMA_VERSION:
        raise StoreFormatError(
            f"{path} has schema version {version}, newer than this clag_fast "
            f"(supports up to {SCHEMA_VERSION}); upgrade clag_fast to open it"
        )
    if version > 0:
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='app'").fetchone()
        except sqlite3.DatabaseError:  # no meta table: someone else's user_version
            row = None
        if row is None or row[0] != APP_ID:
            raise StoreFormatError(f"{path} is an SQLite database of another application")
    if version == SCHEMA_VERSION:
        return
    if read_only:
        raise StoreFormatError(f"{path} needs a schema migration; open it writable once")
    for v in range(version, SCHEMA_VERSION):
        step = MIGRATIONS[v]
        if callable(step):
            conn.execute("BEGIN")
            try:
                step(conn)
                conn.execute(f"PRAGMA user_version={v + 1}")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            continue
        # executescript commits first, so run each migration inside an explicit transaction.
        conn.executescript(f"BEGIN;\n{step}\nPRAGMA user_version={v + 1};\nCOMMIT;")


def join(future: Future) -> None:
    """Wait until ``future`` is done, through any interruption (KeyboardInterrupt, a signal
    handler's exception): a transaction rolled back while a writer thread's statement still runs
    would leave that statement's later rows committed on their own. The interruption is
    raised once the future is done; the future's own outcome is left in it."""
    interrupted: BaseException | None = None
    while not future.done():
        try:
            futures_wait([future])
        except BaseException as e:  # noqa: BLE001 - re-raised below, once it is safe
            interrupted = interrupted or e
    if interrupted is not None:
        raise interrupted


class transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection.

    Nests: inside an open transaction it only runs, and the outermost one commits or rolls
    back everything, so write helpers can be composed into one atomic step.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.outer = False

    def __enter__(self) -> None:
        self.outer = not self.db.in_transaction
        if self.outer:
            self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.outer:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")


def _loads(s: str | None) -> Any:
    return None if s is None else json.loads(s)


def _cached_meta(raw: str | None) -> Any:
    """Metadata as the details cache keeps it: None, a flat dict, or the JSON text of a nested
    one (decoded per use, so no caller can reach into the cached copy)."""
    if raw is None:
        return None
    meta = json.loads(raw)
    if isinstance(meta, dict) and not any(isinstance(v, (dict, list)) for v in meta.values()):
        return meta
    return raw


def _meta_copy(meta: Any) -> Any:
    if meta is None:
        return None
    return dict(meta) if isinstance(meta, dict) else json.loads(meta)


def _ids(n: int) -> str:
    return ",".join("?" * n)


# SQLite's default limit on host parameters per statement is 32766 (3.32+); IN lists are cut
# into chunks well below it.
_IN_CHUNK = 10_000

#: Rows per INSERT statement of an import (``Catalog.import_rows``; 64 rows of 16 columns
#: bind 1,024 values, far under SQLite's limit of 32,766).
_ROWS_PER_INSERT = 64

#: Values written into a statement as literals (``_batch_literal``): nothing that could quote.
_PLAIN = re.compile(r"[A-Za-z0-9_.:@/+-]{0,64}\Z")


def _batch_literal(values: Sequence[Any]) -> str | None:
    """The SQL literal of a batch column whose values are all the same plain value (None, or a
    short string of letters, digits and ``_.:@/+-``); None when it must be bound per row."""
    first = values[0]
    if first is not None and not (isinstance(first, str) and _PLAIN.match(first)):
        return None
    if values.count(first) != len(values):
        return None
    return "NULL" if first is None else f"'{first}'"


def _literals(columns: dict[str, Sequence[Any]]) -> dict[str, str | None]:
    """Per column of an insert, the SQL literal standing for all its values (``_batch_literal``),
    or None where it is bound or read per row; ids, texts and vector rows always vary."""
    sql: dict[str, str | None] = {name: None for name in columns}
    for name in ("kind", "namespace", "metadata", "key", *CONVERSATION):
        if name in columns:
            sql[name] = _batch_literal(columns[name])
    return sql


def _json_each_works() -> bool:
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("SELECT value FROM json_each('[1]')").fetchall()
        return True
    except sqlite3.Error:  # an SQLite built without JSON: rows are bound one by one
        return False
    finally:
        conn.close()


_JSON_EACH = _json_each_works()
#: The longest document sent (characters): SQLite refuses a string over its length limit (1e9
#: bytes by default), and the document is a second copy of the batch's texts while it lives.
_JSON_MAX = 64 << 20


def _json_rows(columns: dict[str, Sequence[Any]], sql: dict[str, str | None]) -> tuple[str, dict[str, str]] | None:
    """The texts of an insert as one JSON array for ``json_each``, and the expression that
    reads each column ``sql`` has no literal for. None unless the text is the only column that
    varies (ids and vector rows count up by one: their first value plus the position); also
    None where SQLite could not read a text back unchanged (a NUL ends its JSON strings; a
    text holding a backslash and "u0000" is bound too, harmlessly), and for a document over
    ``_JSON_MAX`` characters. Several varying columns would be arrays per row, read with
    ``json_extract``: no faster than binding (10k rows with metadata: 2.29 against 1.96 us a
    row)."""
    exprs = {"text": "value"}
    for name in ("id", "vector_row"):
        if not _counts_up(columns[name]):
            return None
        exprs[name] = f"{int(columns[name][0])} + key"
    if any(sql[name] is None for name in columns if name not in exprs):
        return None
    doc = json.dumps(columns["text"], ensure_ascii=False, separators=(",", ":"))
    return None if len(doc) > _JSON_MAX or "\\u0000" in doc else (doc, exprs)


def _counts_up(values: Sequence[Any]) -> bool:
    """Whether ``values`` are consecutive integers (the ids and rows of an ordinary batch)."""
    if isinstance(values, range):  # add_many's fresh ids: no 10k-element array to build
        return values.step == 1
    a = np.asarray(values)
    return a.dtype.kind in "iu" and bool(np.all(np.diff(a) == 1))


# Memories whose details are kept for search hits (texts of a few hundred bytes: ~10 MB).
_DETAILS_CACHE = 20_000


class Catalog:
    """Typed access to one store database. Methods that write run inside a transaction of
    their own unless the caller holds one (``with catalog.transaction():``), so several
    writes compose into one atomic step."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        self.db = connect(path, read_only=read_only)
        # Search hits' details by memory id: the one SQL statement per search cost more than
        # the native search itself (~0.1 ms for 10 ids). Metadata stays JSON text here, so
        # every caller gets its own dict. Every method that writes a memory forgets it.
        self._details: dict[int, tuple] = {}
        self._details_lock = threading.Lock()
        self._aside: ThreadPoolExecutor | None = None  # started by the first ``aside`` call
        self._aside_lock = threading.Lock()
        self._closed = False
        self._readers: Catalog | None = self if read_only else None  # opened by ``readers()``

    def forget_cached(self, memory_ids: Iterable[int] | None = None) -> None:
        """Drop cached details (all of them with None: another process wrote the database)."""
        with self._details_lock:
            if memory_ids is None:
                self._details.clear()
            else:
                for m in memory_ids:
                    self._details.pop(m, None)

    def close(self) -> None:
        with self._aside_lock:
            self._closed = True
            if self._aside is not None:
                self._aside.shutdown(wait=True)
                self._aside = None
            if self._readers is not None and self._readers is not self:
                self._readers.close()
                self._readers = None
        self.db.close()

    def readers(self) -> "Catalog":
        """This catalog on a second, read-only connection (opened on first use), for the
        store's readers that take no store lock: ``get``, ``get_many``, ``links``, the
        counts of ``stats``. They must not wait for an organisation holding the write lock,
        and on the main connection they would read a write's open transaction (rows of a
        batch that may still roll back) and share it with the write's helper thread
        (``aside``). Here they see committed data only (WAL: each statement reads the last
        commit). Only read methods may be called on it; ``close`` closes it."""
        got = self._readers
        if got is not None:
            return got
        with self._aside_lock:
            if self._closed:
                raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
            if self._readers is None:
                self._readers = Catalog(self.path, read_only=True)
            return self._readers

    def aside(self, write: Callable[[], None]) -> Future | None:
        """Run ``write`` (statements of the caller's open transaction) on the catalog's writer
        thread and return its future, or None when that thread cannot run it (the catalog closed,
        the interpreter shutting down): the caller then runs it itself. Until the future is
        done the caller must not use the connection, and must wait for it even when
        interrupted (``join``) before it commits or rolls back. Readers under the store's lock
        cannot meet it (the caller holds the write side); those without it read through
        ``readers()``, another connection. Why a thread:
        ``sqlite3_step`` runs without the GIL, so a large batch's inserts overlap work the
        caller does meanwhile in native code (``MemoryStore`` routes the batch)."""
        # The thread waits for ``go`` before it writes: a Ctrl-C that reaches the caller while
        # the write is being handed over (the thread may start at once, before ``submit``
        # returns) must leave either no write at all or a future the caller waits for.
        go = threading.Event()
        decided: list[bool | None] = [None]  # True: write; False: abandoned before it began

        def run() -> None:
            go.wait()
            if decided[0]:
                write()

        with self._aside_lock:
            if self._closed:
                return None
            if self._aside is None:
                self._aside = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clag-fast-sqlite")
            future: Future | None = None
            try:
                future = self._aside.submit(run)
                decided[0] = True
                go.set()
                return future
            except BaseException as e:
                if decided[0]:  # interrupted after the decision: the write runs, wait for it
                    go.set()
                    join(future)
                else:
                    decided[0] = False
                    go.set()
                if isinstance(e, RuntimeError) and future is None:
                    # "cannot schedule new futures after interpreter shutdown"
                    return None
                raise

    def checkpoint(self) -> None:
        """Copy the write-ahead log into the database (not inside a transaction; readers in
        other processes are not waited for: what they still use is copied next time)."""
        if not self.db.in_transaction:
            self.db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def transaction(self) -> transaction:
        return transaction(self.db)

    # -- meta --------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def delete_meta(self, key: str) -> None:
        self.db.execute("DELETE FROM meta WHERE key=?", (key,))

    # -- memories ----------------------------------------------------------------------
    def row_columns(self) -> np.ndarray:
        """Every memory's (id, vector_row, namespace, kind, created_at, last_accessed,
        access_count, strength, state), as a structured array with those field names (a
        never-accessed memory's last_accessed is NaN): what the in-memory row table is built
        from. Read straight from the cursor into the array: a list of tuples split into
        columns cost 3.4 s for 1M memories, this 1.9 s."""
        cur = self.db.execute(
            "SELECT id, vector_row, namespace, kind, created_at, last_accessed, access_count, strength, state, "
            "thread, turn, speaker, IFNULL(superseded_by, -1), "
            "length(text) - length(replace(text, ' ', '')) + 1, instr(text, '?') > 0 FROM memories")
        return np.fromiter(cur, _ROW_COLUMNS)

    def live_texts(self) -> list[tuple[int, str]]:
        """(vector_row, text) of every live memory: what the lexical index is built from."""
        return self.db.execute("SELECT vector_row, text FROM memories WHERE state=?", (LIVE,)).fetchall()

    def count_state(self, state: int) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM memories WHERE state=?", (state,)).fetchone()[0])

    def max_vector_row(self) -> int:
        """The highest vector row any memory references (-1 for none)."""
        return int(self.db.execute("SELECT COALESCE(MAX(vector_row), -1) FROM memories").fetchone()[0])

    def next_memory_id(self) -> int:
        return int(self.db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM memories").fetchone()[0])

    def insert_memories(self, ids: Sequence[int] | range, texts: Sequence[str], kinds: Sequence[str],
                        namespaces: Sequence[str], metadata: Sequence[str | None], now: float,
                        rows: Sequence[int] | np.ndarray, keys: Sequence[str | None] | None = None,
                        conversation: dict[str, Sequence[Any]] | None = None) -> None:
        """Insert new memories. ``conversation``: per memory its thread, turn and speaker
        (``CONVERSATION``; a column left out is NULL for every memory)."""
        # ``ids`` as a range and ``rows`` as the index's array where the caller has them: the
        # JSON path reads only their first value and whether they count up, which a range and
        # an array answer in microseconds and a 10k-element list in 239 us.
        self.forget_cached(ids)  # ids of deleted memories can come back (MAX(id) + 1)
        if not len(ids):
            return
        n = len(ids)
        columns: dict[str, Sequence[Any]] = {
            "id": ids, "text": texts, "kind": kinds, "namespace": namespaces, "metadata": metadata,
            "key": keys if keys is not None else [None] * n, "vector_row": rows}
        for name in CONVERSATION:
            if conversation and conversation.get(name) is not None:
                columns[name] = conversation[name]
        # A column holding one plain value for the whole batch (the usual add_many: one kind,
        # one namespace, no metadata, no keys) is a literal in the statement, not bound per
        # row: the per-value binding was a third of the insert (10k rows: 3.4-4.8 -> 2.5-3.2 us
        # per row).
        sql = _literals(columns)
        packed = _json_rows(columns, sql) if _JSON_EACH else None
        names = ", ".join(columns)
        if packed is not None:
            doc, exprs = packed
            # The texts as one JSON document that SQLite unpacks itself (json_each): the insert
            # steps without binding each row under the GIL, which add_many's routing wants
            # meanwhile (8-30-word texts in calls of 10k: 2.7-3.0 against 4.2-4.7 us a row;
            # BENCHMARKS.md, Ingest).
            values = ", ".join(sql[name] or exprs[name] for name in columns)
            self.db.execute(f"INSERT INTO memories ({names}, created_at) SELECT {values}, ? FROM json_each(?)",
                            (now, doc))
            return
        columns["id"], columns["vector_row"] = [int(v) for v in ids], [int(v) for v in rows]
        bound = [name for name in columns if sql[name] is None]
        marks = ", ".join(sql[name] or "?" for name in columns)
        self.db.executemany(f"INSERT INTO memories ({names}, created_at) VALUES ({marks}, ?)",
                            zip(*(columns[name] for name in bound), [now] * n))

    def replace_memories(self, ids: Sequence[int], texts: Sequence[str], kinds: Sequence[str],
                         metadata: Sequence[str | None], rows: Sequence[int],
                         conversation: dict[str, Sequence[Any]] | None = None) -> None:
        """Upserts by key: new text, kind, metadata and vector row for existing memories, which
        become live again if they were archived (id, key, created_at and access counts stay).
        ``conversation``: their thread, turn and speaker, where given (others keep theirs)."""
        self.forget_cached(ids)
        self.db.executemany(
            "UPDATE memories SET text=?, kind=?, metadata=?, vector_row=?, state=? WHERE id=?",
            zip(texts, kinds, metadata, rows, [LIVE] * len(ids), ids),
        )
        for name in CONVERSATION:
            values = (conversation or {}).get(name)
            if values is not None:
                self.db.executemany(f"UPDATE memories SET {name}=? WHERE id=? AND ? IS NOT NULL",
                                    [(v, m, v) for v, m in zip(values, ids)])

    def set_superseded(self, pairs: Sequence[tuple[int, int]]) -> None:
        """(older memory id, newer memory id): the newer one updates the older one."""
        self.forget_cached([old for old, _ in pairs])
        self.db.executemany("UPDATE memories SET superseded_by=? WHERE id=?", [(new, old) for old, new in pairs])

    def conversation_of(self, memory_ids: Sequence[int]) -> dict[int, tuple[str | None, float | None, str | None, int | None]]:
        """memory id -> (thread, turn, speaker, superseded_by) of those that exist."""
        out = {}
        ids = list(memory_ids)
        for i in range(0, len(ids), _IN_CHUNK):
            chunk = ids[i:i + _IN_CHUNK]
            for r in self.db.execute("SELECT id, thread, turn, speaker, superseded_by FROM memories "
                                     f"WHERE id IN ({_ids(len(chunk))})", chunk):
                out[int(r[0])] = tuple(r[1:])
        return out

    def ids_of_keys(self, namespace: str, keys: Sequence[str]) -> dict[str, tuple[int, int, int]]:
        """key -> (memory id, vector row, state) for the keys of ``namespace`` that exist."""
        out: dict[str, tuple[int, int, int]] = {}
        keys = list(keys)
        for i in range(0, len(keys), _IN_CHUNK):
            chunk = keys[i:i + _IN_CHUNK]
            for key, mid, row, st in self.db.execute(
                    f"SELECT key, id, vector_row, state FROM memories WHERE namespace=? AND key IN ({_ids(len(chunk))})",
                    [namespace, *chunk]):
                out[key] = (int(mid), int(row), int(st))
        return out

    def metadata_rows(self) -> list[tuple[int, str]]:
        """(vector row, metadata JSON) of every live memory that has metadata: what the
        in-memory metadata columns (``store.fields``) are built from."""
        return self.db.execute("SELECT vector_row, metadata FROM memories WHERE state=? AND metadata IS NOT NULL",
                               (LIVE,)).fetchall()

    def metadata_of(self, memory_id: int) -> str | None:
        row = self.db.execute("SELECT metadata FROM memories WHERE id=?", (memory_id,)).fetchone()
        return None if row is None else row[0]

    def set_metadata(self, memory_id: int, metadata_json: str | None) -> None:
        self.forget_cached((memory_id,))
        self.db.execute("UPDATE memories SET metadata=? WHERE id=?", (metadata_json, memory_id))

    def set_text(self, memory_id: int, text: str, vector_row: int) -> None:
        self.forget_cached((memory_id,))
        self.db.execute("UPDATE memories SET text=?, vector_row=? WHERE id=?", (text, vector_row, memory_id))

    def set_state(self, memory_ids: Iterable[int], state: int) -> None:
        memory_ids = list(memory_ids)
        self.forget_cached(memory_ids)
        with self.transaction():
            self.db.executemany("UPDATE memories SET state=? WHERE id=?", [(state, m) for m in memory_ids])

    def row_of(self, memory_id: int) -> tuple[int, int] | None:
        """(vector row, state) of a memory, or None."""
        r = self.db.execute("SELECT vector_row, state FROM memories WHERE id=?", (memory_id,)).fetchone()
        return None if r is None else (int(r[0]), int(r[1]))

    def memories(self, memory_ids: Sequence[int]) -> list[tuple]:
        """(id, text, kind, namespace, metadata, created_at, last_accessed, access_count,
        strength, state, vector row, key, thread, turn, speaker, superseded_by) of the memories
        that exist, in the order asked, in one statement per 10,000."""
        rows: dict[int, tuple] = {}
        ids = list(dict.fromkeys(memory_ids))
        for i in range(0, len(ids), _IN_CHUNK):
            chunk = ids[i:i + _IN_CHUNK]
            for r in self.db.execute(
                    "SELECT id, text, kind, namespace, metadata, created_at, last_accessed, access_count, "
                    "strength, state, vector_row, key, thread, turn, speaker, superseded_by "
                    f"FROM memories WHERE id IN ({_ids(len(chunk))})", chunk):
                rows[r[0]] = r
        return [(*r[:4], _loads(r[4]), *r[5:]) for m in memory_ids if (r := rows.get(m)) is not None]

    def listed_clusters(self, cluster_ids: Sequence[int]) -> set[int]:
        """Those of ``cluster_ids`` that the clusters table lists."""
        ids = sorted(set(cluster_ids))
        listed: set[int] = set()
        for i in range(0, len(ids), _IN_CHUNK):
            chunk = ids[i:i + _IN_CHUNK]
            listed.update(c for (c,) in self.db.execute(f"SELECT id FROM clusters WHERE id IN ({_ids(len(chunk))})", chunk))
        return listed

    def namespace_of(self, memory_id: int) -> str | None:
        r = self.db.execute("SELECT namespace FROM memories WHERE id=?", (memory_id,)).fetchone()
        return None if r is None else str(r[0])

    def id_of_key(self, namespace: str, key: str) -> int | None:
        r = self.db.execute("SELECT id FROM memories WHERE namespace=? AND key=?", (namespace, key)).fetchone()
        return None if r is None else int(r[0])

    def _cached_details(self, memory_ids: Sequence[int]) -> tuple[dict[int, tuple], list[list[int]]]:
        """(cached details of ``memory_ids``, the missing ids in chunks of at most _IN_CHUNK)."""
        cache = self._details
        out: dict[int, tuple] = {}
        missing = []
        for m in memory_ids:
            d = cache.get(m)
            if d is None:
                missing.append(m)
            else:
                out[m] = d
        return out, [missing[i:i + _IN_CHUNK] for i in range(0, len(missing), _IN_CHUNK)]

    def details(self, memory_ids: Sequence[int]) -> dict[int, tuple[str, str, str, float, Any, str | None]]:
        """memory id -> (text, kind, namespace, created_at, metadata, key): cached ones from
        memory, the rest in one statement per 10,000 ids."""
        out, chunks = self._cached_details(memory_ids)
        cache = self._details
        for chunk in chunks:
            fetched = {r[0]: r[1:] for r in self.db.execute(
                "SELECT id, text, kind, namespace, created_at, metadata, key FROM memories "
                f"WHERE id IN ({_ids(len(chunk))})", chunk)}
            # Metadata is decoded once, when cached: a flat dict (no nested list or dict) is
            # handed out as a shallow copy, so a caller mutating its hit's metadata never
            # changes the cache; nested metadata is decoded afresh each time. Decoding ten
            # hits' JSON per search was a third of the search path's Python time.
            fetched = {m: (*d[:4], _cached_meta(d[4]), d[5]) for m, d in fetched.items()}
            out.update(fetched)
            with self._details_lock:
                if len(cache) + len(fetched) > _DETAILS_CACHE:
                    cache.clear()  # bounded; a full clear is cheaper than LRU bookkeeping per hit
                cache.update(fetched)
        # Tuples are immutable: only metadata needs a fresh copy per caller.
        return {m: d if d[4] is None else (d[0], d[1], d[2], d[3], _meta_copy(d[4]), d[5]) for m, d in out.items()}

    def details_list(self, memory_ids: list[int]) -> list[tuple[str, str, str, float, Any, str | None]]:
        """``details`` in the order of ``memory_ids`` (every id must exist): the search
        path's form. When every id is cached (a warm store) it is one pass, no dict built."""
        cache = self._details
        out = []
        for m in memory_ids:
            d = cache.get(m)
            if d is None:
                found = self.details(memory_ids)
                return [found[m] for m in memory_ids]
            out.append(d if d[4] is None else (d[0], d[1], d[2], d[3], _meta_copy(d[4]), d[5]))
        return out

    def texts(self, memory_ids: Sequence[int]) -> dict[int, str]:
        """memory id -> text: the cached details' texts, the rest read alone (labelling reads
        thousands of texts per organisation; their metadata is not needed)."""
        cached, chunks = self._cached_details(memory_ids)
        out = {m: d[0] for m, d in cached.items()}
        for chunk in chunks:
            out.update(self.db.execute(f"SELECT id, text FROM memories WHERE id IN ({_ids(len(chunk))})", chunk))
        return out

    def namespace_rows(self, namespace: str) -> list[tuple[int, int]]:
        return self.db.execute("SELECT id, vector_row FROM memories WHERE namespace=?", (namespace,)).fetchall()

    def existing_ids(self, memory_ids: Sequence[int]) -> set[int]:
        if not memory_ids:
            return set()
        return {m for (m,) in self.db.execute(
            f"SELECT id FROM memories WHERE id IN ({_ids(len(memory_ids))})", list(memory_ids))}

    def delete_memories(self, memory_ids: Sequence[int]) -> None:
        """Remove memories with their links, atomically."""
        self.forget_cached(memory_ids)
        keys = [(m,) for m in memory_ids]
        with self.transaction():
            for table, column in (("links", "src"), ("links", "dst"), ("memories", "id")):
                self.db.executemany(f"DELETE FROM {table} WHERE {column}=?", keys)

    def record_access(self, accesses: dict[int, tuple[float, int]], cluster_hits: dict[int, float]) -> None:
        """Searches' access counts (memory id -> (last access, count)) and cluster hit times."""
        with self.transaction():
            self.db.executemany(
                "UPDATE memories SET last_accessed=?, access_count=access_count+? WHERE id=?",
                [(t, n, m) for m, (t, n) in accesses.items()])
            self.db.executemany("UPDATE clusters SET last_hit_at=? WHERE id=?", [(t, c) for c, t in cluster_hits.items()])

    def tag_memory(self, memory_id: int, links: Sequence[int], tags: Sequence[str], now: float) -> str | None:
        """Localized evolution: ``related`` links both ways and the memory's tags (in its
        metadata under ``tags``), in one transaction; memories deleted meanwhile are skipped.
        Returns the new metadata JSON when the tags changed it, else None."""
        self.forget_cached((memory_id,))
        with self.transaction():
            row = self.db.execute("SELECT metadata FROM memories WHERE id=?", (memory_id,)).fetchone()
            if row is None:
                return None
            live = self.existing_ids(list(links))
            self.db.executemany(
                "INSERT OR IGNORE INTO links (src, dst, relation, created_at) VALUES (?, ?, 'related', ?)",
                [(a, b, now) for m in links if m in live for a, b in ((memory_id, m), (m, memory_id))])
            if tags:
                meta = json.loads(row[0]) if row[0] else {}
                if not isinstance(meta, dict):
                    meta = {"value": meta}
                meta["tags"] = list(tags)
                text = json.dumps(meta, ensure_ascii=False)
                self.db.execute("UPDATE memories SET metadata=? WHERE id=?", (text, memory_id))
                return text
        return None

    def links(self, memory_id: int) -> list[tuple[int, str]]:
        return [(d, r) for d, r in self.db.execute(
            "SELECT dst, relation FROM links WHERE src=? ORDER BY dst", (memory_id,))]

    # -- assignments (legacy) -----------------------------------------------------------
    # Soft assignments live in index/assignments.bin (store.assignments); the table is where
    # stores made before it kept them, and is emptied into the file on their first open.
    def legacy_assignments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(vector rows int64[n], cluster ids int64[n, k], affinities float32[n, k]) of the
        assignments table's rows whose memory exists; -1 ids pad short rows."""
        found = self.db.execute(
            "SELECT m.vector_row, a.pairs FROM assignments a JOIN memories m ON m.id = a.memory_id "
            "ORDER BY m.vector_row").fetchall()
        pairs = [_unpack(blob) for _, blob in found]
        k = max([len(p) for p in pairs] + [1])
        ids = np.full((len(found), k), -1, np.int64)
        aff = np.zeros((len(found), k), np.float32)
        for i, p in enumerate(pairs):
            for j, (c, x) in enumerate(p):
                ids[i, j], aff[i, j] = c, x
        return np.asarray([r for r, _ in found], np.int64), ids, aff

    def has_legacy_assignments(self) -> bool:
        return self.db.execute("SELECT 1 FROM assignments LIMIT 1").fetchone() is not None

    def drop_legacy_assignments(self) -> None:
        with self.transaction():
            self.db.execute("DELETE FROM assignments")

    def renumber_clusters(self, mapping: dict[int, int]) -> None:
        """Give clusters new ids (old -> new) in the clusters table, atomically. Old and new
        ids may overlap, so rows go through negative ids first. Archived clusters (never in
        the index) keep a negative id, -1 - old, so no new id can collide with them."""
        with self.transaction():
            self.db.execute("UPDATE clusters SET id=-1-id WHERE archived=1 AND id>=0")
            self.db.executemany("UPDATE clusters SET id=? WHERE id=?", [(-1 - new, old) for old, new in mapping.items()])
            self.db.execute("UPDATE clusters SET id=-1-id WHERE id<0 AND archived=0")

    # -- clusters ----------------------------------------------------------------------
    def profiles(self) -> dict[int, tuple[str, list[str]]]:
        return {c: (s, json.loads(t)) for c, s, t in self.db.execute(
            "SELECT id, summary, tags FROM clusters WHERE archived=0")}

    def cluster_rows(self) -> list[tuple]:
        """(id, summary, tags, source, created_at, updated_at) of every live cluster."""
        return [(c, s, json.loads(t), src, ca, ua) for c, s, t, src, ca, ua in self.db.execute(
            "SELECT id, summary, tags, source, created_at, updated_at FROM clusters WHERE archived=0")]

    def cluster_ids(self) -> set[int]:
        return {c for (c,) in self.db.execute("SELECT id FROM clusters WHERE archived=0")}

    def template_clusters(self) -> set[int]:
        return {c for (c,) in self.db.execute("SELECT id FROM clusters WHERE source='template'")}

    def clusters_created_before(self, t: float) -> set[int]:
        return {c for (c,) in self.db.execute(
            "SELECT id FROM clusters WHERE created_at < ? AND source != 'template'", (t,))}

    def profile_states(self) -> list[tuple[int, str, int, str]]:
        """(id, summary, profiled_size, source) of every live cluster."""
        return self.db.execute("SELECT id, summary, profiled_size, source FROM clusters WHERE archived=0").fetchall()

    def cluster_hits(self) -> list[tuple[int, float | None, float]]:
        """(id, last_hit_at, created_at) of every live cluster."""
        return self.db.execute("SELECT id, last_hit_at, created_at FROM clusters WHERE archived=0").fetchall()

    def add_clusters(self, clusters: Sequence[tuple[int, str]], now: float,
                     profiles: dict[int, tuple[str, list[str]]], profiled: bool = False) -> None:
        """Insert (id, source) clusters with their first profile (``profiled``: counts as
        written for its current size, as template labels do)."""
        self.db.executemany(
            "INSERT OR REPLACE INTO clusters (id, summary, tags, source, created_at, updated_at, profiled_size) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(c, profiles.get(c, ("", []))[0], json.dumps(profiles.get(c, ("", []))[1]), src, now, now,
              1 if profiled else 0) for c, src in clusters])

    def drop_clusters(self, cluster_ids: Iterable[int]) -> None:
        """Remove clusters from the table. Their assignment rows stay (finding them would
        scan every assignment): ids are never reused, and readers list known clusters only."""
        with self.transaction():
            self.db.executemany("DELETE FROM clusters WHERE id=?", [(c,) for c in cluster_ids])

    def archive_clusters(self, cluster_ids: Iterable[int]) -> None:
        with self.transaction():
            self.db.executemany("UPDATE clusters SET archived=1 WHERE id=?", [(c,) for c in cluster_ids])

    def write_profiles(self, items: Sequence[tuple[int, str, list[str], int]], now: float) -> None:
        """(cluster id, summary, tags, profiled size) for each cluster."""
        with self.transaction():
            self.db.executemany(
                "UPDATE clusters SET summary=?, tags=?, updated_at=?, profiled_size=? WHERE id=?",
                [(s, json.dumps(t), now, size, c) for c, s, t, size in items])

    # -- transfer (store/transfer: export and import) ----------------------------------
    # Column lists come from the transfer record format (``store.transfer.fields``); they are
    # checked against the table's own columns before they reach a statement.
    def _columns(self, table: str, columns: Sequence[str]) -> str:
        have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
        unknown = [c for c in columns if c not in have]
        if unknown:
            raise StoreFormatError(f"{self.path}: the {table} table has no column(s) {unknown}")
        return ", ".join(columns)

    def transfer_rows(self, columns: Sequence[str], ids: Sequence[int] | None = None,
                      batch: int = 65_536) -> Iterable[list[tuple]]:
        """Batches of ``columns`` of every live and archived memory (or those of ``ids``), by
        id ascending: what an export writes."""
        names = self._columns("memories", columns)
        states = f"state IN ({LIVE}, {ARCHIVED})"
        if ids is None:
            cur = self.db.execute(f"SELECT {names} FROM memories WHERE {states} ORDER BY id")
            while rows := cur.fetchmany(batch):
                yield rows
            return
        ordered = sorted(set(int(m) for m in ids))
        for i in range(0, len(ordered), batch):
            part = ordered[i:i + batch]
            out: list[tuple] = []
            for j in range(0, len(part), _IN_CHUNK):
                chunk = part[j:j + _IN_CHUNK]
                out += self.db.execute(f"SELECT {names} FROM memories WHERE {states} AND id IN ({_ids(len(chunk))}) "
                                       "ORDER BY id", chunk).fetchall()
            if out:
                yield out

    def import_rows(self, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        """Insert memories with every column given (an import keeps ids, times and counts).
        ``_ROWS_PER_INSERT`` rows per statement: each step of a statement releases the GIL and
        takes it back, and one step per row left the writer thread waiting for the GIL behind
        the import's reader (and a tenth more SQLite work per row)."""
        names = self._columns("memories", columns)
        one = f"({_ids(len(columns))})"
        rows = list(rows)
        per = _ROWS_PER_INSERT
        full = len(rows) // per * per
        if full:
            many = ", ".join([one] * per)
            flat = itertools.chain.from_iterable
            self.db.executemany(f"INSERT INTO memories ({names}) VALUES {many}",
                                (tuple(flat(rows[i:i + per])) for i in range(0, full, per)))
        if full < len(rows):
            self.db.executemany(f"INSERT INTO memories ({names}) VALUES {one}", rows[full:])

    def transfer_clusters(self, columns: Sequence[str]) -> list[tuple]:
        """``columns`` of every live cluster, by id."""
        names = self._columns("clusters", columns)
        return self.db.execute(f"SELECT {names} FROM clusters WHERE archived=0 ORDER BY id").fetchall()

    def import_clusters(self, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        """Insert (or replace) clusters with every column given."""
        names = self._columns("clusters", columns)
        self.db.executemany(f"INSERT OR REPLACE INTO clusters ({names}) VALUES ({_ids(len(columns))})", rows)

    def ids_in_range(self, lo: int, hi: int) -> np.ndarray:
        """The memory ids in [lo, hi], ascending (an import keeping ids finds the ones it
        wrote before: one range scan per batch instead of an IN list)."""
        cur = self.db.execute("SELECT id FROM memories WHERE id BETWEEN ? AND ? ORDER BY id", (lo, hi))
        return np.fromiter((r[0] for r in cur), np.int64)

    def identities(self, memory_ids: Sequence[int]) -> dict[int, tuple[str, str | None, str]]:
        """memory id -> (namespace, key, text) of those that exist."""
        out: dict[int, tuple[str, str | None, str]] = {}
        ids = list(memory_ids)
        for i in range(0, len(ids), _IN_CHUNK):
            chunk = ids[i:i + _IN_CHUNK]
            for m, ns, key, text in self.db.execute(
                    f"SELECT id, namespace, key, text FROM memories WHERE id IN ({_ids(len(chunk))})", chunk):
                out[int(m)] = (ns, key, text)
        return out

    def memory_count(self) -> int:
        """Memory rows of any state (0: an empty store)."""
        return int(self.db.execute("SELECT COUNT(*) FROM memories").fetchone()[0])
