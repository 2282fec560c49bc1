"""VectorCache: the vectors of recently embedded texts (LRU), so a repeated text is not
embedded again.

Agents repeat queries, and every re-organisation embeds its clusters' label phrases, most of
them the same as the pass before. ``MemoryStore`` keeps one per store (``StoreConfig.
embed_cache``), for every embedder, in-process and in the service alike. A vector does not
depend on the store's contents, so writes do not clear it (the retrieval cache of results
is cleared by them).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

from clag_fast.config import valid_embed_cache

#: Longer texts are not kept (a 32k-character text as a key costs more memory than its vector;
#: the repeats are short queries and label phrases).
MAX_CHARS = 2048


class VectorCache:
    """LRU of text -> vector, at most ``size`` entries (0: off), ~1.6 kB each at dim 384.

    The cached row is the one the embedder gave the text. Texts embedded in one padded batch
    differ from alone within float rounding (int8: < 1e-6, only in the float pooling; every
    quantisation scale is per token), as between any two batchings.
    """

    def __init__(self, size: int) -> None:
        if not valid_embed_cache(size):
            raise ValueError(f"embed_cache must be a non-negative number of vectors, got {size!r}")
        self.size = size
        self._items: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def encode(self, texts: list[str], embed: Callable[[list[str]], np.ndarray], dim: int,
               remember: bool = True) -> np.ndarray:
        """``embed(texts)`` with the texts seen recently taken from the cache and a text
        repeated within ``texts`` embedded once. ``embed`` returns float32 (n, ``dim``).
        ``remember=False`` looks texts up without keeping new ones: the store's adds, so a
        bulk ingest does not evict the queries and label phrases the cache is for."""
        if not self.size or not all(type(t) is str for t in texts):
            return embed(texts)  # a wrong item is the embedder's to refuse
        rows: list[np.ndarray | None] = [None] * len(texts)
        missing: dict[str, list[int]] = {}
        with self._lock:
            items = self._items
            for i, t in enumerate(texts):
                row = items.get(t)
                if row is None:
                    missing.setdefault(t, []).append(i)
                else:
                    items.move_to_end(t)
                    rows[i] = row
            self.hits += len(texts) - len(missing)  # a repeat within the call counts as a hit
            self.misses += len(missing)
        if missing:
            fresh = list(missing)
            try:
                vecs = np.asarray(embed(fresh), dtype=np.float32)
            except ValueError:
                # Bad items (empty, unencodable) are refused naming their index: among all
                # the texts, as without a cache.
                return embed(texts)
            if vecs.shape != (len(fresh), dim):
                # A misbehaving embedder: nothing is kept, and the caller's shape check names
                # what it returns for the whole request.
                return embed(texts)
            if len(fresh) == len(texts) and not remember:
                return vecs  # nothing cached, nothing repeated: the embedder's own array
            with self._lock:
                for t, row in zip(fresh, vecs):
                    for i in missing[t]:
                        rows[i] = row
                    if remember and len(t) <= MAX_CHARS:
                        items[t] = row.copy()  # not a view: it would keep the whole batch alive
                while len(items) > self.size:
                    items.popitem(last=False)
        # A new array: a caller writing into its rows never changes the cached ones.
        return np.array(rows, dtype=np.float32) if rows else embed(texts)
