"""Metadata fields as in-memory columns over vector rows: what ``where=`` filters run on.

SQLite keeps each memory's metadata as JSON text; parsing it per search would cost
milliseconds per thousand memories. Here a top-level metadata field is a column over the
vector rows: a type code per row (missing, null, bool, number, string, other), a float64
value for numbers and bools, and an int32 code into the field's string dictionary for
strings. A filter is then a few numpy comparisons per field (``store.filters``).

A field's column is built from the database the first time a filter names it, so a store
that is never filtered pays nothing, and memory grows with the fields filtered on (13 bytes
per row each), not with every key any metadata ever held. From then on the store's writes
keep the built columns in step (``set``). ``version`` changes with every change, so masks
derived from the columns can be cached.
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
    store's write lock; readers call ``ensure`` under its read lock."""

    def __init__(self) -> None:
        self.columns: dict[str, Column] = {}
        self.version = 0
        self._cap = 0
        self._n = 0
        self._build_lock = threading.Lock()

    def ensure(self, names: Iterable[str], n_rows: int, load: Callable[[], list[tuple[int, str]]]) -> None:
        """Build the columns of ``names`` not built yet, in one pass over ``load()``
        ((vector row, metadata JSON) of the live memories)."""
        if all(name in self.columns for name in names):
            return
        with self._build_lock:  # readers build concurrently: one builds, the others wait
            todo = [name for name in dict.fromkeys(names) if name not in self.columns]
            if not todo:
                return
            self._ensure(max(n_rows, self._n))
            data = load()
            rows = np.fromiter((r for r, _ in data), np.int64, len(data))
            metas = [json.loads(m) for _, m in data]
            fresh = {name: Column(self._cap) for name in todo}
            self._assign(rows, metas, fresh)
            self.columns.update(fresh)  # published whole: readers never see a half-built column
            self.version += 1

    def _ensure(self, n_rows: int) -> None:
        if n_rows > self._cap:
            cap = max(n_rows, 2 * self._cap, 1024)
            for col in self.columns.values():
                col.grow(cap, self._n)
            self._cap = cap
        self._n = max(self._n, n_rows)

    @property
    def active(self) -> bool:
        """Whether any column is built (writes must then keep the table in step)."""
        return bool(self.columns)

    def set(self, rows: np.ndarray | list[int], metadata: list[Any]) -> None:
        """Rows now hold these metadata values (dicts, JSON texts or None), replacing whatever
        they held in the built columns. A no-op while no column is built."""
        if not self.columns:
            return
        rows = np.asarray(rows, np.int64)
        if len(rows) == 0:
            return
        self._ensure(int(rows.max()) + 1)
        for col in self.columns.values():
            col.clear(rows)
        self._assign(rows, [json.loads(m) if isinstance(m, str) else m for m in metadata], self.columns)
        self.version += 1

    @staticmethod
    def _assign(rows: np.ndarray, metas: list[Any], columns: dict[str, Column]) -> None:
        """Write the values of ``columns``' fields found in ``metas`` at ``rows``."""
        by_field: dict[str, tuple[list[int], list[Any]]] = {name: ([], []) for name in columns}
        for row, meta in zip(rows.tolist(), metas):
            if not isinstance(meta, dict):
                continue
            for name, (at, values) in by_field.items():
                if name in meta:
                    at.append(row)
                    values.append(meta[name])
        for name, (at, values) in by_field.items():
            if not at:
                continue
            col = columns[name]
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
