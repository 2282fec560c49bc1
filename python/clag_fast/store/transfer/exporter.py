"""Export: a store's memories (every field of ``fields.FIELDS``, vectors as stored, soft
assignments) and its clusters (profiles, anchors) written as JSONL or Parquet.

Runs under the store's read lock (the caller's): no write lands while the export reads, so
the file is one consistent state. Texts and columns come from the catalog's read connection
in batches by id; vectors straight from the memory-mapped vector file.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import IO, Any, Callable

import numpy as np

from clag_fast.store.catalog import ARCHIVED, Catalog
from clag_fast.store.state import StoreState
from clag_fast.store.transfer import fields as record
from clag_fast.store.transfer import jsonl, parquet
from clag_fast.store.transfer.fields import ANCHOR, ANCHORED, CLUSTER_FIELDS, FORMAT, VERSION, encode_vectors, no_gc

BATCH = 65_536


#: Meta key of a store's identity, written by its first export.
STORE_ID = "store_id"


def store_id(catalog: Catalog, read_only: bool) -> str:
    """The store's identity (a random id recorded at its first export; a read-only store
    that has none gets a fresh one per export)."""
    found = catalog.meta(STORE_ID)
    if found is None:
        found = uuid.uuid4().hex
        if not read_only:
            catalog.set_meta(STORE_ID, found)
    return found


def format_of(path: Path, fmt: str | None) -> str:
    """"jsonl" or "parquet": ``fmt``, or the file's suffix."""
    fmt = fmt or {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}.get(
        path.suffix.lower())
    if fmt not in ("jsonl", "parquet"):
        raise ValueError(f"{path}: say format='jsonl' or 'parquet' (or name the file .jsonl / .parquet)")
    return fmt


def export(state: StoreState, reader: Catalog, out: Path | IO[str], *, fmt: str, source_id: str,
           namespace: str | None = None, cluster: int | None = None,
           progress: Callable[[int, int | None], None] | None = None, batch: int = BATCH) -> dict[str, Any]:
    """Write the store (or the memories of ``namespace``, or the primary members of
    ``cluster``) to ``out``: a path, or a file object (binary or text) for JSONL. ``source_id``: the
    store's identity, the header's ``store_id``: every export of one store carries it, so importing a later export of the same store skips what an earlier one
    stored. Returns counts."""
    t0 = time.perf_counter()
    rows_t = state.rows
    ids = None
    if namespace is not None or cluster is not None:
        n = rows_t.n
        pick = rows_t.memory_id[:n] >= 0  # live and archived memories (dead rows hold -1)
        if namespace is not None:
            code = rows_t.code("namespace", namespace, create=False)
            pick &= rows_t.namespace[:n] == code
        if cluster is not None:
            known = set(state.index.cluster_ids().tolist())
            if int(cluster) not in known:
                raise KeyError(f"no cluster with id {cluster}")
            members = np.zeros(n, bool)
            members[state.index.members(int(cluster))] = True
            pick &= members
        ids = rows_t.memory_id[:n][pick]
        total = int(len(ids))
    else:
        total = reader.count_state(0) + reader.count_state(ARCHIVED)
    clusters = _cluster_records(state, reader, ids, cluster)
    dim = state.index.dim
    header = {"format": FORMAT, "version": VERSION, "store_id": source_id, "dim": dim, "memories": total,
              "clusters": len(clusters), "soft_k": state.config.soft_k, "exported_at": time.time()}
    if isinstance(out, (str, Path)):
        out = Path(out)
        if fmt == "parquet":
            writer: Any = parquet.Writer(out, dim)
            close = writer.close
        else:
            f = open(out, "wb")
            writer, close = jsonl.Writer(f), f.close
    else:
        if fmt != "jsonl":
            raise ValueError("a file object takes format 'jsonl'; Parquet needs a path")
        writer, close = jsonl.Writer(out), (lambda: None)
    carried = np.asarray(sorted(c["id"] for c in clusters), np.int64)
    columns = [f.column for f in record.FIELDS] + ["vector_row"]
    state_at = next(i for i, f in enumerate(record.FIELDS) if f.type == "archived")
    vectors = state.index.vectors()
    done = 0
    with no_gc():
        try:
            writer.header(header, clusters)
            for part in reader.transfer_rows(columns, ids=None if ids is None else ids.tolist(), batch=batch):
                cols = list(zip(*part))  # one transposition; the writers work column by column
                vrows = np.asarray(cols[-1], np.int64)
                block = _rows_of(vectors, vrows)
                cids, aff = _carried_pairs(*state.assignments.read(vrows), carried)
                archived = (np.asarray(cols[state_at]) == ARCHIVED).tolist()
                writer.memories(cols, block, cids, aff, archived)
                done += len(part)
                if progress is not None:
                    progress(done, total)
        finally:
            close()
    return {"memories": done, "clusters": len(clusters), "seconds": round(time.perf_counter() - t0, 3),
            "store_id": source_id}


def _rows_of(vectors: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``vectors[rows]``: a view of the memory-mapped file where the rows run consecutively
    (a store filled in order, exported by id), else a gathered copy. The view spares a copy
    of every vector into fresh pages before it is encoded or handed to Arrow."""
    if len(rows) and int(rows[-1]) - int(rows[0]) == len(rows) - 1 and bool((np.diff(rows) == 1).all()):
        return vectors[int(rows[0]):int(rows[-1]) + 1]
    return vectors[rows]


def _carried_pairs(ids: np.ndarray, aff: np.ndarray, carried: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs of clusters the export carries, best first, -1 padding at the end: the
    records keep pairs of clusters dropped or archived since (``get`` hides them), which an
    import could not place."""
    gone = (ids >= 0) & ~np.isin(ids, carried)
    if not gone.any():
        return ids, aff
    ids = ids.copy()
    ids[gone] = -1
    order = np.argsort(ids < 0, axis=1, kind="stable")
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(aff, order, axis=1)


def _cluster_records(state: StoreState, reader: Catalog, ids: np.ndarray | None, cluster: int | None) -> list[dict[str, Any]]:
    """The cluster records an export carries: every live cluster, or (a subset exported)
    those that are the primary cluster of an exported memory. Anchored ones (SLM topics,
    template labels) with their centre."""
    idx = state.index
    live_ids = idx.cluster_ids()
    if ids is not None:
        rows = state.rows
        wanted_rows = np.flatnonzero(np.isin(rows.memory_id[: rows.n], ids))
        primaries = idx.cluster_of(wanted_rows) if len(wanted_rows) else np.zeros(0, np.int64)
        keep = set(np.unique(primaries[primaries >= 0]).tolist())
        if cluster is not None:
            keep.add(int(cluster))
    else:
        keep = set(live_ids.tolist())
    centres = None
    out = []
    for values in reader.transfer_clusters(CLUSTER_FIELDS):
        rec = dict(zip(CLUSTER_FIELDS, values))
        cid = rec["id"]
        if cid not in keep:
            continue
        rec["tags"] = json.loads(rec["tags"])
        if rec["source"] in ANCHORED:
            if centres is None:
                centres = idx.centres()
            at = int(np.searchsorted(live_ids, cid))
            if at < len(live_ids) and live_ids[at] == cid:
                rec[ANCHOR] = encode_vectors(centres[at:at + 1])[0]
        out.append(rec)
    return out
