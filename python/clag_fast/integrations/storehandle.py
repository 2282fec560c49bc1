"""The MemoryStore behind a framework adapter, opened once the vector width is known.

Framework stores (LangChain, LlamaIndex) are built before their first vector exists, and
their embedding models do not say their width up front. ``StoreHandle`` opens (or creates)
the ``MemoryStore`` on the first write, with ``dim`` taken from that write's vectors; a store
passed in, or one already on disk, is used as it is. Without a path the store lives in a
temporary directory removed at ``close()`` (the in-memory stores' behaviour, kept on disk
because the store is memory-mapped).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
from clag_fast._deprecated import renamed_kwargs
from clag_fast.config import StoreConfig
from clag_fast.errors import DimensionMismatchError
from clag_fast.store import MemoryStore

log = logging.getLogger(__name__)


def query_vector(vector: Any, dim: int | None) -> np.ndarray:
    """A query as a unit float32 vector of ``dim`` (ValueError naming the problem otherwise;
    ``dim`` None: a store whose width its first vectors will fix, which holds nothing yet).

    Normalised here because the store's exact search over a small filtered subset
    (``store.search``, since the keys branch's gathered-vector path) scores the query as
    given, while its native search normalises it: scores must not depend on the path."""
    q = np.asarray(vector, dtype=np.float32)
    if q.ndim != 1 or (dim is not None and q.shape[0] != dim):
        raise ValueError(f"query vector has shape {q.shape}, the store holds {dim}-dimensional vectors")
    norm = float(np.sqrt(q @ q))
    if not np.isfinite(norm) or norm == 0.0:
        raise ValueError("query vector is zero or not finite")
    return q / norm


class StoreHandle:
    """Owns the adapter's ``MemoryStore``: opens it lazily, checks vector widths, closes it.

    store: an open ``MemoryStore`` to use (the caller keeps ownership; ``close()`` leaves it
      open), or None.
    path: the store directory; None = a temporary directory removed at ``close()``.
    config: the ``StoreConfig`` for a new store (its ``dim`` is replaced by the width of the
      first vectors written).
    encoder: passed to ``MemoryStore.open(embedder=...)``: an object with ``encode`` (and a
      ``name``, recorded by the store) or False (vectors are always brought).
    slm: passed to ``MemoryStore.open(slm=...)``; False (the default) keeps organisation
      vector-only. ``llm`` is its deprecated spelling.
    """

    @renamed_kwargs(llm="slm")
    def __init__(self, store: MemoryStore | None = None, *, path: str | Path | None = None,
                 config: StoreConfig | None = None, encoder: Any = False, slm: Any = False) -> None:
        if store is not None and path is not None:
            raise ValueError("pass either store= or path=, not both")
        self._owned = store is None
        self._store = store
        self._closed = False
        self._lock = threading.Lock()  # two first writes from two threads open the store once
        self._tmp: str | None = None
        self._config = config
        self._encoder = encoder
        self._slm = slm
        if store is None and path is None:
            self._tmp = tempfile.mkdtemp(prefix="clag_fast_")
            path = self._tmp
        self.path = Path(path) if path is not None else store.path
        if self._store is None and self.path.is_dir() and any(self.path.iterdir()):
            # An existing store knows its own width: open it now.
            self._store = MemoryStore.open(self.path, config=config, embedder=encoder, slm=slm)

    @property
    def store(self) -> MemoryStore | None:
        """The open store, or None while nothing has been written."""
        return self._store

    @property
    def dim(self) -> int | None:
        """The store's vector width, or None before the first write."""
        return None if self._store is None else self._store.config.dim

    def ensure(self, dim: int) -> MemoryStore:
        """The store, opened with ``dim`` if it is not open yet. A store of another width
        raises ``DimensionMismatchError`` (a ValueError) naming both widths; nothing is written."""
        if self._store is None:
            with self._lock:
                if self._closed:
                    raise ValueError("this adapter's store is closed")
                if self._store is None:
                    config = (self._config or StoreConfig()).replace(dim=int(dim))
                    self._store = MemoryStore.open(self.path, config=config, embedder=self._encoder, slm=self._slm)
        if self._store.config.dim not in (None, dim):  # None: an empty store takes the first width
            raise DimensionMismatchError(f"vectors of width {dim} do not fit this store, which holds "
                             f"{self._store.config.dim}-dimensional vectors (mixing embedding models?)")
        return self._store

    def open_now(self, dim: int) -> MemoryStore:
        """``ensure(dim)`` for an adapter's constructor: on failure (a store of another
        width, say) a store this handle opened is closed again, so its lock is released."""
        try:
            return self.ensure(dim)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close a store this handle opened, and remove its temporary directory."""
        self._closed = True
        if self._owned and self._store is not None:
            self._store.close()
        self._store = None if self._owned else self._store
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
