"""Parquet (pyarrow, optional: ``pip install 'clag_fast[transfer]'``): the export format for
data tools. One column per ``fields.FIELDS`` entry (metadata as JSON text), ``vector`` as a
fixed-size list of float32, ``clusters`` as a list of {id, affinity}; the header and the
cluster records sit in the file's key-value metadata under ``clag_fast``. A Parquet file
without it is read as records (only ``text`` is required).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from clag_fast.store.transfer import fields as record
from clag_fast.store.transfer.fields import CLUSTERS, VECTOR, WRITTEN_AS, Batch
from clag_fast.store.transfer.importer import Source

META_KEY = b"clag_fast"


def _pa() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:
        raise ImportError("Parquet export and import need pyarrow: pip install pyarrow (or 'clag_fast[transfer]'), "
                          f"or use .jsonl ({e})") from None
    return pyarrow


def _arrow_type(kind: str, pa: Any) -> Any:
    return {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "json": pa.string(),
            "archived": pa.bool_()}[WRITTEN_AS.get(kind, kind)]


class Writer:
    """Writes an export to ``path``, one row group per batch."""

    def __init__(self, path: Path, dim: int) -> None:
        self.pa = _pa()
        self.path, self.dim = path, dim
        self._writer: Any = None

    def header(self, header: dict[str, Any], clusters: list[dict[str, Any]]) -> None:
        pa = self.pa
        fields = [pa.field(f.name, _arrow_type(f.type, pa), nullable=f.nullable) for f in record.FIELDS]
        # Elements declared non-null: a reader then decodes no definition level per float
        # (200k vectors of 384: 0.98 -> 0.41 s; BENCHMARKS.md "Export and import"). The column
        # is still a fixed-size list of float32 to every Parquet reader.
        self.vector_type = pa.list_(pa.field("element", pa.float32(), nullable=False), self.dim)
        pair = pa.struct([pa.field("id", pa.int64(), nullable=False), pa.field("affinity", pa.float32(), nullable=False)])
        self.pairs_type = pa.list_(pa.field("element", pair, nullable=False))
        fields.append(pa.field(VECTOR, self.vector_type, nullable=False))
        fields.append(pa.field(CLUSTERS, self.pairs_type))
        meta = json.dumps(dict(header, cluster_records=clusters), ensure_ascii=False).encode("utf-8")
        self.schema = pa.schema(fields, metadata={META_KEY: meta})
        import pyarrow.parquet as pq

        # Vectors do not compress, are not repeated and are never filtered by range: no codec,
        # no dictionary and no min/max statistics for them (200k memories: 7% less time to
        # write the file, 18% less to read it; BENCHMARKS.md "Export and import").
        names = [f.name for f in fields]
        self._writer = pq.ParquetWriter(str(self.path), self.schema,
                                        compression={n: "none" if n == VECTOR else "snappy" for n in names},
                                        use_dictionary=["namespace", "kind"],
                                        write_statistics=[n for n in names if n != VECTOR])

    def memories(self, columns: Sequence[Sequence[Any]], vectors: np.ndarray, cluster_ids: np.ndarray,
                 affinities: np.ndarray, archived: Sequence[bool]) -> None:
        """One row group: ``columns`` one sequence per FIELDS entry (``archived`` apart)."""
        pa = self.pa
        arrays = []
        for i, f in enumerate(record.FIELDS):
            values = archived if f.type == "archived" else columns[i]
            arrays.append(pa.array(values, type=_arrow_type(f.type, pa)))
        flat = np.ascontiguousarray(vectors, np.float32).reshape(-1)
        arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), type=self.vector_type))
        have = cluster_ids >= 0
        counts = have.sum(axis=1)
        offsets = np.zeros(len(counts) + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        # Pairs are best first with -1 padding at the end: row-major order of the kept ones.
        pairs = pa.StructArray.from_arrays([pa.array(cluster_ids[have], pa.int64()),
                                            pa.array(affinities[have], pa.float32())],
                                           fields=list(self.pairs_type.value_type))
        arrays.append(pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pairs, type=self.pairs_type))
        self._writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def read(path: Path, batch_size: int) -> Source:
    """A ``Source`` over a Parquet file. Positions read "row N" (from 1)."""
    _pa()
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(str(path))
    meta = (pf.schema_arrow.metadata or {}).get(META_KEY)
    header = clusters = None
    if meta is not None:
        header = json.loads(meta)
        clusters = header.pop("cluster_records", [])
        if header.get("version") != 1:
            raise ValueError(f"{path}: export format version {header.get('version')!r} is not one this clag_fast "
                             "reads (1)")
    names = pf.schema_arrow.names
    known = record.record_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{path}: unknown column(s) {unknown} (known: {', '.join(sorted(known))})")
    return Source(header, clusters or [], _batches(pf, path, batch_size), pf.metadata.num_rows)


def _batches(pf: Any, path: Path, batch_size: int) -> Iterator[Batch]:
    start = 0
    # One thread: Arrow's pool decoding the columns beside the import's own reader and writer
    # threads cost twice the CPU for the same wall time on two cores.
    for rb in pf.iter_batches(batch_size=batch_size, use_threads=False):
        n = rb.num_rows
        names = rb.schema.names
        values = {f.name: (rb.column(f.name).to_pylist() if f.name in names else [None] * n) for f in record.FIELDS}
        vectors: Any = [None] * n
        if VECTOR in names:
            vectors = _vectors(rb.column(VECTOR))
        clusters = _clusters(rb.column(CLUSTERS)) if CLUSTERS in names else None
        first = start
        yield Batch(values, vectors, clusters, lambda i, first=first: f"{path} row {first + i + 1}")
        start += n


def _vectors(col: Any) -> Any:
    """(n, dim) float32 when every row has a fixed-size float vector; else per-row lists."""
    import pyarrow as pa

    if pa.types.is_fixed_size_list(col.type) and col.null_count == 0:
        values = col.flatten()
        # A view of Arrow's buffer when it holds no null (read-only: the import never writes
        # to a batch's vectors); a copy otherwise.
        flat = values.to_numpy(zero_copy_only=values.null_count == 0)
        return np.ascontiguousarray(flat.reshape(len(col), col.type.list_size), dtype=np.float32)
    return col.to_pylist()


def _clusters(col: Any) -> tuple[np.ndarray, np.ndarray]:
    """(ids, affinities) padded with -1 from a list<struct<id, affinity>> column."""
    n = len(col)
    offsets = col.offsets.to_numpy()
    counts = np.diff(offsets)
    if col.null_count:
        counts[np.asarray(col.is_null().to_numpy(zero_copy_only=False), bool)] = 0
    k = max(int(counts.max()) if n else 0, 1)
    values = col.values
    flat_ids = values.field("id").to_numpy(zero_copy_only=False)
    flat_aff = values.field("affinity").to_numpy(zero_copy_only=False)
    ids = np.full((n, k), -1, np.int64)
    aff = np.zeros((n, k), np.float32)
    for j in range(k):
        rows = np.flatnonzero(counts > j)
        ids[rows, j] = flat_ids[offsets[rows] + j]
        aff[rows, j] = flat_aff[offsets[rows] + j]
    return ids, aff
