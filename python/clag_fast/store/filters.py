"""``where=`` metadata filters: parsing (with errors that name the problem) and compiling
to a boolean row mask over the metadata columns (``store.fields``).

Grammar (Mongo-like, over the metadata dict's top-level fields):
  ``{"field": value}``                          equality
  ``{"field": {"$eq"|"$ne"|"$gt"|"$gte"|"$lt"|"$lte": value}}``
  ``{"field": {"$in": [values]}}``, ``{"field": {"$nin": [values]}}``
  several fields (or operators on one field) in one dict: all must hold (AND)
  ``{"$and": [filter, ...]}``, ``{"$or": [filter, ...]}`` (non-empty lists); ``{}`` matches all.
Values are str, int, float, bool or None.

Semantics:
  * Types do not mix: a bool equals only a bool (``True`` is not ``1``), a number only a
    number (``1`` equals ``1.0``), a string only a string, None only a stored null. Numbers
    compare as float64.
  * Range operators take a number or a string and compare numbers with numbers and strings
    with strings (code-point order); a stored value of another type does not match.
  * A missing field matches nothing, except under ``$ne`` and ``$nin``, which match it (as in
    MongoDB). Lists and dicts stored in metadata equal no filter value (so they match ``$ne``
    / ``$nin`` and nothing else).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from clag_fast.errors import FilterError
from clag_fast.store.fields import BOOL, NULL, NUMBER, STRING, Column, FieldTable, as_float

COMPARISONS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin")
LOGICAL = ("$and", "$or")
_RANGE = {"$gt": np.greater, "$gte": np.greater_equal, "$lt": np.less, "$lte": np.less_equal}

# A parsed filter is a tree of hashable tuples, so it can key the mask cache:
#   ("all",) | ("and", (node, ...)) | ("or", (node, ...)) | ("cmp", field, op, value)
# where value is (type code, python value) or, for $in / $nin, a tuple of those.
Node = tuple

#: Value types the fast paths of ``parse`` and ``_scalar`` take by exact type.
_PLAIN = frozenset((str, int, float, bool))
#: Parsed one-field equality filters, (field, value type, value) -> node (``parse``).
_ONE_FIELD: dict[tuple, Node] = {}
_ONE_FIELD_MAX = 1024


def parse(where: Any) -> Node | None:
    """The canonical form of a ``where`` filter (None for None); FilterError when malformed."""
    if where is None:
        return None
    if type(where) is dict and len(where) == 1:
        # The common filter, one field equal to a plain value: remembered by (field, type,
        # value), since parsing it is a pure function of those (the general walk cost 1% of a
        # 1% filtered search, benches/bench_filters.py).
        ((key, value),) = where.items()
        t = type(value)
        if type(key) is str and t in _PLAIN:
            memo = (key, t, value)
            node = _ONE_FIELD.get(memo)
            if node is None and key and key[0] != "$":
                node = ("cmp", key, "$eq", _scalar(value, key, "where", "$eq"))  # raises on nan/inf
                if len(_ONE_FIELD) >= _ONE_FIELD_MAX:
                    _ONE_FIELD.clear()
                _ONE_FIELD[memo] = node
            if node is not None:
                return node
    return _parse(where, "where")


def _parse(where: Any, path: str) -> Node:
    if not isinstance(where, dict):
        raise FilterError(f"{path} must be a dict of field conditions, got {type(where).__name__}")
    parts: list[Node] = []
    for key, value in where.items():
        if not isinstance(key, str):
            raise FilterError(f"{path}: field names must be strings, got {key!r}")
        if key.startswith("$"):
            if key not in LOGICAL:
                raise FilterError(f"{path}: unknown operator {key!r} (top-level operators are $and, $or)")
            if not isinstance(value, (list, tuple)) or not value:
                raise FilterError(f"{path}: {key} needs a non-empty list of filters, got {value!r}")
            parts.append((key[1:], tuple(_parse(f, f"{path}.{key}[{i}]") for i, f in enumerate(value))))
        elif not key:
            raise FilterError(f"{path}: empty field name")
        elif isinstance(value, dict):
            if not value:
                raise FilterError(f"{path}: field {key!r} has an empty condition {{}}")
            for op, v in value.items():
                if op not in COMPARISONS:
                    raise FilterError(f"{path}: unknown operator {op!r} on field {key!r} "
                                      f"(known: {', '.join(COMPARISONS)})")
                parts.append(("cmp", key, op, _operand(op, v, key, path)))
        else:
            parts.append(("cmp", key, "$eq", _scalar(value, key, path, "$eq")))
    if not parts:
        return ("all",)
    return parts[0] if len(parts) == 1 else ("and", tuple(parts))


def _operand(op: str, v: Any, field: str, path: str) -> Any:
    if op in ("$in", "$nin"):
        if isinstance(v, (str, bytes, dict)) or not isinstance(v, (list, tuple, set, frozenset)):
            raise FilterError(f"{path}: {op} on field {field!r} needs a list of values, got {v!r}")
        return tuple(dict.fromkeys(_scalar(x, field, path, op) for x in v))
    value = _scalar(v, field, path, op)
    if op in _RANGE and value[0] not in (NUMBER, STRING):
        raise FilterError(f"{path}: {op} on field {field!r} needs a number or a string, got {v!r}")
    return value


def _scalar(v: Any, field: str, path: str, op: str) -> tuple[int, Any]:
    t = type(v)
    if t is str:
        return (STRING, v)
    if t is int:
        return (NUMBER, as_float(v))
    if t is float and math.isfinite(v):
        return (NUMBER, v)
    if v is None:
        return (NULL, None)
    if isinstance(v, (bool, np.bool_)):
        return (BOOL, float(bool(v)))
    if isinstance(v, (int, np.integer)):
        return (NUMBER, as_float(int(v)))
    if isinstance(v, (float, np.floating)):
        if not math.isfinite(v):
            raise FilterError(f"{path}: {op} on field {field!r} has a non-finite number {v!r}")
        return (NUMBER, float(v))
    if isinstance(v, str):
        return (STRING, v)
    raise FilterError(f"{path}: {op} on field {field!r}: values must be str, int, float, bool or None, "
                      f"got {type(v).__name__} {v!r}")


def fields_of(node: Node) -> list[str]:
    """The metadata fields a parsed filter reads."""
    if node[0] == "cmp":
        return [node[1]]
    if node[0] in ("and", "or"):
        return [f for sub in node[1] for f in fields_of(sub)]
    return []


# -- compiling to a mask -------------------------------------------------------------------
def mask(node: Node, fields: FieldTable, n: int) -> np.ndarray:
    """Boolean mask over rows [0, n): the rows whose metadata satisfies ``node`` (liveness is
    the caller's: dead rows may keep stale values)."""
    kind = node[0]
    if kind == "all":
        return np.ones(n, bool)
    if kind == "and":
        out = mask(node[1][0], fields, n)
        for sub in node[1][1:]:
            out &= mask(sub, fields, n)
        return out
    if kind == "or":
        out = mask(node[1][0], fields, n)
        for sub in node[1][1:]:
            out |= mask(sub, fields, n)
        return out
    _, name, op, value = node
    col = fields.column(name)
    if op == "$ne":
        return ~_equal(col, value, n)
    if op == "$nin":
        return ~_member(col, value, n)
    if col is None:
        return np.zeros(n, bool)
    if op == "$eq":
        return _equal(col, value, n)
    if op == "$in":
        return _member(col, value, n)
    return _range(col, op, value, n)


def _view(col: Column, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(type, num, code) over rows [0, n); rows past the column's end hold nothing."""
    if len(col.type) >= n:
        return col.type[:n], col.num[:n], col.code[:n]
    pad = n - len(col.type)
    return (np.concatenate([col.type, np.zeros(pad, np.int8)]), np.concatenate([col.num, np.zeros(pad)]),
            np.concatenate([col.code, np.full(pad, -1, np.int32)]))


def _equal(col: Column | None, value: tuple[int, Any], n: int) -> np.ndarray:
    if col is None:
        return np.zeros(n, bool)
    cls, v = value
    types, nums, codes = _view(col, n)
    if cls == NULL:
        return types == NULL
    if cls == STRING:
        c = col.strings.get(v)
        return np.zeros(n, bool) if c is None else codes == c
    return (types == cls) & (nums == v)


def _member(col: Column | None, values: tuple, n: int) -> np.ndarray:
    out = np.zeros(n, bool)
    if col is None or not values:
        return out
    types, nums, codes = _view(col, n)
    strs = [col.strings[v] for c, v in values if c == STRING and v in col.strings]
    if strs:
        lut = np.zeros(len(col.names) + 1, bool)  # the last entry answers code -1
        lut[strs] = True
        out |= lut[codes]
    for cls in (NUMBER, BOOL):
        vals = [v for c, v in values if c == cls]
        if vals:
            out |= (types == cls) & np.isin(nums, vals)
    if any(c == NULL for c, _ in values):
        out |= types == NULL
    return out


def _range(col: Column, op: str, value: tuple[int, Any], n: int) -> np.ndarray:
    cls, v = value
    types, nums, codes = _view(col, n)
    compare = _RANGE[op]
    if cls == NUMBER:
        return (types == NUMBER) & compare(nums, v)
    # Strings: compare the field's distinct strings once, then look each row's code up.
    lut = np.zeros(len(col.names) + 1, bool)
    if col.names:
        # The operand as an object scalar: a numpy string scalar would drop trailing NULs.
        operand = np.empty((), dtype=object)
        operand[()] = v
        lut[:-1] = compare(col.names_array(), operand).astype(bool)
    return lut[codes]
