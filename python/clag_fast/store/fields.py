"""Metadata fields as in-memory columns over vector rows: what ``where=`` filters run on.

SQLite keeps each memory's metadata as JSON text; parsing it per search would cost
milliseconds per thousand memories. Here every top-level metadata field is a column over the
vector rows: a type code per row (missing, null, bool, number, string, other), a float64
value for numbers and bools, and an int32 code into the field's string dictionary for
strings. A filter is then a few numpy comparisons per field (``store.filters``).

The table is built from the database on the first filtered query, so a store that is never
filtered pays nothing at open; from then on the store's writes keep it in step (``set``).
``version`` changes with every write, so masks derived from it can be cached.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any, Callable, Iterable

import numpy as np

# Type codes of a field's value in one row.
MISSING, NULL, BOOL, NUMBER, STRING, OTHER = 0, 1, 2, 3, 4, 5


def value_class(v: Any) -> int:
    """The type code of a metadata value (lists and dicts are OTHER: they equal no filter value)."""
    if v is None:
        return NULL
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, (int, float)):
        return NUMBER
    if isinstance(v, str):
        return STRING
    return OTHER


def as_float(v: int | float | bool) -> float:
    """A number as float64; an int too large for a float becomes +-inf (on both sides of a
    comparison alike, so a huge int still equals itself)."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


class Column:
    """One field over every vector row."""

    __slots__ = ("type", "num", "code", "strings", "names", "_names_array")

    def __init__(self, cap: int) -> None:
        self.type = np.zeros(cap, np.int8)
        self.num = np.zeros(cap, np.float64)
        self.code = np.full(cap, -1, np.int32)  # -1 unless the row holds a string
        self.strings: dict[str, int] = {}
        self.names: list[str] = []
        self._names_array: np.ndarray | None = None

    def grow(self, cap: int, n: int) -> None:
        for name, fill in (("type", 0), ("num", 0.0), ("code", -1)):
            old = getattr(self, name)
            new = np.full(cap, fill, dtype=old.dtype)
            new[:n] = old[:n]
            setattr(self, name, new)

    def string_code(self, s: str) -> int:
        c = self.strings.get(s)
        if c is None:
            c = self.strings[s] = len(self.names)
            self.names.append(s)
            self._names_array = None
        return c

    def names_array(self) -> np.ndarray:
        """The dictionary's strings by code, as an object array (compared with Python's string
        order, which a fixed-width numpy string array would break on trailing NULs)."""
        if self._names_array is None:
            arr = np.empty(len(self.names), dtype=object)
            arr[:] = self.names
            self._names_array = arr
        return self._names_array

    def clear(self, rows: np.ndarray) -> None:
        self.type[rows] = MISSING
        self.code[rows] = -1


class FieldTable:
    """The metadata columns of one store (``state.fields``). Writes call ``set`` under the
    store's write lock; readers call ``ensure_built`` under its read lock."""

    def __init__(self) -> None:
        self.built = False
        self.columns: dict[str, Column] = {}
        self.version = 0
        self._cap = 0
        self._n = 0
        self._build_lock = threading.Lock()

    def ensure_built(self, n_rows: int, load: Callable[[], Iterable[tuple[int, str]]]) -> None:
        """Build the columns from ``load()`` ((vector row, metadata JSON) of the live memories)
        unless built already."""
        if self.built:
            return
        with self._build_lock:
            if self.built:
                return
            self._ensure(n_rows)
            data = load()
            if data:
                rows = np.fromiter((r for r, _ in data), np.int64, len(data))
                self._assign(rows, [json.loads(m) for _, m in data])
            self.version += 1
            self.built = True

    def _ensure(self, n_rows: int) -> None:
        if n_rows > self._cap:
            cap = max(n_rows, 2 * self._cap, 1024)
            for col in self.columns.values():
                col.grow(cap, self._n)
            self._cap = cap
        self._n = max(self._n, n_rows)

    def set(self, rows: np.ndarray | list[int], metadata: list[Any]) -> None:
        """Rows now hold these metadata values (dicts, JSON texts or None), replacing whatever
        fields they held. A no-op until the table is built (the build reads the database)."""
        if not self.built:
            return
        rows = np.asarray(rows, np.int64)
        if len(rows) == 0:
            return
        self._ensure(int(rows.max()) + 1)
        for col in self.columns.values():
            col.clear(rows)
        self._assign(rows, [json.loads(m) if isinstance(m, str) else m for m in metadata])
        self.version += 1

    def _assign(self, rows: np.ndarray, metas: list[Any]) -> None:
        by_field: dict[str, tuple[list[int], list[Any]]] = {}
        for row, meta in zip(rows.tolist(), metas):
            if not isinstance(meta, dict):
                continue
            for name, value in meta.items():
                at, values = by_field.setdefault(name, ([], []))
                at.append(row)
                values.append(value)
        for name, (at, values) in by_field.items():
            col = self.columns.get(name)
            if col is None:
                col = self.columns[name] = Column(self._cap)
            at_a = np.asarray(at, np.int64)
            types = np.fromiter(map(value_class, values), np.int8, len(values))
            col.type[at_a] = types
            nums = [as_float(v) if t in (BOOL, NUMBER) else 0.0 for v, t in zip(values, types.tolist())]
            col.num[at_a] = nums
            strs = np.flatnonzero(types == STRING)
            if len(strs):
                col.code[at_a[strs]] = [col.string_code(values[i]) for i in strs.tolist()]

    def column(self, name: str) -> Column | None:
        return self.columns.get(name)

    @property
    def n(self) -> int:
        return self._n
