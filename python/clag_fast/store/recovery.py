"""Recovery: what a store does on open so that a crash, a lost file or a corrupt one never
costs data, and never silently hides it.

* The cluster file (``index/clusters.bin``) is derived state: a corrupt or unreadable one is
  moved aside (``clusters.bin.corrupt-<time>``) with a warning and the clusters are rebuilt
  from the database's clusters, the assignment records and the vectors (``rebuild_clusters``).
* The assignment records (``index/assignments.bin``) follow the index: an unreadable file is
  moved aside and rebuilt, and records a power loss took are rewritten (``settle_assignments``).
* The database is the source of truth for which memories exist: a database that is missing,
  empty or brand new beside a vector file holding rows is refused, naming both files, rather
  than opened as an empty store.
* After any crash, ``reconcile`` makes the index's cluster state and the database agree.
* The lexical index (``index/lexical.bin``) is derived state too: loaded and brought up to
  date from the database, or rebuilt from it with a warning (``open_lexical``).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np

from clag_fast.errors import StoreFormatError
from clag_fast.index import VectorIndex
from clag_fast.store import routing
from clag_fast.store.lexical import LexicalIndex
from clag_fast.store.organize import reassign, sync_clusters
from clag_fast.store.state import StoreState

log = logging.getLogger(__name__)

DB_NAME = "memories.db"
INDEX_DIR = "index"
VECTORS = "vectors.f32"
CLUSTERS = "clusters.bin"
LEXICAL = "lexical.bin"


def vector_file_has_rows(path: Path) -> bool:
    """Whether ``<store>/index/vectors.f32`` commits at least one row (read from its header)."""
    f = path / INDEX_DIR / VECTORS
    if not f.exists() or f.stat().st_size == 0:
        return False
    try:
        return VectorIndex.committed_rows(path / INDEX_DIR) > 0
    except (OSError, ValueError):
        return True  # unreadable but not empty: treat as data, never as a blank store


def refuse_blank_database(path: Path, db_is_new: bool) -> None:
    """A database that is new (missing, 0 bytes, or without the store's keys) beside a vector
    file with rows means the database was lost: opening it as new would hide every memory."""
    if db_is_new and vector_file_has_rows(path):
        raise StoreFormatError(
            f"{path / DB_NAME} is missing or empty but {path / INDEX_DIR / VECTORS} holds vectors: "
            "the database that says which memories they are was lost or truncated. Restore "
            f"{DB_NAME} from a backup, or move the directory aside to start a new store"
        )


def open_index(path: Path, dim: int, read_only: bool, rows_needed: int = 0) -> VectorIndex:
    """Open the vector index; a cluster file that cannot be read is moved aside (writable
    stores) so the index opens unclustered and ``rebuild_clusters`` restores it.

    ``rows_needed``: the rows the database references (its highest row + 1). A vector file
    that is missing or commits fewer rows is refused, naming both files, before anything
    opens it for writing: a writable index trims the file to its committed rows when it
    closes, so the rows past a lost commit (a spoiled header slot falls back to the previous
    one) would otherwise be cut off for good by the very open that refuses the store."""
    vf = path / INDEX_DIR / VECTORS
    if rows_needed > 0:
        if not vf.exists():
            _refuse_rows(path, 0, rows_needed)
        # The header alone: a full read-only open loads the cluster state too (0.8 s at 1M).
        if (n := VectorIndex.committed_rows(path / INDEX_DIR)) < rows_needed:
            _refuse_rows(path, n, rows_needed)
    return _open(path, dim, read_only, writable_store=not read_only)


def _refuse_rows(path: Path, n: int, rows_needed: int) -> None:
    raise StoreFormatError(
        f"{path / INDEX_DIR / VECTORS} commits {n} vector rows but {path / DB_NAME} references "
        f"{rows_needed}: the vector file was lost, truncated, replaced or its header damaged. It is "
        "left as it is; restore it from a backup"
    )


def _open(path: Path, dim: int, read_only: bool, writable_store: bool) -> VectorIndex:
    try:
        return VectorIndex.open(path / INDEX_DIR, dim=dim, read_only=read_only)
    except OSError as e:
        cfile = path / INDEX_DIR / CLUSTERS
        if "cluster state" not in str(e) or not cfile.exists():
            raise
        if not writable_store:
            raise StoreFormatError(
                f"{cfile} cannot be read ({e}); open the store writable once to rebuild it"
            ) from e
        aside = cfile.with_name(f"{CLUSTERS}.corrupt-{int(time.time())}")
        cfile.rename(aside)
        log.warning("%s cannot be read (%s): moved to %s; clusters are rebuilt from the database", cfile, e, aside.name)
        return VectorIndex.open(path / INDEX_DIR, dim=dim, read_only=read_only)


def rebuild_clusters(state: StoreState) -> int:
    """Recreate the clusters of an index that lost its cluster file, from the database's
    clusters and the assignment records: one cluster per live cluster row, members from each
    memory's record (rank 0 is the primary; a lower rank is a secondary membership within
    ``spill_margin`` of it, as routing decides). Cluster ids are new (the index numbers them);
    the database and the records are renumbered to match. Returns the clusters rebuilt."""
    idx, cfg, rows = state.index, state.config, state.rows
    known = sorted(state.catalog.cluster_ids())
    if not known or len(idx.cluster_ids()):
        return 0
    mapping = {old: idx.new_cluster() for old in known}
    # Every record renumbered (archived rows' too: get() shows their clusters), then the live
    # rows' records read back to place them.
    state.assignments.renumber(mapping)
    live = rows.live_rows()
    ids, aff = state.assignments.read(live)
    placed = ids[:, 0] >= 0
    if placed.any():
        idx.assign(live[placed], routing.memberships(ids[placed], aff[placed], cfg.soft_k, cfg.spill_margin))
    state.catalog.renumber_clusters(mapping)
    state.profiles = state.catalog.profiles()
    # Empty clusters (their members were all deleted) would only waste probes.
    ids, sizes = idx.cluster_ids(), idx.cluster_sizes()
    templates = state.catalog.template_clusters()
    for cid in ids[sizes == 0].tolist():
        if cid not in templates:
            idx.drop_cluster(cid)
    state.flush_index()
    log.warning("%s: rebuilt %d clusters from the database and the assignment records", state.path, len(mapping))
    return len(mapping)


def adopt_legacy_assignments(state: StoreState) -> int:
    """A store made before ``index/assignments.bin`` kept its assignments in the database:
    copy them into the file, make it durable, then empty the table (a crash in between
    copies them again on the next open). A read-only store holds them in memory instead.
    Returns the records copied."""
    if not state.catalog.has_legacy_assignments():
        return 0
    rows, ids, aff = state.catalog.legacy_assignments()
    state.assignments.write(rows, ids, aff)
    if state.read_only:
        return len(rows)  # held in memory (no file to write): the next writer moves them
    state.assignments.flush()
    state.catalog.drop_legacy_assignments()
    log.info("%s: %d assignments moved from the database to the assignment records", state.path, len(rows))
    return len(rows)


def settle_assignments(state: StoreState) -> int:
    """Make every live row's record agree with the index on its primary cluster. They part
    only after a power loss took records written since the last sync, or when the file was
    lost: such a row gets its index primary with that centre's similarity as its affinity.
    Returns the records rewritten."""
    idx, rows = state.index, state.rows
    ids = idx.cluster_ids()
    live = rows.live_rows()
    if len(ids) == 0 or len(live) == 0:
        return 0
    primary = idx.cluster_of(live)
    recorded, _ = state.assignments.read(live)
    off = np.flatnonzero((primary >= 0) & (recorded[:, 0] != primary))
    if len(off) == 0:
        return 0
    rows_off, cids = live[off], primary[off]
    centres = idx.centres()[np.searchsorted(ids, cids)]  # cluster_ids() is ascending
    sims = np.einsum("ij,ij->i", centres, idx.vectors()[rows_off]).astype(np.float32)
    state.assignments.write(rows_off, cids[:, None], sims[:, None])
    log.warning("%s: %d assignment records rebuilt from the clusters", state.path, len(off))
    return int(len(off))


def reconcile(state: StoreState) -> dict[str, int]:
    """After open: make the index's cluster state, the assignment records and the database
    agree.

    The cluster state on disk is the last one saved (organisation, flush, close); memories
    added after it are unassigned in the index, and clusters opened after it are unknown to
    it. Unknown clusters are dropped from the database; rows the index does not place, and
    rows it places where their assignment record does not (organisations since the save moved
    them), go where their assignment record says when it names clusters the index has (the
    record was written with the row's last assignment: an add's routing, an organisation, an
    import's exported clusters), else they are routed again; rows the database no longer
    holds are removed from the clusters, and the records follow the index
    (``settle_assignments``).
    """
    idx, rows = state.index, state.rows
    live = rows.live_rows()
    with state.catalog.transaction():
        sync_clusters(state, time.time())
    fixed = {"restored": 0, "moved": 0, "rerouted": 0, "unassigned": 0, "records": 0}
    n_idx = len(idx)
    if n_idx:
        placed = idx.cluster_of(np.arange(n_idx, dtype=np.int64))
        dead = np.flatnonzero((placed >= 0) & ~rows.live[:n_idx])
        if len(dead):
            idx.unassign(dead)
            fixed["unassigned"] = int(len(dead))
        if len(idx.cluster_ids()):
            lost = live[placed[live] < 0]
            moved = _moved_since_save(state, live, placed[live])
            todo = np.concatenate([lost, moved])
            if len(todo):
                rest = place_from_records(state, todo)
                fixed["restored"] = int(len(lost) - np.isin(rest, lost).sum())
                fixed["moved"] = int(len(moved) - np.isin(rest, moved).sum())
                if len(rest):
                    fixed["rerouted"] = reassign(state, rest)
        elif len(live):
            # No clusters in the index: every stored assignment is stale.
            state.assignments.clear()
    fixed["records"] = settle_assignments(state)
    if any(fixed.values()):
        state.flush_index()
        log.warning("recovered %s: %s", state.path, fixed)
    return fixed


def _moved_since_save(state: StoreState, live: np.ndarray, placed: np.ndarray) -> np.ndarray:
    """The ``live`` rows the saved state places (``placed``: their primary there) whose
    assignment record names another primary: an organisation after the save moved them (a
    merge, a split, a drift). The record is the newer (records are written with every
    assignment, the state only at saves), and left in its old cluster such a row can sit
    under a centre that the rows coming back to that cluster carry away from it."""
    recorded, _ = state.assignments.read(live)
    first = recorded[:, 0]
    return live[(placed >= 0) & (first >= 0) & (first != placed)]


def place_from_records(state: StoreState, rows: np.ndarray) -> np.ndarray:
    """Assign ``rows`` (unplaced in the index) as their assignment records say, where the
    record's first cluster is one the index has (pairs of clusters it lacks are dropped).
    Returns the rows left unplaced."""
    idx, cfg = state.index, state.config
    ids, aff = state.assignments.read(rows)
    known = (ids >= 0) & np.isin(ids, idx.cluster_ids())
    usable = known[:, 0]
    if usable.any():
        ids = np.where(known, ids, -1)[usable]
        aff = aff[usable]
        at = rows[usable]
        idx.assign(at, routing.memberships(ids, aff, cfg.soft_k, cfg.spill_margin))
        state.assignments.write(at, ids, aff)
    return rows[~usable]


def lexical_path(path: Path) -> Path:
    """Where a store keeps its lexical index."""
    return path / INDEX_DIR / LEXICAL


class LexicalPreload:
    """``index/lexical.bin`` read in a background thread, started at open before the row
    table is read: the native load releases the GIL, so the two overlap (at 1M memories a
    1.1 s load beside a 1.9 s read). ``result()`` waits: (index, None), (None, the OSError's
    message) for an unreadable file, (None, None) when there is none. ``background=False``
    reads it at once (nothing to overlap: no thread)."""

    def __init__(self, path: Path, background: bool = True) -> None:
        self._out: tuple[LexicalIndex | None, str | None] = (None, None)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if not path.exists():
            return
        if background:
            self._thread = threading.Thread(target=self._load, args=(path,), name="clag-fast-lexical-load",
                                            daemon=True)
            self._thread.start()
        else:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            self._out = (LexicalIndex.load(path), None)
        except OSError as e:
            self._out = (None, str(e))
        except BaseException as e:  # anything else fails the open, as a load in place would
            self._error = e

    def result(self) -> tuple[LexicalIndex | None, str | None]:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self._out


def open_lexical(state: StoreState, preload: LexicalPreload | None = None) -> LexicalIndex:
    """The BM25 index of an opened store: ``index/lexical.bin`` brought up to date from the
    database, or rebuilt from it.

    The file covers the vector rows below its watermark as they were at its save (flush,
    close). Rows after the watermark are the adds since: their texts are read from the
    database and indexed. Rows that died since (deletes, archives, replaced texts) leave the
    statistics by a sync with the row table. A file that is missing (a store written before
    the file existed, or one never flushed), damaged, foreign, covering rows the vector file
    lacks, or lacking live rows it should cover is rebuilt from the database with a warning,
    never an error. Nothing is written here: read-only stores never write the file, writable
    ones save it at their next flush or close.
    """
    rows = state.rows
    live = rows.live[: rows.n]
    path = lexical_path(state.path)
    lex, reason = (preload or LexicalPreload(path, background=False)).result()
    if lex is not None:
        if len(lex) > len(state.index):
            reason = f"it covers {len(lex)} vector rows but the vector file holds {len(state.index)}"
        else:
            missing = lex.sync(live)[2]
            if missing:
                reason = f"{missing} live memories below its watermark are not in it"
    elif reason is None and live.any():
        reason = "it is missing"
    if reason is not None:
        log.warning("%s: %s; the lexical index is rebuilt from the database", path, reason)
        lex = None
    if lex is None:
        lex = LexicalIndex()
        data = state.catalog.live_texts()
        if data:
            at = np.fromiter((r for r, _ in data), np.int64, len(data))
            lex.build(at, [t for _, t in data], _namespace_names(state, at))
    else:
        tail = np.flatnonzero(live[len(lex):]) + len(lex)
        if len(tail):
            mids = rows.memory_id[tail].tolist()
            details = state.details(mids)
            lex.build(tail, [details[m][0] for m in mids], [details[m][2] for m in mids])
    lex.sync(live, rows.version)
    return lex


def _namespace_names(state: StoreState, at: np.ndarray) -> list[str]:
    """The namespace of each row in ``at``, from the row table's codes."""
    codes = state.rows.namespace[at]
    uniq, first = np.unique(codes, return_index=True)
    names = {int(c): state.rows.name("namespace", int(at[i])) for c, i in zip(uniq.tolist(), first.tolist())}
    return [names[c] for c in codes.tolist()]
