"""SQLite schema of a store directory, with versioned migrations.

The database holds everything but the vectors: memory texts and metadata, cluster profiles,
soft assignments and links. Vectors and cluster centres live in the native index beside it
(``VectorIndex``); ``memories.vector_row`` is the join key.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

APP_ID = "clag_fast"
SCHEMA_VERSION = 1

# Memory states. Archived memories are kept but never searched; deleted ones keep their row
# only so that their vector row is never reused.
LIVE, ARCHIVED, DELETED = 0, 1, 2

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
);
CREATE TABLE assignments (
    memory_id  INTEGER NOT NULL REFERENCES memories (id),
    rank       INTEGER NOT NULL,
    cluster_id INTEGER NOT NULL,
    affinity   REAL    NOT NULL,
    PRIMARY KEY (memory_id, rank)
) WITHOUT ROWID;
CREATE INDEX assignments_cluster ON assignments (cluster_id);
CREATE TABLE links (
    src        INTEGER NOT NULL REFERENCES memories (id),
    dst        INTEGER NOT NULL REFERENCES memories (id),
    relation   TEXT    NOT NULL,
    created_at REAL    NOT NULL,
    PRIMARY KEY (src, dst, relation)
) WITHOUT ROWID;
INSERT INTO meta (key, value) VALUES ('app', 'clag_fast');
"""

# MIGRATIONS[v] upgrades a database at version v to v + 1. Version 0 is an empty file.
MIGRATIONS: dict[int, str] = {0: _V1}


class StoreFormatError(ValueError):
    """The directory holds something that is not a clag_fast store we can open."""


def connect(path: Path, *, read_only: bool = False) -> sqlite3.Connection:
    """Open (creating and migrating when writable) the store database at ``path``."""
    if read_only:
        uri = f"file:{path}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
    else:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        if not read_only:
            # WAL lets readers in other processes see committed data while one process writes.
            conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives a process crash (SIGKILL) at any point; only an OS
            # crash or power loss can lose the last transactions (StoreConfig.fsync covers that).
            conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        _check_and_migrate(conn, path, read_only)
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
        row = conn.execute("SELECT value FROM meta WHERE key='app'").fetchone()
        if row is None or row[0] != APP_ID:
            raise StoreFormatError(f"{path} is an SQLite database of another application")
    if version == SCHEMA_VERSION:
        return
    if read_only:
        raise StoreFormatError(f"{path} needs a schema migration; open it writable once")
    for v in range(version, SCHEMA_VERSION):
        # executescript commits first, so run each migration inside an explicit transaction.
        conn.executescript(f"BEGIN;\n{MIGRATIONS[v]}\nPRAGMA user_version={v + 1};\nCOMMIT;")


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
