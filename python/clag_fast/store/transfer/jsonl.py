"""JSON Lines: the export format for people and pipes.

Line 1 is the header (``{"format": "clag_fast-export", ...}``), then one line per cluster
(``{"cluster": {...}}``), then one line per memory (the fields of ``fields.FIELDS``, ``vector``
as base64, ``clusters`` as pairs). A file without the header is read too: every line a memory
record (only ``text`` is required; without ``vector`` the store embeds the text).
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring  # the C encoder json.dumps uses for one string
from typing import IO, Any, Callable, Iterator, Sequence

import numpy as np

from clag_fast.store.transfer.fields import CLUSTERS, FIELDS, FORMAT, VECTOR, Batch, batch_from_dicts
from clag_fast.store.transfer.importer import Source

try:  # optional: parses a line with a 2 kB vector in a third of json.loads' time
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - depends on the environment
    _fast_loads = None


def _encoder(kind: str) -> Callable[[Any], str]:
    """How a value of a field type is written (None -> null). Floats by ``repr``: the shortest
    text that reads back to the same double."""
    if kind == "str":
        return lambda v: "null" if v is None else encode_basestring(v)
    if kind == "float":
        return lambda v: "null" if v is None else repr(float(v))
    if kind == "int":
        return lambda v: "null" if v is None else str(int(v))
    if kind == "json":  # stored JSON text, written as it is (it holds no newline: json.dumps without indent)
        return lambda v: "null" if v is None else (v if "\n" not in v else json.dumps(json.loads(v)))
    if kind == "archived":
        return lambda v: "true" if v else "false"
    raise ValueError(f"unknown field type {kind!r}")


_FIELD_WRITERS = [(f'"{f.name}":', _encoder(f.type)) for f in FIELDS]


class Writer:
    """Writes an export to a text file object (UTF-8)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def header(self, header: dict[str, Any], clusters: list[dict[str, Any]]) -> None:
        lines = [json.dumps(header, ensure_ascii=False)]
        lines += [json.dumps({"cluster": c}, ensure_ascii=False) for c in clusters]
        self.out.write("\n".join(lines) + "\n")

    def memories(self, rows: Sequence[tuple], vectors: list[str], cluster_ids: np.ndarray, affinities: np.ndarray,
                 archived: Sequence[bool]) -> None:
        """``rows``: the FIELDS values of each memory as the catalog stores them (``archived``
        given apart, as bools); ``vectors``: base64 rows; pairs with -1 ids are left out."""
        writers = _FIELD_WRITERS
        state_at = [i for i, f in enumerate(FIELDS) if f.type == "archived"]
        ids_l, aff_l = cluster_ids.tolist(), affinities.tolist()
        out = []
        for r, vec, cids, affs, arch in zip(rows, vectors, ids_l, aff_l, archived):
            parts = [name + (enc(arch) if i in state_at else enc(r[i])) for i, (name, enc) in enumerate(writers)]
            pairs = ",".join(f"[{c},{a!r}]" for c, a in zip(cids, affs) if c >= 0)
            out.append("{" + ",".join(parts) + f',"{VECTOR}":"{vec}","{CLUSTERS}":[{pairs}]}}')
        self.out.write("\n".join(out) + "\n")


def read(f: IO[bytes], batch_size: int, name: str = "input") -> Source:
    """A ``Source`` over a JSONL export (or header-less records) in the binary file ``f``.
    Positions read "line N". The header and the cluster lines are read here; the memory
    lines as the batches are consumed."""
    loads = _loads
    lineno = 0
    header = None
    clusters: list[dict[str, Any]] = []
    pending: tuple[int, Any] | None = None  # the first memory line, read while looking for clusters
    error: tuple[str, str] | None = None
    for raw in f:
        lineno += 1
        if not raw.strip():
            continue
        try:
            value = loads(raw)
        except ValueError as e:
            error = (f"{name} line {lineno}", f"not valid JSON ({e})")
            break
        if lineno == 1 and isinstance(value, dict) and value.get("format") == FORMAT:
            header = value
            if value.get("version") != 1:
                raise ValueError(f"{name}: export format version {value.get('version')!r} is not one this clag_fast "
                                 "reads (1)")
            continue
        if header is not None and isinstance(value, dict) and value.keys() == {"cluster"}:
            if not isinstance(value["cluster"], dict) or not isinstance(value["cluster"].get("id"), int):
                error = (f"{name} line {lineno}", "a cluster record needs an integer id")
                break
            clusters.append(value["cluster"])
            continue
        pending = (lineno, value)
        break
    total = int(header["memories"]) if header is not None and isinstance(header.get("memories"), int) else None
    return Source(header, clusters, _batches(f, batch_size, name, lineno, pending, error), total)


def _batches(f: IO[bytes], batch_size: int, name: str, lineno: int, pending: tuple[int, Any] | None,
             error: tuple[str, str] | None) -> Iterator[Batch]:
    loads = _loads
    records: list[Any] = []
    lines: list[int] = []
    if pending is not None:
        lines.append(pending[0])
        records.append(pending[1])
    if error is None:
        for raw in f:
            lineno += 1
            if len(raw) <= 2 and not raw.strip():
                continue
            try:
                records.append(loads(raw))
            except ValueError as e:
                error = (f"{name} line {lineno}", f"not valid JSON ({e})")
                break
            lines.append(lineno)
            if len(records) >= batch_size:
                yield _batch(records, lines, name)
                records, lines = [], []
    if records or error is not None:
        yield _batch(records, lines, name, error)


def _batch(records: list[Any], lines: list[int], name: str, error: tuple[str, str] | None = None) -> Batch:
    for i, rec in enumerate(records):
        if isinstance(rec, dict) and "cluster" in rec and len(rec) == 1:
            error = (f"{name} line {lines[i]}", "cluster records must come right after the header, before the memories")
            records, lines = records[:i], lines[:i]
            break
    return batch_from_dicts(records, lambda i: f"{name} line {lines[i]}", error)


def _loads(raw: bytes) -> Any:
    if _fast_loads is not None:
        try:
            return _fast_loads(raw)
        except ValueError:
            pass  # json.loads decides (and words the error); it also reads NaN, which is then refused
    return json.loads(raw)
