"""In-memory columns indexed by vector row: what search needs to filter and weight rows
without touching SQLite on the hot path.

SQLite stays the source of truth; these columns are rebuilt from it on open and kept in step
by the store's write paths. Filters come back as boolean masks over every vector row;
``version`` changes with every write, so callers can cache what they derive from them
(``store.search.Searcher.eligible`` does).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

import numpy as np

from clag_fast.decay import ForgettingPolicy
from clag_fast.store import threads


#: Searches recorded before their accesses are applied to the columns in one batch.
_ACCESS_BATCH = 256
#: Writes whose rows ``changed_since`` remembers; older versions answer None (rebuild all).
_CHANGE_LOG = 64


class RowTable:
    """Columnar per-row state: memory id, liveness, namespace, kind and decay inputs."""

    def __init__(self) -> None:
        self.n = 0
        self._cap = 0
        self.memory_id = np.empty(0, np.int64)
        self.live = np.empty(0, bool)
        self.namespace = np.empty(0, np.int32)
        self.kind = np.empty(0, np.int32)
        self.created_at = np.empty(0, np.float64)
        self.last_accessed = np.empty(0, np.float64)
        self.access_count = np.empty(0, np.float64)
        # Searches' accesses not yet written to SQLite (``state.AccessLog``).
        self.unflushed = np.empty(0, np.int32)
        self.strength = np.empty(0, np.float32)
        # Conversation structure (``store.threads``): the memory's thread (a code of its
        # namespace and thread), its place in the thread, its neighbours there (-1: none), its
        # speaker (-1: none), its text's words and whether it asks a question, and the id of a
        # newer memory that updates it (-1: none).
        self.group = np.empty(0, np.int32)
        self.order = np.empty(0, np.float64)
        self.prev = np.empty(0, np.int64)
        self.next = np.empty(0, np.int64)
        self.speaker = np.empty(0, np.int32)
        self.words = np.empty(0, np.int32)
        self.asks = np.empty(0, bool)
        self.superseded_by = np.empty(0, np.int64)
        # The kinds of answer the row's text holds (``store.answer_kind`` flags; -1: not read
        # yet). Learned by the searches that need them: a row's text never changes (a new text
        # takes a new row).
        self.holds = np.empty(0, np.int8)
        self.tails: dict[int, int] = {}  # thread code -> its last linked row
        # memory id -> row of the memories that supersede others (search checks the newer
        # memory of a superseded hit; only these few ids need their row found).
        self.successor_rows: dict[int, int] = {}
        self._codes: dict[str, dict[str, int]] = {"namespace": {}, "kind": {}, "group": {}, "speaker": {}}
        self.version = 0
        self.n_live = 0  # live rows, kept by set_rows and kill (a count per write was O(rows))
        # (version, rows that write changed) of the last writes: derived per-row state (decay
        # weights) is brought up to date for those rows instead of rebuilt.
        self._changes: list[tuple[int, np.ndarray]] = []
        self._accesses: list[tuple[list[int], float]] = []  # recorded, not yet applied
        self._access_lock = threading.Lock()

    # -- growth ------------------------------------------------------------------------
    def ensure(self, n_rows: int) -> None:
        """Make room for ``n_rows`` rows; new rows are orphans (not live, no memory id)."""
        if n_rows > self._cap:
            cap = max(n_rows, 2 * self._cap, 1024)
            for name, fill in (
                ("memory_id", -1),
                ("live", False),
                ("namespace", -1),
                ("kind", -1),
                ("created_at", 0.0),
                ("last_accessed", np.nan),
                ("access_count", 0.0),
                ("unflushed", 0),
                ("strength", 1.0),
                ("group", -1),
                ("order", np.nan),
                ("prev", -1),
                ("next", -1),
                ("speaker", -1),
                ("words", 0),
                ("asks", False),
                ("superseded_by", -1),
                ("holds", -1),
            ):
                old = getattr(self, name)
                new = np.full(cap, fill, dtype=old.dtype)
                new[: self.n] = old[: self.n]
                setattr(self, name, new)
            self._cap = cap
        if n_rows > self.n:
            grown = np.arange(self.n, n_rows, dtype=np.int64)
            self.n = n_rows
            self.touch(grown)

    def touch(self, rows: np.ndarray) -> None:
        """Mark a write to ``rows``: masks and weights callers derived from the columns are
        stale (``changed_since`` says for which rows)."""
        self.version += 1
        self._changes.append((self.version, rows))
        if len(self._changes) > _CHANGE_LOG:
            del self._changes[0]

    def changed_since(self, version: int) -> np.ndarray | None:
        """The rows written after ``version`` (distinct, ascending), or None when that is
        further back than the log remembers or so many rows that rebuilding what was derived
        from every row costs about as much as following them."""
        if version == self.version:
            return np.empty(0, np.int64)
        if not self._changes or self._changes[0][0] > version + 1:
            return None
        changed = np.unique(np.concatenate([r for v, r in self._changes if v > version]))
        return changed if len(changed) <= max(1024, self.n // 8) else None

    def _count_live(self, rows: np.ndarray) -> int:
        """Live rows among ``rows`` (each counted once)."""
        rows = np.asarray(rows, np.int64)
        if len(rows) > 1 and not (rows[1:] > rows[:-1]).all():  # not strictly ascending
            rows = np.unique(rows)
        return int(np.count_nonzero(self.live[rows]))

    def code(self, column: str, value: str, *, create: bool = True) -> int:
        """Small integer code for a namespace or kind string (-2 when unknown and not created)."""
        codes = self._codes[column]
        c = codes.get(value)
        if c is None:
            if not create:
                return -2
            c = codes[value] = len(codes)
        return c

    def _encode(self, column: str, values: Sequence[str]) -> np.ndarray:
        """Codes for many strings: the distinct ones get codes first, then one C-level map
        (a per-row method call cost ~0.4 s per million rows at open)."""
        codes = self._codes[column]
        for v in dict.fromkeys(values):
            if v not in codes:
                codes[v] = len(codes)
        return np.fromiter(map(codes.__getitem__, values), np.int32, len(values))

    def names(self, column: str) -> dict[int, str]:
        """code -> string of every namespace or kind seen."""
        return {v: k for k, v in self._codes[column].items()}

    def name_count(self, column: str) -> int:
        """How many strings ``column`` has coded (codes only grow)."""
        return len(self._codes[column])

    def name(self, column: str, row: int) -> str:
        """The namespace or kind string of ``row``."""
        code = int(getattr(self, column)[row])
        return next(k for k, v in self._codes[column].items() if v == code)

    def set_rows(
        self,
        rows: np.ndarray,
        memory_ids: np.ndarray,
        namespaces: Sequence[str],
        kinds: Sequence[str],
        created_at: np.ndarray,
        *,
        last_accessed: np.ndarray | None = None,
        access_count: np.ndarray | None = None,
        strength: np.ndarray | None = None,
        live: np.ndarray | None = None,
    ) -> None:
        self.ensure(int(rows.max()) + 1 if len(rows) else self.n)
        was_live = self._count_live(rows)
        self.memory_id[rows] = memory_ids
        self.namespace[rows] = self._encode("namespace", namespaces)
        self.kind[rows] = self._encode("kind", kinds)
        self.created_at[rows] = created_at
        self.last_accessed[rows] = np.nan if last_accessed is None else last_accessed
        self.access_count[rows] = 0.0 if access_count is None else access_count
        self.strength[rows] = 1.0 if strength is None else strength
        self.live[rows] = True if live is None else live
        self.n_live += self._count_live(rows) - was_live
        if self.successor_rows:  # a superseding memory written anew (update, upsert): its new row
            moved = self.successor_rows.keys() & set(np.asarray(memory_ids).tolist())
            for mid in moved:
                self.successor_rows[mid] = int(np.asarray(rows)[np.asarray(memory_ids) == mid][-1])
        self.touch(np.asarray(rows, np.int64))

    def set_conversation(self, rows: np.ndarray, groups: Sequence[str] | str, orders: np.ndarray,
                         speakers: Sequence[str | None] | None, words: np.ndarray, asks: np.ndarray,
                         superseded_by: np.ndarray | None = None, *, link: bool = True) -> None:
        """The conversation columns of ``rows`` (already set by ``set_rows``): thread keys
        (``threads.group_key``; one string: the same for every row), places in the thread,
        speakers (None: none, for one row or all), words and question flags of their texts;
        ``link``: join them to their threads' neighbours."""
        rows = np.asarray(rows, np.int64)
        # One thread for the whole batch (the usual add: one namespace, no thread given) is
        # one code, not a lookup per row.
        self.group[rows] = self.code("group", groups) if isinstance(groups, str) else self._encode("group", groups)
        self.order[rows] = orders
        codes = np.full(len(rows), -1, np.int32)
        named = [] if speakers is None else [i for i, s in enumerate(speakers) if s is not None]
        if named:
            codes[named] = self._encode("speaker", [speakers[i] for i in named])
        self.speaker[rows] = codes
        self.words[rows] = words
        self.asks[rows] = asks
        self.superseded_by[rows] = -1 if superseded_by is None else superseded_by
        if superseded_by is not None and (superseded_by >= 0).any():
            self.find_successors(np.unique(superseded_by[superseded_by >= 0]))
        if link:
            threads.link_new(self, rows)

    def find_successors(self, memory_ids: np.ndarray) -> None:
        """Record the live rows of these superseding memories (``successor_rows``)."""
        n = self.n
        at = np.flatnonzero(np.isin(self.memory_id[:n], memory_ids) & self.live[:n])
        self.successor_rows.update(zip(self.memory_id[at].tolist(), at.tolist()))

    def kill(self, rows: np.ndarray) -> None:
        self.n_live -= self._count_live(rows)
        threads.unlink(self, rows)
        self.live[rows] = False
        self.touch(np.asarray(rows, np.int64))

    # -- accesses ----------------------------------------------------------------------
    def record_access(self, hit_rows: list[int], now: float) -> None:
        """A search returned ``hit_rows`` (distinct rows) at ``now``.

        Applied to the columns in batches (``settle_access``): three numpy writes per search
        cost more than the rest of a search's hit bookkeeping. Whoever reads
        ``last_accessed``, ``access_count`` or ``unflushed`` settles first (``weights`` does).
        """
        self._accesses.append((hit_rows, now))  # list.append is atomic: searches run concurrently
        if len(self._accesses) >= _ACCESS_BATCH:
            self.settle_access()

    def settle_access(self) -> None:
        """Apply the recorded accesses to ``last_accessed``, ``access_count`` and ``unflushed``."""
        with self._access_lock:
            batch, self._accesses = self._accesses, []
            if not batch:
                return
            rows = np.fromiter(itertools.chain.from_iterable(b[0] for b in batch), np.int64)
            times = np.repeat(np.asarray([b[1] for b in batch]), [len(b[0]) for b in batch])
            np.fmax.at(self.last_accessed, rows, times)  # fmax: a never-accessed row holds NaN
            uniq, counts = np.unique(rows, return_counts=True)
            self.access_count[uniq] += counts
            self.unflushed[uniq] += counts.astype(self.unflushed.dtype)

    def carry_access(self, old_rows: np.ndarray, new_rows: np.ndarray) -> None:
        """A memory moved from ``old_rows`` to ``new_rows`` (an update with a new vector): its
        accesses not yet written go with it (the old row's memory id is cleared)."""
        self.settle_access()
        self.unflushed[new_rows] += self.unflushed[old_rows]
        self.unflushed[old_rows] = 0

    # -- reads -------------------------------------------------------------------------
    def live_rows(self) -> np.ndarray:
        return np.flatnonzero(self.live[: self.n])

    def mask(
        self,
        namespace: str | None = None,
        kind: str | None = None,
        since: float | None = None,
        until: float | None = None,
        *,
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """Boolean mask over all rows (or over ``rows``, in their order): live and matching
        every given filter."""
        at = slice(0, self.n) if rows is None else rows
        m = self.live[at].copy()
        if namespace is not None:
            m &= self.namespace[at] == self.code("namespace", namespace, create=False)
        if kind is not None:
            m &= self.kind[at] == self.code("kind", kind, create=False)
        if since is not None:
            m &= self.created_at[at] >= since
        if until is not None:
            m &= self.created_at[at] < until
        return m

    def weights(self, policy: ForgettingPolicy, now: float, rows: np.ndarray | None = None) -> np.ndarray:
        """Decay weights at ``now`` of every row, or of ``rows`` only."""
        self.settle_access()
        at = slice(0, self.n) if rows is None else rows
        return policy.weights(now, self.created_at[at], self.last_accessed[at], self.access_count[at],
                              self.strength[at])
