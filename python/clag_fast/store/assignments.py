"""Soft assignments on disk: per vector row, its top ``soft_k`` (cluster id, affinity) pairs,
best first, in ``index/assignments.bin``, memory-mapped and written in place.

Why a file and not a database table: every add writes its rows' assignments and every split,
merge and drift re-assignment rewrites its members' ones (about two records per added memory
into a 300k-1M store of blob vectors). As SQLite upserts of packed blobs they were a fifth of
ingest's CPU (BENCHMARKS.md, Ingest); here a wave is two numpy stores into the mapping.

Who reads it: ``get``/``get_many``/``memories`` (a memory's clusters and affinities), and
recovery, which rebuilds a lost cluster file from it. It is synced with the cluster state
(``StoreState.flush_index``). What a crash can cost: records written since the last sync, on
a power loss (a killed process loses nothing: the pages are the kernel's). Open then makes
the records agree with the index (``settle``), so they are never worse than the clusters.

Layout (little endian): a 64-byte header, magic ``CLAGASG\\0`` | version u32 | k u32, then
one record per vector row: k x i64 (cluster id + 1; 0 = none), k x f32 affinity. Vector rows
are append-only and never reused, so a row's record stays where it is.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"CLAGASG\0"
VERSION = 1
HEADER = 64
#: Records the file grows by at least (it grows by doubling, like the vector file).
MIN_GROWTH = 4096


def _dtype(k: int) -> np.dtype:
    return np.dtype([("ids", "<i8", (k,)), ("aff", "<f4", (k,))])


def _header(k: int) -> bytes:
    return struct.pack("<8sII", MAGIC, VERSION, k).ljust(HEADER, b"\0")


class Assignments:
    """The records of one store (see the module docstring). Writes happen under the store's
    write lock; reads copy out, so a growth (a new mapping) never invalidates one."""

    def __init__(self, path: Path, k: int, read_only: bool = False) -> None:
        if k < 1:
            raise ValueError(f"soft_k must be >= 1, got {k}")
        self.path = path
        self.read_only = read_only
        self.k = k
        # (cluster ids + 1, affinities), one pair so a reader never sees one array of a new
        # mapping with the other of the old (``get`` reads without the store's lock).
        self._rec: tuple[np.ndarray, np.ndarray] = _empty(k)
        self._mm: np.memmap | None = None
        # Read-only without a file (a store made before it, not yet opened by a writer): the
        # records live in memory (``recovery.adopt_legacy_assignments`` fills them).
        self._in_memory = read_only and not path.exists()
        if path.exists():
            try:
                self._map(path)
            except ValueError as e:
                if read_only:
                    log.warning("%s cannot be read (%s): memories show no clusters until a writer opens the store",
                                path, e)
                    return
                aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
                path.rename(aside)
                log.warning("%s cannot be read (%s): moved to %s; assignments are rebuilt from the clusters",
                            path, e, aside.name)
                self._create()
            else:
                if self.k != k and not read_only:
                    self._convert(k)
        elif not read_only:
            self._create()

    # -- the file ----------------------------------------------------------------------------
    def _create(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(_header(self.k))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._map(self.path)

    def _map(self, path: Path) -> None:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(HEADER)
        if len(head) < HEADER:
            raise ValueError("truncated header")
        magic, version, k = struct.unpack_from("<8sII", head)
        if magic != MAGIC or version != VERSION or not 1 <= k <= 1024:
            raise ValueError("not an assignments file of this version")
        dt = _dtype(k)
        cap = (size - HEADER) // dt.itemsize
        self.k = k
        if cap == 0:
            self._mm = None
            self._rec = _empty(k)
            return
        self._mm = np.memmap(path, dtype=dt, mode="r" if self.read_only else "r+", offset=HEADER, shape=(cap,))
        self._rec = (self._mm["ids"], self._mm["aff"])

    def _convert(self, k: int) -> None:
        """Rewrite the records with ``k`` columns (``soft_k`` changed since the file was made)."""
        ids, aff = (a[:, :k].copy() for a in self._rec)
        n = len(ids)
        tmp = self.path.with_name(self.path.name + ".tmp")
        self._mm = None
        self.k = k
        with open(tmp, "wb") as f:
            f.write(_header(k))
            rec = np.zeros(n, _dtype(k))
            rec["ids"][:, : ids.shape[1]] = ids
            rec["aff"][:, : aff.shape[1]] = aff
            f.write(rec.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._map(self.path)

    def _ensure(self, n: int) -> None:
        cap = self.capacity
        if n <= cap:
            return
        new = max(n, 2 * cap, MIN_GROWTH)
        if self._in_memory:
            ids, aff = self._rec
            self._rec = (np.concatenate([ids, np.zeros((new - cap, self.k), np.int64)]),
                         np.concatenate([aff, np.zeros((new - cap, self.k), np.float32)]))
            return
        os.truncate(self.path, HEADER + new * _dtype(self.k).itemsize)
        self._map(self.path)

    @property
    def capacity(self) -> int:
        return len(self._rec[0])

    # -- records -----------------------------------------------------------------------------
    def write(self, rows: np.ndarray, cluster_ids: np.ndarray, affinities: np.ndarray) -> None:
        """Rows' assignments: cluster ids int[n, m] (best first, -1 = none) and affinities
        float[n, m]; columns past ``k`` are dropped, missing ones are none. A row given twice
        takes its last record."""
        rows = np.asarray(rows, np.int64)
        if len(rows) == 0:
            return
        if self.read_only and not self._in_memory:
            raise PermissionError(f"{self.path} is open read-only")
        ids = np.asarray(cluster_ids, np.int64).reshape(len(rows), -1)
        aff = np.asarray(affinities, np.float32).reshape(len(rows), -1)
        if int(rows.min()) < 0:
            raise ValueError(f"vector rows must be >= 0, got {int(rows.min())}")
        top = int(rows.max())
        if len(rows) > 1 and _repeats(rows, top):
            # Last occurrence of each row: numpy leaves the order of repeated stores unsaid.
            _, last = np.unique(rows[::-1], return_index=True)
            keep = len(rows) - 1 - last
            rows, ids, aff = rows[keep], ids[keep], aff[keep]
        self._ensure(top + 1)
        m = min(ids.shape[1], self.k)
        enc = np.zeros((len(rows), self.k), np.int64)
        enc[:, :m] = np.where(ids[:, :m] >= 0, ids[:, :m] + 1, 0)
        vals = np.zeros((len(rows), self.k), np.float32)
        vals[:, :m] = np.where(ids[:, :m] >= 0, aff[:, :m], 0.0)
        ids_out, aff_out = self._rec
        ids_out[rows] = enc
        aff_out[rows] = vals

    def read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cluster ids int64[n, k] with -1 for none, affinities float32[n, k]) of ``rows``;
        rows never written have none."""
        rows = np.asarray(rows, np.int64)
        ids = np.full((len(rows), self.k), -1, np.int64)
        aff = np.zeros((len(rows), self.k), np.float32)
        have, vals = self._rec
        inside = rows < len(have)
        at = rows[inside]
        ids[inside] = have[at] - 1
        aff[inside] = vals[at]
        return ids, aff

    def pairs(self, rows: list[int]) -> list[list[tuple[int, float]]]:
        """Per row, its (cluster id, affinity) pairs, best first."""
        ids, aff = self.read(np.asarray(rows, np.int64))
        return [[(c, a) for c, a in zip(i, f) if c >= 0] for i, f in zip(ids.tolist(), aff.tolist())]

    def clear(self) -> None:
        """Forget every record (the index lost its clusters: every stored one is stale)."""
        if self.capacity and not self.read_only:
            self._rec[0][:] = 0

    def renumber(self, mapping: dict[int, int]) -> None:
        """Give clusters new ids (old -> new); pairs of clusters not in ``mapping`` are removed."""
        n = self.capacity
        if n == 0 or (self.read_only and not self._in_memory):
            return
        every = np.arange(n, dtype=np.int64)
        self.write(every, *renumbered(*self.read(every), mapping))

    def flush(self, durable: bool = True) -> None:
        """Sync the records to disk (``durable``); without it the kernel writes them back."""
        if durable and self._mm is not None and not self.read_only:
            self._mm.flush()

    def close(self) -> None:
        self.flush()
        self._mm = None
        self._rec = _empty(self.k)


def _empty(k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)


def _repeats(rows: np.ndarray, top: int) -> bool:
    """Whether ``rows`` (non-negative, at most ``top``) holds a row twice. Adds give ascending
    rows; re-assignment waves unique ones in cluster order, checked with a bitmap (a sort of
    a 100k-row wave cost more than writing it)."""
    if (np.diff(rows) > 0).all():
        return False
    seen = np.zeros(top + 1, bool)
    seen[rows] = True
    return int(np.count_nonzero(seen)) < len(rows)


def renumbered(ids: np.ndarray, aff: np.ndarray, mapping: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Cluster ids (-1 = none) through ``mapping`` (old -> new), pairs of other clusters
    dropped, each row's remaining pairs still best first."""
    if not mapping:
        return np.full_like(ids, -1), np.zeros_like(aff)
    old = np.asarray(sorted(mapping), np.int64)
    new = np.asarray([mapping[o] for o in old.tolist()], np.int64)
    at = np.minimum(np.searchsorted(old, ids), len(old) - 1)
    ok = (ids >= 0) & (old[at] == ids)
    order = np.argsort(~ok, axis=1, kind="stable")
    out = np.take_along_axis(np.where(ok, new[at], -1), order, axis=1)
    return out, np.take_along_axis(np.where(ok, aff, 0.0).astype(np.float32), order, axis=1)
