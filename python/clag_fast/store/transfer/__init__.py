"""Moving memories in and out of a store: export (JSONL, Parquet), a resumable import keyed
by identity, and importers from other stores (Chroma, mem0, LangGraph).

Modules:
  fields    the record format, defined once (``FIELDS``), and the checks an imported record passes
  exporter  a store's memories and clusters to a file
  importer  records into a store: identity, clusters, the write order (``Import``)
  jsonl     JSON Lines reading and writing
  parquet   Parquet reading and writing (pyarrow, optional)
  sources   records from a Chroma collection, a mem0 dump, a LangGraph store

``MemoryStore.export`` / ``MemoryStore.import_`` and ``clag-fast export`` / ``import`` are
the entry points; ``from_chroma``, ``from_mem0`` and ``from_langgraph`` give records for
``import_``.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any, Callable, Iterable

from clag_fast.store.transfer.exporter import export, format_of, store_id
from clag_fast.store.transfer.fields import FIELDS
from clag_fast.store.transfer.importer import Import, Source, records_source
from clag_fast.store.transfer.sources import from_chroma, from_langgraph, from_mem0

__all__ = ["FIELDS", "Import", "Source", "export", "format_of", "from_chroma", "from_langgraph", "from_mem0",
           "open_source", "store_id"]

#: Records per import batch (each one SQLite transaction and one index save).
BATCH = 65_536


def open_source(source: str | Path | IO[Any] | Iterable[dict[str, Any]], fmt: str | None = None,
                batch_size: int = BATCH) -> tuple[Source, Callable[[], None]]:
    """(the records of ``source``, a function closing what was opened): a path (.jsonl or
    .parquet, or ``fmt``), a JSONL file object, or an iterable of dict records."""
    from clag_fast.store.transfer import jsonl, parquet

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(source, (str, Path)):
        path = Path(source)
        if format_of(path, fmt) == "parquet":
            return parquet.read(path, batch_size), lambda: None
        f = open(path, "rb")
        try:
            return jsonl.read(f, batch_size, str(path)), f.close
        except BaseException:
            f.close()
            raise
    if hasattr(source, "read"):
        if fmt not in (None, "jsonl"):
            raise ValueError("a file object is read as JSONL; Parquet needs a path")
        return jsonl.read(source, batch_size), lambda: None
    if isinstance(source, (dict, bytes)):
        raise TypeError("import_ takes a path, a JSONL file object or an iterable of record dicts")
    return records_source(source, batch_size), lambda: None
