"""VectorIndex: the Python facade over the native core (``clag_fast._clag_fast``).

One directory holds ``vectors.f32`` (memory-mapped, append-only rows, L2-normalised on
write) and ``clusters.bin`` (cluster state, replaced atomically by :meth:`VectorIndex.flush`).
Row ids are int64, consecutive from 0 and never reused; cluster ids are int64 >= 0, stable and
never reused.

This module owns input coercion (float32, C-contiguous, 2-D), validation with messages that
name the problem, and the docstrings. Errors: ``ValueError`` for bad shapes, dtypes, values
and parameters; ``KeyError`` for unknown row or cluster ids; ``OSError`` for I/O problems and
corrupt, foreign or other-version files (which are never modified).

Threading: every heavy call releases the GIL; the index takes a reader/writer lock inside,
so searches run in parallel with each other and serialise with writes. Do not mutate an
array passed in while the call that received it is running.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import numpy as np

from clag_fast import _clag_fast

__all__ = ["VectorIndex", "SearchResult"]

_Mode = Literal["two_stage", "flat"]


class SearchResult:
    """Batch search results: preallocated arrays, one row per query.

    Attributes:
        ids: int64[q, k] row ids, best first, -1 padding.
        scores: float32[q, k] cosine (times the row weight when weights were given), -inf padding.
        clusters: int64[q, k] primary cluster of each hit, -1 for unassigned rows and padding.
        counts: int64[q] hits found (< k when fewer rows are eligible).
        scanned: int64[q] rows scored in stage 2 (every eligible row for a flat search).
        probed: int64[q, n_probe] clusters probed in stage 1, best first, -1 padding (fewer
            than n_probe with adaptive probing; width 0 for a flat search).
    """

    __slots__ = ("ids", "scores", "clusters", "counts", "scanned", "probed")

    def __init__(self, ids, scores, clusters, counts, scanned, probed) -> None:
        self.ids: np.ndarray = ids
        self.scores: np.ndarray = scores
        self.clusters: np.ndarray = clusters
        self.counts: np.ndarray = counts
        self.scanned: np.ndarray = scanned
        self.probed: np.ndarray = probed

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __repr__(self) -> str:
        return f"SearchResult(queries={len(self)}, k={self.ids.shape[1]}, counts={self.counts.tolist()[:8]})"


def _as_matrix(x: Any, dim: int, name: str) -> np.ndarray:
    """(n, dim) or (dim,) real numbers -> C-contiguous float32 (n, dim)."""
    if type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous and x.shape[-1:] == (dim,) and 0 < x.ndim <= 2:
        # The common case on the query path: nothing to convert (saves ~1.5 us per call).
        return x.reshape(1, dim) if x.ndim == 1 else x
    a = np.asarray(x)
    if a.dtype.kind not in "fiu":
        raise ValueError(f"{name} must hold real numbers, got dtype {a.dtype}")
    if a.ndim == 1:
        a = a.reshape(1, -1)
    if a.ndim != 2:
        raise ValueError(f"{name} must be 1-D (dim,) or 2-D (n, dim), got shape {a.shape}")
    if a.shape[1] != dim:
        raise ValueError(f"{name} has {a.shape[1]} columns but the index has dim {dim}")
    with np.errstate(over="ignore"):  # float64 beyond float32 range -> inf -> rejected natively
        return np.ascontiguousarray(a, dtype=np.float32)


#: Alignment of gathered row blocks: a cache line (and of the memory-mapped rows).
_ALIGN = 64


def _take_aligned(v: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``v[rows]`` (2-D float32) in a fresh C-contiguous array starting on an ``_ALIGN``
    boundary (rows start on one too when a row's size is a multiple of it, as at dim 384)."""
    shape = (len(rows), v.shape[1])
    nbytes = shape[0] * shape[1] * 4
    buf = np.empty(nbytes + _ALIGN, np.uint8)
    start = -buf.ctypes.data % _ALIGN
    out = buf[start:start + nbytes].view(np.float32).reshape(shape)
    np.take(v, rows, axis=0, out=out)
    return out


def _as_vector(x: Any, dim: int, name: str) -> np.ndarray:
    a = _as_matrix(x, dim, name)
    if a.shape[0] != 1:
        raise ValueError(f"{name} must be one vector of dim {dim}, got shape {np.shape(x)}")
    return a[0]


def _as_ids(x: Any, name: str) -> np.ndarray:
    """Integer ids (scalar, sequence or array) -> C-contiguous int64 1-D."""
    a = np.asarray(x)
    if a.size == 0:
        return np.zeros(0, np.int64)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} must be integers, got dtype {a.dtype}")
    if a.ndim > 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} has ids beyond int64")
    return np.ascontiguousarray(a.reshape(-1), dtype=np.int64)


_U32 = np.dtype(np.uint32)


def _as_rows(x: Any, n: int) -> np.ndarray:
    """Row numbers (any integer dtype) -> C-contiguous uint32 1-D, each in [0, n)."""
    r = np.asarray(x)
    if r.ndim != 1 or r.dtype.kind not in "iu":
        raise ValueError(f"rows must be a 1-D array of row numbers, got shape {r.shape} dtype {r.dtype}")
    # Checked before the cast, which could wrap a negative or huge number into range.
    if r.dtype != _U32 and len(r) and (int(r.min()) < 0 or int(r.max()) >= n):
        raise ValueError(f"rows must lie in [0, {n})")
    return np.ascontiguousarray(r, dtype=np.uint32)


def _positive_int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {v!r}")
    if v < 1:
        raise ValueError(f"{name} must be >= 1, got {v}")
    return int(v)


def _weight(w: Any) -> float:
    w = float(w)
    if not np.isfinite(w) or w < 0:
        raise ValueError(f"weight must be finite and >= 0, got {w}")
    return w


class VectorIndex:
    """Memory-mapped vectors + clusters + two-stage search. Create with :meth:`open`."""

    __slots__ = ("_ix",)

    def __init__(self, native: Any) -> None:
        self._ix = native

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        dim: int | None = None,
        *,
        read_only: bool = False,
        member_cache: bool = True,
    ) -> VectorIndex:
        """Create or reopen the index directory ``path``.

        ``dim`` is required to create a new index and, when given, must match an existing one
        (ValueError otherwise). ``read_only=True`` opens without the writer lock so another
        process may read while one writes; it sees the rows committed at open time.
        Corrupt, truncated, foreign or other-version files raise OSError and are left untouched.
        Opening maps the vector file; rows are not read.

        ``member_cache=True`` keeps, per cluster, a contiguous int8 copy of its primary
        members' vectors (a quarter of their f32 size), built the first time a search probes
        the cluster and dropped when its membership changes. Stage 2 then streams 1 byte per
        dimension instead of gathering scattered f32 rows, keeps a shortlist of
        ``4 k + 32`` rows by int8 score and re-scores the shortlist exactly, so returned
        scores are exact f32 cosines (only a near-tie within int8 rounding, well under 0.01,
        could swap a row at the k-th place). Small scans (fewer than 4x the shortlist) skip
        the codes. ``False`` scans the memory map directly in f32.
        """
        if dim is not None:
            dim = _positive_int(dim, "dim")
        return cls(_clag_fast.VectorIndex.open(os.fspath(path), dim, bool(read_only), bool(member_cache)))

    @staticmethod
    def committed_rows(path: str | os.PathLike[str]) -> int:
        """Rows the vector file of the index directory ``path`` commits, read from its
        header alone: nothing is locked, loaded or modified (``open`` also loads the cluster
        state). OSError as ``open`` for a missing, foreign or corrupt file."""
        return _clag_fast.committed_rows(os.fspath(path))

    @property
    def dim(self) -> int:
        """Vector dimension, fixed at creation."""
        return self._ix.dim

    @property
    def path(self) -> str:
        """The index directory."""
        return os.fspath(self._ix.path)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._ix.closed

    def __len__(self) -> int:
        """Committed rows."""
        return len(self._ix)

    def __repr__(self) -> str:
        if self.closed:
            return f"VectorIndex({self.path!r}, closed)"
        return f"VectorIndex({self.path!r}, dim={self.dim}, rows={len(self)}, clusters={len(self.cluster_ids())})"

    def warm(self) -> int:
        """Build the int8 copies of cluster members that two-stage search scans, for every
        cluster large enough to use one (otherwise the first search probing a cluster builds
        it). Safe while other threads search; returns how many clusters have one."""
        return self._ix.warm()

    def flush(self, durable: bool = True) -> None:
        """Make everything durable: new rows synced to disk first, then the cluster state
        written to a temp file, fsynced and renamed over ``clusters.bin``. ``durable=False``
        still syncs the rows but does not fsync the state file: safe against a process that
        dies; after a power loss the state may be older or unreadable, and is rebuilt on open."""
        self._ix.flush(durable)

    def close(self) -> None:
        """Flush and close; idempotent. Views from :meth:`vectors` stay readable."""
        self._ix.close()

    def __enter__(self) -> VectorIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ vectors
    def append(self, vectors: Any) -> np.ndarray:
        """Append (n, dim) or (dim,) vectors; returns their int64 row ids.

        Rows are stored L2-normalised. NaN/inf values, zero vectors or a wrong dimension raise
        ValueError naming the first bad row, and then nothing is written. A row is committed
        (survives a crash of this process) once this returns; :meth:`flush` makes it durable
        against power loss.
        """
        return self._ix.append(_as_matrix(vectors, self.dim, "vectors"))

    def vectors(self) -> np.ndarray:
        """Read-only zero-copy (len, dim) float32 view of the committed rows.

        The view keeps its memory mapping alive, so it stays valid after later appends (which
        it does not show) and after :meth:`close`.
        """
        v = self._ix.vectors()
        v.flags.writeable = False
        return v

    def gather(self, rows: Any) -> np.ndarray:
        """A contiguous copy of the committed rows ``rows`` ((len(rows), dim) float32), for
        ``search(rows=..., rows_vectors=...)``: every row starts on a 64-byte boundary, as in
        the memory-mapped file. A plain ``vectors()[rows]`` copy is only as aligned as the
        allocator makes it (16 bytes), and at an offset of 16 or 48 half the kernel's 32-byte
        loads straddle two cache lines: the search over that copy cost 1.2x the same rows
        read from the file (benches/bench_filters.py)."""
        v = self.vectors()
        return _take_aligned(v, _as_rows(_as_ids(rows, "rows"), len(v)))

    # ------------------------------------------------------------------ clusters
    def n_clusters(self) -> int:
        """Number of clusters (without building the id list)."""
        return self._ix.n_clusters()

    def cluster_ids(self) -> np.ndarray:
        """int64[c] cluster ids, ascending."""
        return self._ix.cluster_ids()

    def centres(self) -> np.ndarray:
        """float32[c, dim] unit centres in :meth:`cluster_ids` order (a zero row for a cluster
        that has neither an anchor nor members yet)."""
        return self._ix.centres()

    def cluster_sizes(self) -> np.ndarray:
        """int64[c] primary member counts in :meth:`cluster_ids` order."""
        return self._ix.cluster_sizes()

    def members(self, cid: int) -> np.ndarray:
        """Primary members of cluster ``cid`` (sorted int64 row ids); KeyError if unknown."""
        return self._ix.members(int(cid))

    def secondary_members(self, cid: int) -> np.ndarray:
        """Rows holding ``cid`` as a secondary membership (sorted); KeyError if unknown."""
        return self._ix.secondary_members(int(cid))

    def cluster_of(self, rows: Any) -> np.ndarray:
        """int64[n] primary cluster per row, -1 when unassigned; KeyError on unknown rows."""
        return self._ix.cluster_of(_as_ids(rows, "rows"))

    def n_pending(self) -> int:
        """Rows appended but never assigned (two-stage search scans them directly)."""
        return self._ix.n_pending()

    def soft_assign(self, vectors: Any, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` centres per vector by cosine, without changing any state.

        Returns (int64[n, k] cluster ids, float32[n, k] cosines), best first, padded with
        -1 / -inf when fewer than k clusters have a centre. Multi-threaded, GIL released.
        """
        k = _positive_int(k, "k")
        return self._ix.soft_assign(_as_matrix(vectors, self.dim, "vectors"), k)

    def near_assign(self, cluster_ids: Any, near: int, k: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The primary members of ``cluster_ids`` (in that order), each scored against its
        cluster's ``near`` nearest centres (its own included) instead of every centre: the
        re-assignment a split, merge or drift needs. Changes nothing.

        Returns (int64[n] rows, int64[n, k] cluster ids, float32[n, k] cosines), best first,
        padded with -1 / -inf. KeyError for an unknown cluster. Multi-threaded, GIL released.
        """
        near = _positive_int(near, "near")
        k = _positive_int(k, "k")
        return self._ix.near_assign(_as_ids(cluster_ids, "cluster_ids"), near, k)

    def assign(self, rows: Any, cluster_ids: Any) -> None:
        """Set memberships. ``cluster_ids`` is int64[n] (hard) or int64[n, K] (soft).

        Column 0 is the primary cluster: it moves that centre's running sum. Columns 1.. are
        secondary memberships (-1 = none) that only widen stage-2 search. A primary of -1
        unassigns the row (then every column must be -1). Previous memberships of the rows
        are replaced. Everything is validated first (KeyError for unknown rows/clusters,
        ValueError for shapes), so an error changes nothing.
        """
        r = _as_ids(rows, "rows")
        c = np.asarray(cluster_ids)
        if c.size and c.dtype.kind not in "iu":
            raise ValueError(f"cluster_ids must be integers, got dtype {c.dtype}")
        if c.ndim == 0:
            c = c.reshape(1, 1)
        elif c.ndim == 1:
            c = c.reshape(-1, 1)
        if c.ndim != 2 or c.shape[0] != r.shape[0] or c.shape[1] < 1:
            raise ValueError(f"cluster_ids must be shaped ({r.shape[0]},) or ({r.shape[0]}, K), got {np.shape(cluster_ids)}")
        self._ix.assign(r, np.ascontiguousarray(c, dtype=np.int64))

    def unassign(self, rows: Any) -> None:
        """Remove rows from every cluster (deleted / archived rows). They are then found only
        by flat search, and ``kmeans(rows=None)`` skips them."""
        self._ix.unassign(_as_ids(rows, "rows"))

    def new_cluster(self, centre: Any = None, weight: float = 1.0) -> int:
        """Open a cluster; ``centre`` (e.g. an SLM topic embedding) becomes its anchor with
        ``weight``. Returns the new id."""
        if centre is None:
            return self._ix.new_cluster(None, _weight(weight))
        return self._ix.new_cluster(_as_vector(centre, self.dim, "centre"), _weight(weight))

    def set_centre(self, cid: int, vector: Any, weight: float = 1.0) -> None:
        """Anchor cluster ``cid``: centre = normalise(weight * anchor + sum(members)), so the
        weight acts as inertia against drifting members."""
        self._ix.set_centre(int(cid), _as_vector(vector, self.dim, "vector"), _weight(weight))

    def drop_cluster(self, cid: int) -> None:
        """Delete an empty cluster; ValueError if it still has primary members (secondary
        links to it are removed)."""
        self._ix.drop_cluster(int(cid))

    def kmeans(self, k: int, rows: Any = None, seed: int = 0) -> np.ndarray:
        """Spherical k-means (k-means++ seeding, deterministic for ``seed``) of ``rows``
        (default: every row not removed with :meth:`unassign`) into ``k`` new clusters.

        Returns the new ids. The rows' primary memberships move to the new clusters (their
        secondary links are kept); clusters left without primary members and without an
        anchor are dropped. Large inputs train on a sample (40 rows per centre), then assign
        every row in one pass.
        """
        k = _positive_int(k, "k")
        r = None if rows is None else _as_ids(rows, "rows")
        return self._ix.kmeans(k, r, int(seed))

    def split(self, cid: int, seed: int = 0) -> tuple[int, int]:
        """2-means on one cluster's primary members: returns two new ids, ``cid`` is dropped
        (with its anchor). ValueError with fewer than 2 members."""
        return self._ix.split(int(cid), int(seed))

    def split_many(self, cids: Any, seed: int = 0) -> list[tuple[int, int]]:
        """``split`` for each of ``cids``, the 2-means fits on all cores: the two new ids of
        each, in order. Nothing changes unless every cluster exists, is listed once and has
        at least 2 members (KeyError / ValueError)."""
        return self._ix.split_many([int(c) for c in cids], int(seed))

    def merge(self, keep: int, absorb: int) -> None:
        """Move ``absorb``'s members (primary and secondary) into ``keep`` and drop ``absorb``.
        The running sums add, so no row is re-read."""
        self._ix.merge(int(keep), int(absorb))

    def merge_many(self, pairs: Any) -> None:
        """``merge`` for every (keep, absorb) pair in one update of the member lists and
        centres. Each absorbed cluster is listed once and is not also kept; nothing changes
        unless every pair is valid (KeyError / ValueError)."""
        self._ix.merge_many([(int(k), int(a)) for k, a in pairs])

    def nearest_among(self, cluster_ids: Any, among: Any) -> tuple[np.ndarray, np.ndarray]:
        """For each of ``cluster_ids``, the cluster of ``among`` whose centre is most similar to
        its centre, and that cosine: (int64[n], float32[n]); -1 / -inf where no cluster of
        ``among`` has a centre. Nothing changes."""
        return self._ix.nearest_among(np.ascontiguousarray(cluster_ids, dtype=np.int64),
                                      np.ascontiguousarray(among, dtype=np.int64))

    def merge_candidates(self, threshold: float = 0.9) -> list[tuple[int, int, float]]:
        """Pairs (a, b, cosine) with a < b whose centres have cosine >= ``threshold``, most
        similar first. A call with the threshold of the previous one compares only the centres
        written since then (new clusters, clusters that gained or lost members) with the rest:
        below 1,024 centres the same answer as comparing every pair, at a fraction of the cost.
        Past that, a written centre is compared with the 16 nearest centres the routing layer
        finds for it (with every centre when all 16 reach the threshold), as rows are routed:
        a pair that layer misses is found once either centre is written again."""
        return self._ix.merge_candidates(float(threshold))

    # ------------------------------------------------------------------ search
    def search(
        self,
        queries: Any,
        k: int = 10,
        n_probe: int = 4,
        mode: _Mode = "two_stage",
        mask: Any = None,
        weights: Any = None,
        *,
        probe_gap: float | None = None,
        min_probe: int = 1,
        min_rows: int | None = None,
        rows: Any = None,
        rows_vectors: Any = None,
    ) -> SearchResult:
        """Top-``k`` rows by cosine for each query ((dim,) or (q, dim)).

        ``two_stage``: the ``n_probe`` clusters with the most similar centres, then an exact
        scan of their members (primary and secondary, each row once) plus the rows not yet
        assigned. Falls back to ``flat`` (every row) when there are no clusters.

        Adaptive probing (``probe_gap`` given): the number of clusters is chosen per query.
        With centre scores ranked s1 >= s2 >= ..., the best ``min_probe`` clusters are
        always probed, and each further one while its score is >= s1 - ``probe_gap``, up to
        ``n_probe`` clusters in all (the cap). A query whose own clusters stand out (the
        other centres far below) scans just those; one whose centre scores lie close
        together scans up to the cap. ``probe_gap=None`` probes exactly ``n_probe``.
        Probing also goes on while the probed lists hold fewer than ``min_rows`` rows (None =
        ``k``), so the top-k can fill; a caller asking for a wide pool (large ``k``) that
        needs only a few rows reachable passes a smaller ``min_rows``.
        ``probed`` then lists the clusters probed, best first, padded with -1 to ``n_probe``.

        ``mask``: bool[len] (True = eligible). ``weights``: float32[len], finite, >= 0; each
        score is multiplied by its row's weight before ranking. A weight that is not is
        refused (ValueError naming it) by every search that scores its row; weights are
        checked as rows are scored, not in a pass over all of them per search. ``rows``: score exactly these
        row numbers (an exact search of a small filtered set: their dot products only, no
        stage 1; ``mask``/``weights`` still apply). ``rows_vectors``: the vectors of ``rows``,
        gathered contiguous (:meth:`gather`), for a caller that searches the same rows
        repeatedly: each search then streams one block instead of rows scattered over the
        file (rows never change once written, so such a copy cannot go stale). Results are
        always 2-D.
        """
        if mode not in ("two_stage", "flat"):
            raise ValueError(f"mode must be 'two_stage' or 'flat', got {mode!r}")
        k = _positive_int(k, "k")
        n_probe = _positive_int(n_probe, "n_probe")
        min_probe = _positive_int(min_probe, "min_probe")
        min_rows = 0 if min_rows is None else _positive_int(min_rows, "min_rows")
        if probe_gap is not None:
            if isinstance(probe_gap, bool) or not isinstance(probe_gap, (int, float, np.integer, np.floating)):
                raise ValueError(f"probe_gap must be a number or None, got {probe_gap!r}")
            probe_gap = float(probe_gap)
            if not (np.isfinite(probe_gap) and probe_gap >= 0):
                raise ValueError(f"probe_gap must be finite and >= 0, got {probe_gap}")
        q = _as_matrix(queries, self.dim, "queries")
        n = len(self)
        m = None
        if mask is not None:
            m = np.asarray(mask)
            if m.dtype != np.bool_:
                raise ValueError(f"mask must be a bool array, got dtype {m.dtype}")
            if m.shape != (n,):
                raise ValueError(f"mask must have shape ({n},) (one entry per row), got {m.shape}")
            m = np.ascontiguousarray(m)
        w = None
        if weights is not None:
            w = np.asarray(weights)
            if w.dtype.kind not in "fiu":
                raise ValueError(f"weights must be real numbers, got dtype {w.dtype}")
            if w.shape != (n,):
                raise ValueError(f"weights must have shape ({n},) (one entry per row), got {w.shape}")
            w = np.ascontiguousarray(w, dtype=np.float32)
        r = rows
        if r is not None and not (type(r) is np.ndarray and r.dtype == _U32 and r.ndim == 1 and r.flags.c_contiguous):
            # Contiguous uint32 rows (what the store passes) go as they are: they cannot be
            # negative and the core refuses one past the end. Anything else is converted
            # here (2 us a call: as much as the rest of this wrapper).
            r = _as_rows(r, n)
        rv = None
        if rows_vectors is not None:
            if r is None:
                raise ValueError("rows_vectors needs rows (the row numbers its vectors belong to)")
            rv = _as_matrix(rows_vectors, self.dim, "rows_vectors")
        return SearchResult(*self._ix.search(q, k, n_probe, mode == "flat", m, w, probe_gap, min_probe, min_rows, r,
                                             rv))

    def search_one(self, query: np.ndarray, memory_ids: np.ndarray, k: int, n_probe: int, mode: _Mode = "two_stage",
                   mask: np.ndarray | None = None, weights: np.ndarray | None = None, *,
                   probe_gap: float | None = None, min_probe: int = 1,
                   min_rows: int = 0) -> tuple[list[int], list[float], list[int], list[int], int, list[int]]:
        """``search`` of one query for a caller holding arrays already in the core's types:
        ``query`` float32[dim], ``memory_ids`` int64 (row -> memory id, at least ``len(self)``
        entries), ``mask`` bool[len], ``weights`` float32[len], all C-contiguous. Returns
        Python lists cut to the hits found: (rows, scores, primary clusters (-1: none),
        memory ids, rows scanned, clusters probed best first). The store's single-query
        path: it skips ``search``'s coercions and its six result arrays. Values the core
        refuses (k = 0, a NaN query, a wrong length) raise ValueError as in ``search``; a
        wrong dtype raises TypeError."""
        if mode not in ("two_stage", "flat"):
            raise ValueError(f"mode must be 'two_stage' or 'flat', got {mode!r}")
        return self._ix.search_one(query, memory_ids, k, n_probe, mode == "flat", mask, weights, probe_gap,
                                   min_probe, min_rows)

