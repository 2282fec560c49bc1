"""Stub for the private native module (the public API is clag_fast.index.VectorIndex)."""

from os import PathLike

import numpy as np
import numpy.typing as npt

__version__: str

class _MapGuard:
    """Keeps a memory mapping alive while a numpy view of it exists."""

class VectorIndex:
    @staticmethod
    def open(
        path: str | PathLike[str], dim: int | None = None, read_only: bool = False, member_cache: bool = True
    ) -> VectorIndex: ...
    @property
    def path(self) -> str: ...
    @property
    def dim(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def __len__(self) -> int: ...
    def n_pending(self) -> int: ...
    def n_clusters(self) -> int: ...
    def append(self, vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.int64]: ...
    def vectors(self) -> npt.NDArray[np.float32]: ...
    def warm(self) -> int: ...
    def flush(self, durable: bool = True) -> None: ...
    def close(self) -> None: ...
    def cluster_ids(self) -> npt.NDArray[np.int64]: ...
    def centres(self) -> npt.NDArray[np.float32]: ...
    def cluster_sizes(self) -> npt.NDArray[np.int64]: ...
    def members(self, cid: int) -> npt.NDArray[np.int64]: ...
    def secondary_members(self, cid: int) -> npt.NDArray[np.int64]: ...
    def cluster_of(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]: ...
    def secondary_of(self, row: int) -> npt.NDArray[np.int64]: ...
    def soft_assign(
        self, vectors: npt.NDArray[np.float32], k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def near_assign(
        self, cluster_ids: npt.NDArray[np.int64], near: int, k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def assign(self, rows: npt.NDArray[np.int64], cluster_ids: npt.NDArray[np.int64]) -> None: ...
    def unassign(self, rows: npt.NDArray[np.int64]) -> None: ...
    def new_cluster(self, centre: npt.NDArray[np.float32] | None = None, weight: float = 1.0) -> int: ...
    def set_centre(self, cid: int, vector: npt.NDArray[np.float32], weight: float = 1.0) -> None: ...
    def drop_cluster(self, cid: int) -> None: ...
    def kmeans(self, k: int, rows: npt.NDArray[np.int64] | None = None, seed: int = 0) -> npt.NDArray[np.int64]: ...
    def split(self, cid: int, seed: int = 0) -> tuple[int, int]: ...
    def split_many(self, cids: list[int], seed: int = 0) -> list[tuple[int, int]]: ...
    def merge(self, keep: int, absorb: int) -> None: ...
    def merge_many(self, pairs: list[tuple[int, int]]) -> None: ...
    def nearest_among(
        self, cluster_ids: npt.NDArray[np.int64], among: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def merge_candidates(self, threshold: float = 0.9) -> list[tuple[int, int, float]]: ...
    def search(
        self,
        queries: npt.NDArray[np.float32],
        k: int = 10,
        n_probe: int = 4,
        flat: bool = False,
        mask: npt.NDArray[np.bool_] | None = None,
        weights: npt.NDArray[np.float32] | None = None,
        probe_gap: float | None = None,
        min_probe: int = 1,
        min_rows: int = 0,
        rows: npt.NDArray[np.uint32] | None = None,
        rows_vectors: npt.NDArray[np.float32] | None = None,
    ) -> tuple[
        npt.NDArray[np.int64],
        npt.NDArray[np.float32],
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
    ]: ...
    def search_one(
        self,
        query: npt.NDArray[np.float32],
        memory_ids: npt.NDArray[np.int64],
        k: int,
        n_probe: int,
        flat: bool,
        mask: npt.NDArray[np.bool_] | None,
        weights: npt.NDArray[np.float32] | None,
        probe_gap: float | None,
        min_probe: int,
        min_rows: int,
    ) -> tuple[list[int], list[float], list[int], list[int], int, list[int]]: ...

def tokenize(text: str) -> list[str]:
    """The words the lexical index keeps for ``text``."""

def committed_rows(path: str) -> int:
    """Rows the vector file in index directory ``path`` commits (its header alone)."""

def parse_export_lines(
    data: bytes, start: int, names: list[str], kinds: list[str], dim: int | None, max_lines: int
) -> tuple[
    int,
    int,
    bool,
    list[list[object] | None],
    npt.NDArray[np.float32],
    tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]] | None,
]:
    """Up to ``max_lines`` export lines of ``data`` from byte ``start`` as columns (rust/records.rs):
    (lines taken, bytes read, whether a line not taken stopped it, one list per field (None
    for the vector and pairs fields), the vectors, the pairs padded with -1 or None)."""

def format_export_lines(
    names: list[str],
    texts: list[list[str]],
    vectors: npt.NDArray[np.float32],
    pair_ids: npt.NDArray[np.int64],
    pair_aff: npt.NDArray[np.float32],
) -> bytes:
    """Export lines (rust/records.rs): each field's JSON texts, the vectors in base64 and the
    pairs (ids < 0 left out, affinities as %.9g) joined into lines."""

def unconfirmed_objects(values: list[object]) -> list[int]:
    """Positions of the values that are neither None nor a str holding one JSON object
    (rust/records.rs ``is_object``): the ones left for Python to read."""

class Lexical:
    """BM25 postings over vector rows with per-namespace term statistics (rust/lexical.rs)."""

    def __init__(self) -> None: ...
    @staticmethod
    def load(path: str | PathLike[str]) -> Lexical: ...
    def save(self, path: str | PathLike[str]) -> None: ...
    def __len__(self) -> int: ...
    def sizes(self) -> tuple[int, int]: ...
    def changes(self) -> int: ...
    def add(self, rows: list[int], texts: list[str], namespaces: list[str] | None = None) -> None: ...
    def sync(self, live: npt.NDArray[np.bool_]) -> tuple[int, int, int]: ...
    def stats(self, scope: str | npt.NDArray[np.bool_] | None = None) -> tuple[int, int]: ...
    def score(
        self,
        query: str,
        scope: str | npt.NDArray[np.bool_] | None = None,
        eligible: npt.NDArray[np.bool_] | None = None,
        k1: float = 1.2,
        b: float = 0.75,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], int, float]: ...
    def score_top(
        self,
        query: str,
        scope: str | npt.NDArray[np.bool_] | None,
        eligible: npt.NDArray[np.bool_] | None,
        top_n: int,
        lookup: npt.NDArray[np.int64],
        k1: float = 1.2,
        b: float = 0.75,
    ) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.float32], int, float, int
    ]: ...
    def compact(self, live: npt.NDArray[np.bool_]) -> int: ...
