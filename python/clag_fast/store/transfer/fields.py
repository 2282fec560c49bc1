"""The export record format, defined once: the fields of a memory record and of a cluster
record, how a value is written and read back, and the checks an imported record passes.

A memory record (a JSONL line, a Parquet row, a dict from an importer) holds one value per
``FIELDS`` entry, plus ``vector`` (the stored unit vector: float32 little endian, base64 in
JSONL, a fixed-size list column in Parquet; a list of numbers is accepted too) and
``clusters`` (its soft assignment: [[cluster id, affinity], ...], best first). A field is a
column of the memories table: adding one to the store (a new column in ``store.catalog``)
and to ``FIELDS`` carries it through export and import in both formats.

Every field but ``text`` may be left out of a record made by hand or by an importer; its
default is then used (``created_at``: the time of the import). A record naming a field not
listed here is refused: a misspelt field is an error, never silently dropped.
"""

from __future__ import annotations

import base64
import binascii
import gc
import json
import math
import time
from itertools import chain
from operator import itemgetter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from clag_fast import _clag_fast as _native
from clag_fast.store.catalog import ARCHIVED, LIVE

#: The first line of a JSONL export (and the Parquet file's ``clag_fast`` metadata) says it is
#: one, with its version, ``store_id`` (the exporting store: what an import recognises again),
#: ``dim``, counts and the cluster records.
FORMAT = "clag_fast-export"
VERSION = 1

#: Longest key a record may carry (as ``MemoryStore.add(key=...)``).
MAX_KEY_CHARS = 512


@dataclass(frozen=True)
class Field:
    """One memory field: its record name, its memories-table column, its type, whether null
    is allowed, and its default when a record leaves it out (``REQUIRED``: never; ``NOW``:
    the import's time). Types (each with its check, ``TYPES``, and its JSON and Parquet forms
    in ``jsonl`` and ``parquet``): "int" (>= 0), "float" (finite), "str" (not blank), "json" (an
    object, stored as JSON text), "archived" (a bool, stored as the state column), and the
    stricter "id" (an int >= 0), "key" (``MAX_KEY_CHARS``, no NUL) and "text" (encodable)."""

    name: str
    column: str
    type: str
    nullable: bool = False
    default: Any = None


REQUIRED = object()
NOW = object()

#: How each field type is written: the stricter types are written as the plain ones.
WRITTEN_AS = {"id": "int", "key": "str", "text": "str"}

#: The memory fields, in record order. A new memories-table column is one more line here; its
#: check, both file forms and the insert follow from its type. ``superseded_by`` holds another
#: memory's id: it keeps its meaning when the import keeps ids (into an empty store), and an
#: import that gives new ids leaves it out (``Import``).
FIELDS: tuple[Field, ...] = (
    Field("id", "id", "id", nullable=True),
    Field("key", "key", "key", nullable=True),
    Field("namespace", "namespace", "str", default="default"),
    Field("kind", "kind", "str", default="user_input"),
    Field("text", "text", "text", default=REQUIRED),
    Field("metadata", "metadata", "json", nullable=True),
    Field("created_at", "created_at", "float", default=NOW),
    Field("last_accessed", "last_accessed", "float", nullable=True),
    Field("access_count", "access_count", "int", default=0),
    Field("strength", "strength", "float", default=1.0),
    Field("archived", "state", "archived", default=False),
    Field("thread", "thread", "str", nullable=True),
    Field("turn", "turn", "float", nullable=True),
    Field("speaker", "speaker", "str", nullable=True),
    Field("superseded_by", "superseded_by", "id", nullable=True),
)
#: Record members that are not memories-table columns.
VECTOR, CLUSTERS = "vector", "clusters"


def record_names() -> frozenset[str]:
    """Every name a memory record may use. The modules here read ``FIELDS`` when they run,
    not when they are imported, so the tuple is the one place a field is added."""
    return frozenset([f.name for f in FIELDS] + [VECTOR, CLUSTERS])

#: Cluster record fields (columns of the clusters table), plus ``anchor`` for clusters whose
#: centre is anchored (SLM topics, template labels): the centre they had, base64 as vectors.
CLUSTER_FIELDS: tuple[str, ...] = ("id", "summary", "tags", "source", "created_at", "updated_at",
                                   "profiled_size", "last_hit_at")
ANCHORED = ("slm_topic", "template")
ANCHOR = "anchor"


# -- vectors --------------------------------------------------------------------------------
def encode_vectors(vectors: np.ndarray) -> list[str]:
    """Each row as base64 text of its float32 little-endian bytes."""
    return [bytes(b).decode("ascii") for b in encode_vectors_raw(vectors)]


def encode_vectors_raw(vectors: np.ndarray) -> list[bytes | memoryview]:
    """Each row as base64 of its float32 little-endian bytes (ASCII bytes, or views of them).
    When a row's size is a multiple of 3 bytes (dim divisible by 3: 384, 768, 1536) the whole
    block is encoded in one call and each row is a view into it (no padding falls between
    rows, and no row is copied)."""
    v = np.ascontiguousarray(vectors, dtype="<f4")
    n, dim = v.shape
    row = dim * 4
    if n and row % 3 == 0:
        block = memoryview(_b64encode(v))
        step = row // 3 * 4
        return [block[i:i + step] for i in range(0, len(block), step)]
    return [base64.b64encode(r.tobytes()) for r in v]


def decode_vector(value: Any, dim: int | None) -> np.ndarray:
    """One record's vector (base64 text, as str or bytes, or a sequence of numbers) as
    float32; ValueError naming the problem."""
    if isinstance(value, (str, bytes)):
        try:
            raw = binascii.a2b_base64(value, strict_mode=True)
        except (binascii.Error, ValueError) as e:
            raise ValueError(f"vector is not base64 ({e})") from None
        if len(raw) % 4:
            raise ValueError(f"vector holds {len(raw)} bytes, not a whole number of float32 values")
        v = np.frombuffer(raw, "<f4").astype(np.float32)
    else:
        try:
            v = np.asarray(value, dtype=np.float32)
        except (TypeError, ValueError):
            raise ValueError("vector must be base64 text or a list of numbers") from None
        if v.ndim != 1:
            raise ValueError(f"vector must be one list of numbers, got shape {v.shape}")
    if dim is not None and len(v) != dim:
        raise ValueError(f"vector has {len(v)} values, the import holds {dim}-dimensional vectors")
    return v


def decode_vectors(values: Sequence[Any], dim: int) -> np.ndarray:
    """Every record's vector at once: the batch's base64 texts decoded in one call when each
    has exactly one row's length (dim divisible by 3); else, or when that fails, one by one
    (``decode_vector`` then names the bad one)."""
    n = len(values)
    step = dim * 4 // 3 * 4 if (dim * 4) % 3 == 0 else 0
    kind = type(values[0]) if n else None
    if n and step and kind in (str, bytes) and all(type(x) is kind and len(x) == step for x in values):
        try:
            raw = _b64decode(kind().join(values))
            return np.frombuffer(raw, "<f4").reshape(n, dim).astype(np.float32, copy=False)
        except (binascii.Error, ValueError):
            pass
    out = np.empty((n, dim), np.float32)
    for i, x in enumerate(values):
        out[i] = decode_vector(x, dim)
    return out


def _b64encode(data: Any) -> bytes:
    """Base64 of a buffer: pybase64's SIMD encoder where installed, else binascii's."""
    if _pybase64 is not None:
        return _pybase64.b64encode(data)
    return base64.b64encode(memoryview(data).cast("B"))


def _b64decode(text: str | bytes) -> bytes:
    """Strict base64 decoding (no character outside the alphabet): pybase64's SIMD decoder
    where installed (about 2.5x binascii's speed on an export's vectors), else binascii."""
    if _pybase64 is not None:
        return _pybase64.b64decode(text, validate=True)
    return binascii.a2b_base64(text, strict_mode=True)


try:  # optional
    import pybase64 as _pybase64
except ImportError:  # pragma: no cover - depends on the environment
    _pybase64 = None


def loads_json(text: str | bytes) -> Any:
    """``json.loads``, through orjson where installed (a third of the time). orjson reads a
    subset of what json.loads reads, with the same values; anything it refuses is read again
    by json.loads, which decides (and words the error)."""
    if _fast_loads is not None:
        try:
            return _fast_loads(text)
        except ValueError:
            pass
    return json.loads(text)


try:  # optional
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - depends on the environment
    _fast_loads = None


class no_gc:
    """The cyclic garbage collector paused for a bulk transfer (``with no_gc():``) and
    restored after, when it was on. A transfer makes millions of short-lived, acyclic
    containers (parsed records, row tuples, column lists), which reference counting frees;
    each 700 of them started a collection that walked every live one: two thirds of the
    time to parse an export's lines and build their columns. Collection is only delayed
    (process-wide, for the transfer's duration)."""

    def __enter__(self) -> None:
        self.was_on = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.was_on:
            gc.enable()


# -- records --------------------------------------------------------------------------------
@dataclass
class Batch:
    """Records as read, column by column (``values[field name]``: one entry per record, None
    where it was left out), before checking. ``vectors``: per record its vector as read (None:
    none) or an (n, dim) array; ``clusters``: per record its pairs (None: none) or (ids, affinities)
    arrays padded with -1. ``error``: the record after these could not be read (its position
    and why): the reader stopped there. ``stored_json``: the str values of "json" fields are
    JSON objects in the stored form already (the native JSONL reader checked them), so they
    are kept without being read again."""

    values: dict[str, list[Any]]
    vectors: list[Any] | np.ndarray
    clusters: list[Any] | tuple[np.ndarray, np.ndarray] | None
    position: Callable[[int], str]
    error: tuple[str, str] | None = None
    stored_json: bool = False

    def __len__(self) -> int:
        return len(self.values["text"])


def batch_from_dicts(records: Sequence[dict[str, Any]], position: Callable[[int], str],
                     error: tuple[str, str] | None = None) -> Batch:
    """A ``Batch`` from dict records (JSONL lines, importers). A record that is not an object
    or names an unknown field ends the batch there (as an ``error``)."""
    known = record_names()
    if records and type(records[0]) is dict and records[0]:
        # Records that all name the same known fields (every line of an export): one
        # itemgetter call per record and one transposition, both in C, instead of a lookup
        # per field per record. Equal sizes and every name found mean the same field set.
        first = tuple(records[0])
        same = False
        if set(first) <= known and set(map(type, records)) == {dict} and set(map(len, records)) == {len(first)}:
            try:
                rows = list(map(itemgetter(*first), records))
                same = True
            except KeyError:
                pass
        if same:
            n = len(records)
            columns = dict(zip(first, zip(*rows))) if len(first) > 1 else {first[0]: rows}
            values = {f.name: list(columns[f.name]) if f.name in columns else [None] * n for f in FIELDS}
            vectors = list(columns[VECTOR]) if VECTOR in columns else [None] * n
            clusters = list(columns[CLUSTERS]) if CLUSTERS in columns else None
            return Batch(values, vectors, clusters, position, error)
    for i, rec in enumerate(records):
        bad = None
        if not isinstance(rec, dict):
            bad = f"a record must be a JSON object, got {type(rec).__name__}"
        elif rec.keys() == {"cluster"}:
            bad = "cluster records must come right after the header, before the memories"
        elif not rec.keys() <= known:
            unknown = sorted(set(rec) - known)
            bad = f"unknown field(s) {unknown} (known: {', '.join(sorted(known))})"
        if bad is not None:
            records, error = records[:i], (position(i), bad)
            break
    values = {f.name: [r.get(f.name) for r in records] for f in FIELDS}
    return Batch(values, [r.get(VECTOR) for r in records], [r.get(CLUSTERS) for r in records], position, error)


class Checked:
    """A batch's records that passed every check, typed for the store (see ``check``):
    ``values[field name]`` per ``FIELDS`` entry (a list, or a numpy array for numbers without
    nulls; a nullable float's nulls are NaN), the vectors ((n, dim) float32, zero rows where a
    record has none: ``has_vector``) and the soft assignments ((n, k) ids with -1 padding and
    affinities; None when no record has one). The fields the importer itself reads are also
    attributes (``texts``, ``keys``, ...)."""

    def __init__(self, n: int, values: dict[str, Any], vectors: np.ndarray, has_vector: np.ndarray,
                 cluster_ids: np.ndarray | None, affinities: np.ndarray | None) -> None:
        self.n, self.values = n, values
        self.vectors, self.has_vector = vectors, has_vector
        self.cluster_ids, self.affinities = cluster_ids, affinities

    ids = property(lambda self: self.values["id"])  # int64 array (-1: none), or None: no record has one
    texts = property(lambda self: self.values["text"])
    kinds = property(lambda self: self.values["kind"])
    metadata = property(lambda self: self.values["metadata"])  # JSON text or None
    created_at = property(lambda self: self.values["created_at"])
    last_accessed = property(lambda self: self.values["last_accessed"])  # NaN: never
    access_count = property(lambda self: self.values["access_count"])
    strength = property(lambda self: self.values["strength"])
    archived = property(lambda self: self.values["archived"])  # bool array

    @property
    def keys(self) -> list[str | None]:
        return self.values["key"]

    @keys.setter
    def keys(self, value: list[str | None]) -> None:
        self.values["key"] = value

    @property
    def namespaces(self) -> list[str]:
        return self.values["namespace"]

    @namespaces.setter
    def namespaces(self, value: list[str]) -> None:
        self.values["namespace"] = value

    def column(self, f: Field) -> list[Any]:
        """The values of ``f`` as the memories table stores them."""
        value = self.values[f.name]
        if f.type == "archived":
            return np.where(value, ARCHIVED, LIVE).tolist()
        if value is None:  # ids when no record has one (the importer gives them)
            return [None] * self.n
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "f" and f.nullable:
                return [None if math.isnan(x) else x for x in value.tolist()]
            return value.tolist()
        return value

    def take(self, at: np.ndarray) -> "Checked":
        """These records at positions ``at`` (in that order)."""
        lst = at.tolist()
        values = {name: None if v is None else v[at] if isinstance(v, np.ndarray) else [v[i] for i in lst]
                  for name, v in self.values.items()}
        return Checked(len(lst), values, self.vectors[at], self.has_vector[at],
                       None if self.cluster_ids is None else self.cluster_ids[at],
                       None if self.affinities is None else self.affinities[at])


class _Bad(Exception):
    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


def _first(values: Sequence[Any], ok: Callable[[Any], bool]) -> int:
    for i, v in enumerate(values):
        if not ok(v):
            return i
    return -1


def _strings(values: list[Any], name: str, default: Any, nullable: bool) -> list[Any]:
    if default is not None and default is not REQUIRED and None in values:
        values = [default if v is None else v for v in values]
    if set(map(type, values)) == {str} and all(map(str.strip, values)):
        return values
    for i, v in enumerate(values):
        if v is None:
            if default is REQUIRED:
                raise _Bad(i, f"{name} is missing")
            if not nullable:
                raise _Bad(i, f"{name} must not be null")
            continue
        if not isinstance(v, str):
            raise _Bad(i, f"{name} must be a string, got {type(v).__name__}")
        if not v.strip():
            raise _Bad(i, f"{name} is empty")
    return values


def _numbers(values: list[Any], name: str, dtype: Any, default: Any, nullable: bool) -> np.ndarray:
    """A numeric column: finite numbers (not bools); missing ones take ``default`` (NaN for a
    nullable field)."""
    fill = np.nan if nullable and default is None else default
    filled = [fill if v is None else v for v in values] if None in values else values
    try:
        if bool in set(map(type, filled)):
            raise TypeError
        arr = np.asarray(filled, dtype=np.float64)
        if arr.ndim != 1:
            raise TypeError
    except (TypeError, ValueError):
        i = _first(filled, lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool))
                   or (nullable and isinstance(v, float) and math.isnan(v)))
        raise _Bad(max(i, 0), f"{name} must be a number, got {filled[max(i, 0)]!r}") from None
    given = ~np.isnan(arr) if nullable else np.ones(len(arr), bool)
    bad = given & ~np.isfinite(arr)
    if bad.any():
        i = int(np.argmax(bad))
        raise _Bad(i, f"{name} must be finite, got {filled[i]!r}")
    if dtype == np.int64:
        frac = given & (arr != np.round(arr))
        if frac.any() or (arr[given] < 0).any():
            i = int(np.argmax(frac | (given & (arr < 0))))
            raise _Bad(i, f"{name} must be a non-negative integer, got {filled[i]!r}")
        return arr.astype(np.int64)
    return arr


def _meta_encoder() -> Callable[[Any], str]:
    """Metadata as ``MemoryStore.add`` writes it (json.dumps(ensure_ascii=False,
    allow_nan=False)), so an imported memory's stored text is the text its add stored. The
    C encoder is made once (``JSONEncoder.encode`` makes it again on every call: half the
    cost of a small object); parsed JSON holds no cycles, so it skips the cycle check."""
    c_make = getattr(json.encoder, "c_make_encoder", None)
    if c_make is None:  # pragma: no cover - an interpreter without the C accelerator
        return json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode

    def default(o: Any) -> Any:
        raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

    make = c_make(None, default, json.encoder.encode_basestring, None, ": ", ", ", False, False, False)
    return lambda obj: "".join(make(obj, 0))


_META_JSON = _meta_encoder()


def _metadata(values: list[Any], name: str = "metadata", stored: bool = False) -> list[str | None]:
    if set(map(type, values)) <= {str, type(None)}:
        if stored:
            return values
        # JSON texts (Parquet): the native check confirms the objects without the GIL; Python
        # reads only what it could not confirm (NaN, a repeated key...), and decides.
        values = list(values)
        for i in _native.unconfirmed_objects(values):
            values[i] = _metadata_value(values[i], i, name, stored)
        return values
    return [_metadata_value(v, i, name, stored) for i, v in enumerate(values)]


def _metadata_value(v: Any, i: int, name: str, stored: bool) -> str | None:
    """One metadata value as the memories table stores it (``_Bad`` when it cannot be)."""
    enc = _META_JSON
    if v is None:
        return None
    if isinstance(v, dict):
        try:
            return enc(v)
        except (TypeError, ValueError) as e:
            raise _Bad(i, f"{name} is not JSON-serialisable: {e}") from None
    if isinstance(v, str) and stored:
        # Already in json.dumps form (the native reader checked it): an object it rewrote
        # elsewhere in the batch does not send this one to be read again.
        return v
    if isinstance(v, str):  # JSON text (Parquet): kept as written once it reads as an object
        try:
            parsed = loads_json(v)
        except ValueError as e:
            raise _Bad(i, f"{name} is not valid JSON ({e})") from None
        if not isinstance(parsed, dict):
            raise _Bad(i, f"{name} must be a JSON object")
        return v
    raise _Bad(i, f"{name} must be an object or null, got {type(v).__name__}")


def _keys(values: list[Any]) -> list[str | None]:
    for i, k in enumerate(values):
        if k is None:
            continue
        if not isinstance(k, str) or not k:
            raise _Bad(i, f"key must be a non-empty string or null, got {k!r}")
        if len(k) > MAX_KEY_CHARS:
            raise _Bad(i, f"key has {len(k)} characters, more than {MAX_KEY_CHARS}")
        if "\x00" in k:
            raise _Bad(i, "key contains a NUL character")
    return values


def _texts(values: list[Any]) -> list[str]:
    out = _strings(values, "text", REQUIRED, False)
    if not all(map(str.isascii, out)):
        for i, t in enumerate(out):
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as e:
                raise _Bad(i, f"text is not valid unicode ({e.reason})") from None
    return out


def _vectors(values: list[Any] | np.ndarray, dim: int | None) -> tuple[np.ndarray, np.ndarray, int | None]:
    """(vectors (n, dim) float32 with zero rows where none was given, which rows have one,
    the width); every given vector finite, non-zero and of one width."""
    if isinstance(values, np.ndarray):
        v = values
        if dim is not None and v.shape[1] != dim:
            raise _Bad(0, f"vector has {v.shape[1]} values, the import holds {dim}-dimensional vectors")
        has = np.ones(len(v), bool)
        dim = v.shape[1]
    else:
        has = np.fromiter((x is not None for x in values), bool, len(values))
        if dim is None and has.any():
            first = int(np.argmax(has))
            try:
                dim = len(decode_vector(values[first], None))
            except ValueError as e:
                raise _Bad(first, str(e)) from None
            if dim == 0:
                raise _Bad(first, "vector is empty")
        if dim is None:
            return np.zeros((len(values), 0), np.float32), has, None
        v = np.zeros((len(values), dim), np.float32)
        at = np.flatnonzero(has)
        if len(at) == len(values):
            try:
                v = decode_vectors(values, dim)
            except ValueError:
                for i, x in enumerate(values):  # find and name the bad one
                    try:
                        decode_vector(x, dim)
                    except ValueError as e:
                        raise _Bad(i, str(e)) from None
        else:
            for i in at.tolist():
                try:
                    v[i] = decode_vector(values[i], dim)
                except ValueError as e:
                    raise _Bad(i, str(e)) from None
    with np.errstate(over="ignore", invalid="ignore"):
        sq = np.einsum("ij,ij->i", v, v, dtype=np.float64)
    bad = has & ~np.isfinite(sq)
    if bad.any():
        raise _Bad(int(np.argmax(bad)), "vector holds NaN or infinity")
    zero = has & (sq <= 0)
    if zero.any():
        raise _Bad(int(np.argmax(zero)), "vector is all zeros")
    return np.ascontiguousarray(v, dtype=np.float32), has, dim


def _clusters(values: list[Any] | tuple[np.ndarray, np.ndarray] | None, n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    if values is None:
        return None, None
    if isinstance(values, tuple):  # arrays (Parquet): ids >= 0, -1 padding, finite affinities
        ids, aff = values
        bad = (ids < -1) | ((ids >= 0) & ~np.isfinite(aff))
        if bad.any():
            i = int(np.argmax(bad.any(axis=1)))
            raise _Bad(i, f"clusters must hold cluster ids >= 0 with finite affinities, got {ids[i].tolist()}")
        return values
    if all(v is None for v in values):
        return None, None
    try:
        # Every record a list of [int, number] pairs: flattened and checked in numpy.
        counts = np.fromiter(map(len, values), np.int64, n)
        pairs = list(chain.from_iterable(values))
        if set(map(len, pairs)) - {2} or set(map(type, map(itemgetter(0), pairs))) - {int}:
            raise TypeError
        flat = np.fromiter(chain.from_iterable(pairs), np.float64, 2 * len(pairs)).reshape(-1, 2)
        ok = np.isfinite(flat).all() and (flat[:, 0] >= 0).all()
    except (TypeError, ValueError):
        ok = False
    if ok:
        k = max(int(counts.max()), 1)
        ids = np.full((n, k), -1, np.int64)
        aff = np.zeros((n, k), np.float32)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for j in range(k):
            rows = np.flatnonzero(counts > j)
            ids[rows, j] = flat[starts[rows] + j, 0]
            aff[rows, j] = flat[starts[rows] + j, 1]
        return ids, aff
    k = max((len(v) for v in values if isinstance(v, (list, tuple))), default=1)
    ids = np.full((n, max(k, 1)), -1, np.int64)
    aff = np.zeros((n, max(k, 1)), np.float32)
    for i, pairs in enumerate(values):
        if pairs is None:
            continue
        if not isinstance(pairs, (list, tuple)):
            raise _Bad(i, f"clusters must be a list of [cluster id, affinity] pairs, got {type(pairs).__name__}")
        for j, p in enumerate(pairs):
            if (not isinstance(p, (list, tuple)) or len(p) != 2 or type(p[0]) is not int or p[0] < 0
                    or not isinstance(p[1], (int, float)) or isinstance(p[1], bool) or not math.isfinite(p[1])):
                raise _Bad(i, f"clusters[{j}] must be [cluster id >= 0, finite affinity], got {p!r}")
            ids[i, j], aff[i, j] = p
    return ids, aff


def check(batch: Batch, dim: int | None, now: float | None = None) -> tuple[Checked, int | None, tuple[int, str] | None]:
    """The batch's records checked and typed, with the width of their vectors (``dim``, or
    the first vector's). Checks run column by column; when a record fails one, the records
    before the first failing one are returned with (its index, the reason), and the caller
    imports those and stops."""
    n = len(batch)
    cut: tuple[int, str] | None = None
    while True:
        try:
            checked, width = _check(batch, n, dim, now)
            return checked, width, cut
        except _Bad as e:
            if cut is None or e.index < cut[0]:
                cut = (e.index, str(e))
            n = e.index
            batch = _head(batch, n)


def _head(batch: Batch, n: int) -> Batch:
    clusters = batch.clusters
    if isinstance(clusters, tuple):
        clusters = (clusters[0][:n], clusters[1][:n])
    elif clusters is not None:
        clusters = clusters[:n]
    return Batch({k: v[:n] for k, v in batch.values.items()}, batch.vectors[:n], clusters, batch.position,
                 stored_json=batch.stored_json)


def _ids(values: list[Any]) -> np.ndarray | None:
    """The records' ids (-1 where one has none), or None when none has one."""
    if all(v is None for v in values):
        return None
    for i, v in enumerate(values):
        if v is not None and (type(v) is not int or v < 0):
            raise _Bad(i, f"id must be an integer >= 0, got {v!r}")
    return np.asarray([-1 if v is None else v for v in values], np.int64)


def _check_field(f: Field, values: list[Any], now: float, stored_json: bool = False) -> Any:
    """One field's column checked and typed (``_Bad`` names the first bad record)."""
    default = now if f.default is NOW else f.default
    if f.type in ("str", "key", "text") and not f.nullable and default is not None and default is not REQUIRED:
        values = [default if v is None else v for v in values] if None in values else values
    if f.type == "id":
        return _ids(values)
    if f.type == "key":
        return _keys(values)
    if f.type == "text":
        return _texts(values)
    if f.type == "str":
        return _strings(values, f.name, REQUIRED if default is None and not f.nullable else default, f.nullable)
    if f.type == "json":
        return _metadata(values, f.name, stored_json)
    if f.type == "archived":
        i = _first(values, lambda v: v is None or type(v) is bool)
        if i >= 0:
            raise _Bad(i, f"{f.name} must be true or false, got {values[i]!r}")
        return np.fromiter((v is True for v in values), bool, len(values))
    if f.type == "float":
        return _numbers(values, f.name, np.float64, default, f.nullable)
    if f.type == "int":
        if f.nullable and None in values:  # nulls kept: an int column has no NaN
            checked = _numbers([0 if v is None else v for v in values], f.name, np.int64, 0, False)
            return [None if v is None else c for v, c in zip(values, checked.tolist())]
        return _numbers(values, f.name, np.int64, default, False)
    raise ValueError(f"unknown field type {f.type!r}")


def _check(batch: Batch, n: int, dim: int | None, now: float | None) -> tuple[Checked, int | None]:
    now = time.time() if now is None else now
    values = {f.name: _check_field(f, batch.values[f.name], now, batch.stored_json) for f in FIELDS}
    vectors, has, width = _vectors(batch.vectors, dim)
    cids, aff = _clusters(batch.clusters, n)
    return Checked(n, values, vectors, has, cids, aff), width
