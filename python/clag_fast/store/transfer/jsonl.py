"""JSON Lines: the export format for people and pipes.

Line 1 is the header (``{"format": "clag_fast-export", ...}``), then one line per cluster
(``{"cluster": {...}}``), then one line per memory (the fields of ``fields.FIELDS``, ``vector``
as base64, ``clusters`` as pairs). A file without the header is read too: every line a memory
record (only ``text`` is required; without ``vector`` the store embeds the text).
"""

from __future__ import annotations

import io
import json
from json.encoder import encode_basestring  # the C encoder json.dumps uses for one string
from typing import IO, Any, Iterator, Sequence

import numpy as np

from clag_fast.store.transfer import fields
from clag_fast.store.transfer.fields import CLUSTERS, FORMAT, VECTOR, WRITTEN_AS, Batch, batch_from_dicts, loads_json
from clag_fast.store.transfer.importer import Source



def _encode(kind: str, nullable: bool, col: Sequence[Any]) -> list[str]:
    """A column's values as JSON texts, one C-level pass where the column allows (None ->
    null). Floats by ``repr``: the shortest text that reads back to the same double. Stored
    metadata is JSON text already (json.dumps without indent: no newline) and goes as it is."""
    kind = WRITTEN_AS.get(kind, kind)
    if kind == "archived":
        return ["true" if v else "false" for v in col]
    if kind == "json":
        return ["null" if v is None else v if "\n" not in v else json.dumps(json.loads(v)) for v in col]
    one = {"str": encode_basestring, "float": lambda v: repr(float(v)), "int": lambda v: str(int(v))}[kind]
    if nullable and None in col:
        return ["null" if v is None else one(v) for v in col]
    if kind == "str":
        return list(map(encode_basestring, col))
    if kind == "float":
        return list(map(repr, map(float, col)))
    return list(map(str, map(int, col)))


#: Lines per native call and write: about 9 MB at dim 384, so the buffers are reused, not
#: mapped afresh.
_CHUNK = 4096


class Writer:
    """Writes an export to a file object: binary, or text (UTF-8 text is written)."""

    def __init__(self, out: IO[Any]) -> None:
        self.out = out
        self.text = isinstance(out, io.TextIOBase)

    def _write(self, data: bytes) -> None:
        self.out.write(data.decode("utf-8") if self.text else data)

    def header(self, header: dict[str, Any], clusters: list[dict[str, Any]]) -> None:
        lines = [json.dumps(header, ensure_ascii=False)]
        lines += [json.dumps({"cluster": c}, ensure_ascii=False) for c in clusters]
        self._write(("\n".join(lines) + "\n").encode("utf-8"))

    def memories(self, columns: Sequence[Sequence[Any]], vectors: np.ndarray, cluster_ids: np.ndarray,
                 affinities: np.ndarray, archived: Sequence[bool]) -> None:
        """``columns``: the FIELDS values of the memories as the catalog stores them, one
        sequence per field (``archived`` given apart, as bools); ``vectors``: their float32
        rows; pairs with -1 ids are left out. Each field's JSON texts are made column by
        column (one C-level pass each), then the native side joins them with the field names,
        the base64 of each vector and the pairs (affinities at nine significant digits: each
        float32 exactly) into lines, without the GIL
        (``_clag_fast.format_export_lines``): per-line %-formats in Python and a base64 block
        cut into views cost half the export's time."""
        from clag_fast._clag_fast import format_export_lines

        n = len(archived)
        if not n:
            return
        texts = [_encode(f.type, f.nullable, archived if f.type == "archived" else columns[i])
                 for i, f in enumerate(fields.FIELDS)]
        names = [f.name for f in fields.FIELDS]
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        ids = np.ascontiguousarray(cluster_ids, dtype=np.int64)
        aff = np.ascontiguousarray(affinities, dtype=np.float32)
        for i in range(0, n, _CHUNK):
            j = i + _CHUNK
            self._write(format_export_lines(names, [t[i:j] for t in texts], vectors[i:j], ids[i:j], aff[i:j]))


def read(f: IO[bytes], batch_size: int, name: str = "input") -> Source:
    """A ``Source`` over a JSONL export (or header-less records) in the binary file ``f``.
    Positions read "line N". The header and the cluster lines are read here; the memory
    lines as the batches are consumed."""
    lineno = 0
    header = None
    clusters: list[dict[str, Any]] = []
    pending: tuple[int, Any] | None = None  # the first memory line, read while looking for clusters
    first: Any = None  # that line as read
    error: tuple[str, str] | None = None
    for raw in f:
        lineno += 1
        if not raw.strip():
            continue
        try:
            value = loads_json(raw)
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
        pending, first = (lineno, value), raw
        break
    total = int(header["memories"]) if header is not None and isinstance(header.get("memories"), int) else None
    if pending is not None and error is None and isinstance(first, bytes) and fast_fields() is not None:
        dim = header.get("dim") if header is not None else None
        batches = _fast_batches(f, batch_size, name, pending[0], first, dim if type(dim) is int and dim > 0 else None)
    else:
        batches = _batches(f, batch_size, name, lineno, pending, error)
    return Source(header, clusters, batches, total)


#: Bytes of lines read per call (about 28,000 export lines at dim 384).
_READ = 64 << 20


def _batches(f: IO[bytes], batch_size: int, name: str, lineno: int, pending: tuple[int, Any] | None,
             error: tuple[str, str] | None, before: list[bytes] | None = None) -> Iterator[Batch]:
    """Batches of ``batch_size`` records. Lines are read many at a time and parsed by one
    ``map`` (a Python loop per line cost more than the parse); a chunk holding a blank or
    malformed line is parsed line by line, which names it. ``before``: lines read already,
    the first of them line ``lineno + 1``."""
    records: list[Any] = []
    lines: list[int] = []
    if pending is not None:
        lines.append(pending[0])
        records.append(pending[1])
    while error is None:
        chunk = before or f.readlines(_READ)
        before = None
        if not chunk:
            break
        try:
            got = list(map(loads_json, chunk))
            at = list(range(lineno + 1, lineno + 1 + len(chunk)))
        except ValueError:
            got, at, error = _line_by_line(chunk, lineno, name)
        lineno += len(chunk)
        records += got
        lines += at
        while len(records) >= batch_size:
            yield _batch(records[:batch_size], lines[:batch_size], name)
            records, lines = records[batch_size:], lines[batch_size:]
    if records or error is not None:
        yield _batch(records, lines, name, error)


def _line_by_line(chunk: list[bytes], lineno: int, name: str) -> tuple[list[Any], list[int], tuple[str, str] | None]:
    """(records, their line numbers, the first malformed line's position and reason), blank
    lines skipped."""
    got: list[Any] = []
    at: list[int] = []
    for i, raw in enumerate(chunk, start=lineno + 1):
        if not raw.strip():
            continue
        try:
            got.append(loads_json(raw))
        except ValueError as e:
            return got, at, (f"{name} line {i}", f"not valid JSON ({e})")
        at.append(i)
    return got, at, None


def _batch(records: list[Any], lines: list[int], name: str, error: tuple[str, str] | None = None) -> Batch:
    return batch_from_dicts(records, lambda i: f"{name} line {lines[i]}", error)


#: Bytes read per call on the fast path: under glibc's largest mmap threshold (32 MiB), so
#: the buffer comes back from the heap each time instead of fresh pages (faulting in fresh
#: pages made a copy about six times slower on the BENCHMARKS.md machine).
_FAST_READ = 16 << 20

#: How the native parser reads each field type (``records.rs``).
_NATIVE_KIND = {"id": "count", "int": "count", "float": "float", "str": "str", "key": "str", "text": "str",
                "json": "object", "archived": "bool"}


def fast_fields() -> tuple[list[str], list[str]] | None:
    """(record names, their native kinds) for the native parser, or None when a field's type
    has no native reading (the general path then reads every line)."""
    kinds = [_NATIVE_KIND.get(f.type) for f in fields.FIELDS]
    if None in kinds:
        return None
    return [f.name for f in fields.FIELDS] + [VECTOR, CLUSTERS], [str(k) for k in kinds] + ["vector", "pairs"]


def _fast_batches(f: IO[bytes], batch_size: int, name: str, lineno: int, first: bytes,
                  dim: int | None) -> Iterator[Batch]:
    """Batches of ``batch_size`` records, ``first`` (line ``lineno``) and the lines after it,
    parsed by the native reader (``_clag_fast.parse_export_lines``, without the GIL):
    columns come out whole, vectors decoded into one float32 block. At the first line it does
    not take (another layout, a null vector, a malformed line...) the records before it go as
    a batch and that line and the rest are read by the general path (``_batches``), which
    reads, checks and names what the native one left."""
    from clag_fast._clag_fast import parse_export_lines

    names, kinds = fast_fields()  # type: ignore[misc]
    pieces: list[tuple[int, list[Any], np.ndarray, tuple[np.ndarray, np.ndarray] | None]] = []
    have, start, data, pos = 0, lineno, first, 0
    while True:
        if pos >= len(data):
            data, pos = f.read(_FAST_READ), 0
            if not data:
                break
            if not data.endswith(b"\n"):
                data += f.readline()
        n, used, stopped, columns, vectors, pairs = parse_export_lines(data, pos, names, kinds, dim,
                                                                       batch_size - have)
        pos += used
        if n:
            pieces.append((n, columns, vectors, pairs))
            have += n
            dim = vectors.shape[1]
        if have == batch_size or (stopped and have):
            yield _assemble(pieces, name, start)
            start += have
            pieces, have = [], 0
        if stopped:
            rest = data[pos:].split(b"\n")
            before = [line + b"\n" for line in rest[:-1]] + ([rest[-1]] if rest[-1] else [])
            yield from _batches(f, batch_size, name, start - 1, None, None, before)
            return
    if pieces:
        yield _assemble(pieces, name, start)


def _assemble(pieces: list[tuple[int, list[Any], np.ndarray, tuple[np.ndarray, np.ndarray] | None]], name: str,
              first: int) -> Batch:
    """One ``Batch`` of the native reader's pieces (consecutive lines from line ``first``)."""
    fields_ = fields.FIELDS
    if len(pieces) == 1:
        _, columns, vectors, pairs = pieces[0]
        values = {f.name: columns[i] for i, f in enumerate(fields_)}
    else:
        values = {f.name: [v for p in pieces for v in p[1][i]] for i, f in enumerate(fields_)}
        vectors = np.concatenate([p[2] for p in pieces])
        pairs = None
        if any(p[3] is not None for p in pieces):
            k = max(p[3][0].shape[1] for p in pieces if p[3] is not None)
            ids = np.full((len(vectors), k), -1, np.int64)
            aff = np.zeros((len(vectors), k), np.float32)
            at = 0
            for n, _, _, got in pieces:
                if got is not None:
                    ids[at:at + n, :got[0].shape[1]] = got[0]
                    aff[at:at + n, :got[1].shape[1]] = got[1]
                at += n
            pairs = (ids, aff)
    for f in fields_:
        if f.type == "json":
            # Objects not in the stored form came as their text (bytes): read here, written
            # in that form by the check, as the general path does.
            col = values[f.name]
            if bytes in set(map(type, col)):
                values[f.name] = [loads_json(v) if type(v) is bytes else v for v in col]
    return Batch(values, vectors, pairs, lambda i: f"{name} line {first + i}", stored_json=True)
